"""A federation of real worker processes on Redis, with the store on SQLite or PostgreSQL.

Three equal nodes (north, south, east) can do ``shared`` work; only east has ``gpu``. Each
node is a ``bidding worker PROFILE -A tests.integration.app`` subprocess, as an operator runs it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from celery import Celery

from bidding.config import Settings
from bidding.federation import Federation
from bidding.profile import NodeProfile
from bidding.registry import heartbeat, invalidate_cache, mark_offline
from bidding.settings import get_settings, reset_settings
from bidding.store import dispose_all, upgrade
from bidding.store.migrate import forget_schema_checks
from tests.conftest import POSTGRES_URL, REDIS_URL, require

ROOT = Path(__file__).resolve().parents[2]
BROKER = f"{REDIS_URL}/11"
COUNTERS = f"{REDIS_URL}/12"
NODES = {
    "north": ["shared", "alpha"],
    "south": ["shared", "alpha"],
    "east": ["shared", "gpu"],
}


def _check(fn: object) -> tuple[bool, str]:
    try:
        fn()  # type: ignore[operator]
        return True, ""
    except Exception as exc:
        return False, str(exc)


def write_profile(directory: Path, name: str, skills: list[str]) -> Path:
    """An equal profile for every test node: only the skills differ."""
    path = directory / f"{name}.toml"
    caps = ", ".join(f'"{s}"' for s in skills)
    path.write_text(
        f'name = "{name}"\ncapabilities = [{caps}]\ncapacity = 4\n'
        "price_per_unit = 0.01\nlatency_ms = 50\ntrust = 70\n"
    )
    return path


@pytest.fixture(scope="session")
def redis_broker() -> str:
    ok, reason = _check(lambda: redis.Redis.from_url(BROKER, socket_connect_timeout=2).ping())
    require("Redis", ok, f"{BROKER}: {reason}")
    for url in (BROKER, COUNTERS):
        redis.Redis.from_url(url).flushdb()
    return BROKER


def _postgres_database() -> Iterator[str]:
    ok, reason = _check(lambda: sa.create_engine(POSTGRES_URL).connect().close())
    require("PostgreSQL", ok, f"{POSTGRES_URL}: {reason}")
    name = f"bidding_it_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(POSTGRES_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = sa.engine.make_url(POSTGRES_URL).set(database=name).render_as_string(False)
    try:
        yield url
    finally:
        dispose_all()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@dataclass
class Cluster:
    """What a test needs: the app, its settings, the running nodes and the execution counters."""

    app: Celery
    settings: Settings
    federation: Federation
    counters: redis.Redis
    backend: str

    def executions(self, task_id: str) -> int:
        """How many times a task body ran (the test tasks count themselves)."""
        return int(self.counters.get(f"exec:{task_id}") or 0)

    def ghost(self, skills: list[str], name: str = "ghost") -> NodeProfile:
        """Register a live node whose queues nobody consumes (a heartbeat and nothing else)."""
        profile = NodeProfile(name=name, capabilities=skills, capacity=4, price_per_unit=0.01,
                              latency_ms=50, trust=70)
        heartbeat(self.settings, profile)
        invalidate_cache()
        return profile

    def bury(self, name: str = "ghost") -> None:
        """Take a ghost out of the candidates again."""
        mark_offline(self.settings, name)
        invalidate_cache()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cluster(request: pytest.FixtureRequest, redis_broker: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three node worker processes on Redis, the store on SQLite or PostgreSQL."""
    directory = tmp_path_factory.mktemp(f"cluster-{request.param}")
    if request.param == "sqlite":
        databases: Iterator[str] = iter([f"sqlite:///{directory}/store.db"])
        cleanup = None
    else:
        cleanup = _postgres_database()
        databases = cleanup
    url = next(databases)
    previous = os.environ.get("BIDDING_DATABASE_URL")
    os.environ["BIDDING_DATABASE_URL"] = url
    from tests.integration.app import app

    reset_settings(app)
    forget_schema_checks()
    invalidate_cache()
    settings = get_settings(app)
    upgrade(url)
    federation = Federation(
        app="tests.integration.app",
        env={"BIDDING_DATABASE_URL": url, "BIDDING_IT_BROKER": BROKER,
             "BIDDING_IT_COUNTERS": COUNTERS, "BIDDING_HEARTBEAT_INTERVAL": "1",
             "PYTHONPATH": str(ROOT)},
        log_dir=directory / "logs",
        concurrency=2,
        cwd=ROOT,
    )
    try:
        federation.start(write_profile(directory, n, s) for n, s in NODES.items())
        federation.wait_live(settings, timeout=90)
        yield Cluster(app=app, settings=settings, federation=federation,
                      counters=redis.Redis.from_url(COUNTERS), backend=request.param)
    finally:
        federation.stop()
        if previous is None:
            os.environ.pop("BIDDING_DATABASE_URL", None)
        else:
            os.environ["BIDDING_DATABASE_URL"] = previous
        reset_settings(app)
        invalidate_cache()
        if cleanup is not None:
            for _ in cleanup:  # runs the database's teardown
                pass
        dispose_all()
        forget_schema_checks()


def wait_for(predicate: object, timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Poll ``predicate()`` until it is truthy or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(predicate())  # type: ignore[operator]
