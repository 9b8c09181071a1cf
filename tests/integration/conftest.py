"""A federation of real worker processes on Redis, with the store on SQLite or PostgreSQL.

Three equal nodes (north, south, east) can do ``shared`` work; only east has ``gpu``. Each
node is a ``bidding worker PROFILE -A tests.integration.app`` subprocess, as an operator runs it.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
import sqlalchemy as sa
from celery import Celery

from bidding.auction.alarm import ALARM
from bidding.config import Settings, get_settings, reset_settings
from bidding.nodes.federation import Federation
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import invalidate_cache
from bidding.store import dispose_all, upgrade
from bidding.store.migrate import forget_schema_checks
from tests.conftest import POSTGRES_URL, REDIS_DB, REDIS_URL, bury, ghost, require

ROOT = Path(__file__).resolve().parents[2]
BROKER = f"{REDIS_URL}/{REDIS_DB}"
COUNTERS = f"{REDIS_URL}/{REDIS_DB + 1}"
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


def write_profile(directory: Path, name: str, skills: list[str], extra: str = "",
                  capacity: int = 4) -> Path:
    """An equal profile for every test node: only the skills differ (and ``extra`` TOML
    lines, e.g. a bidder of its own)."""
    path = directory / f"{name}.toml"
    caps = ", ".join(f'"{s}"' for s in skills)
    path.write_text(
        f'name = "{name}"\ncapabilities = [{caps}]\ncapacity = {capacity}\n'
        f"price_per_unit = 0.01\nlatency_ms = 50\ntrust = 70\n{extra}"
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
        return ghost(self.settings, skills, name)

    def bury(self, name: str = "ghost") -> None:
        """Take a ghost out of the candidates again."""
        bury(self.settings, name)


def _repoint(app: Celery, broker: str, backend: str) -> None:
    """Point the test process's app at another broker and backend.

    Celery caches the connection pool, the producer pool and the result backend on the app;
    these private attributes are what Celery itself resets after a fork (App._after_fork).
    """
    app.conf.broker_url = broker
    app.conf.result_backend = backend
    # Drop, never close: app.pool is kombu's global pool for that URL, shared by later users.
    app._pool = None
    if "amqp" in app.__dict__:
        app.amqp._producer_pool = None
    app._backend_cache = None
    app._local.__dict__.pop("backend", None)


@contextmanager
def running_cluster(database_url: str, directory: Path, backend: str,
                    broker: str = BROKER, result_backend: str | None = None,
                    extra_env: dict[str, str] | None = None,
                    nodes: Mapping[str, list[str]] = NODES,
                    profiles: dict[str, str] | None = None,
                    prefix: Mapping[str, list[str]] | None = None,
                    capacity: int | None = None,
                    app_module: str = "tests.integration.app") -> Iterator[Cluster]:
    """Start the three nodes (or ``nodes``: name -> skills) against ``broker`` and the store
    at ``database_url``.

    ``extra_env`` (``BIDDING_*`` settings) applies to the nodes and to this test process.
    ``profiles``: more TOML lines for a node's profile, by node name.
    ``prefix``: a command a node's worker runs under, by node name (another clock, a host).
    ``capacity``: every node's capacity, and its workers' pool processes (else 4, and 2).
    ``app_module``: the nodes' ``-A`` (a module that imports this one's app and adds to it).
    Its announcers ask the nodes for bids (``bidding_bid_mode = "ask"``) unless ``extra_env``
    says otherwise: the test nodes all bid with the built-in function, so under the default,
    "auto", every auction would be proxied, and the tests of the asking path (the bid
    requests, the board, silent rounds) would test nothing (tests/integration/test_bidders.py
    runs "auto", test_proxy.py "proxy").
    """
    from tests.integration.app import app

    extra_env = {"BIDDING_BID_MODE": "ask", **(extra_env or {})}
    if broker.startswith("redis"):
        # Every cluster names its nodes alike: a message an earlier cluster left in exec.north
        # or bidding:requests:north must not reach this one's north.
        redis.Redis.from_url(broker).flushdb()
    previous = {k: os.environ.get(k) for k in ("BIDDING_DATABASE_URL", *extra_env)}
    os.environ["BIDDING_DATABASE_URL"] = database_url
    os.environ.update(extra_env)
    saved_conf = (app.conf.broker_url, app.conf.result_backend)
    _repoint(app, broker, result_backend or broker)
    reset_settings(app)
    forget_schema_checks()
    invalidate_cache()
    settings = get_settings(app)
    upgrade(database_url)
    federation = Federation(
        app=app_module,
        env={"BIDDING_DATABASE_URL": database_url, "BIDDING_IT_BROKER": broker,
             "BIDDING_IT_BACKEND": result_backend or broker, "BIDDING_IT_COUNTERS": COUNTERS,
             "BIDDING_HEARTBEAT_INTERVAL": "1", "PYTHONPATH": str(ROOT), **extra_env},
        log_dir=directory / "logs",
        concurrency=capacity or 2,
        cwd=ROOT,
        prefix=prefix or {},
    )
    try:
        federation.start(write_profile(directory, n, s, (profiles or {}).get(n, ""),
                                       capacity or 4)
                         for n, s in nodes.items())
        federation.wait_live(settings, timeout=90)
        yield Cluster(app=app, settings=settings, federation=federation,
                      counters=redis.Redis.from_url(COUNTERS), backend=backend)
    finally:
        # Alarms this process set for the cluster's tasks (countdowns, retries) must not ring
        # against the next cluster's store.
        ALARM.clear()
        federation.stop()
        restore_app(app, previous, saved_conf)


def restore_app(app: Any, environ: Mapping[str, str | None], conf: tuple[str, str]) -> None:
    """Put back the environment variables a cluster set (None: unset) and the app's broker
    and backend, and forget what was cached for the cluster's store."""
    for key, value in environ.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    _repoint(app, *conf)
    reset_settings(app)
    invalidate_cache()
    dispose_all()
    forget_schema_checks()


@contextmanager
def store_cluster(store: str, directory: Path, **options: Any) -> Iterator[Cluster]:
    """``running_cluster`` with the store on ``store``: "sqlite" (a file in ``directory``) or
    "postgresql" (a new database, dropped afterwards)."""
    if store == "sqlite":
        with running_cluster(f"sqlite:///{directory}/store.db", directory, "sqlite",
                             **options) as c:
            yield c
        return
    databases = _postgres_database()
    url = next(databases)
    try:
        with running_cluster(url, directory, "postgresql", **options) as c:
            yield c
    finally:
        for _ in databases:  # runs the database's teardown
            pass


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def cluster(request: pytest.FixtureRequest, redis_broker: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Three node worker processes on Redis, the store on SQLite or PostgreSQL."""
    directory = tmp_path_factory.mktemp(f"cluster-{request.param}")
    with store_cluster(request.param, directory) as c:
        yield c


def wait_for(predicate: object, timeout: float = 10.0, interval: float = 0.05) -> bool:
    """Poll ``predicate()`` until it is truthy or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(interval)
    return bool(predicate())  # type: ignore[operator]


def finished_in_the_database_file(database_url: str, task_ids: list[str], scratch: Path) -> bool:
    """Whether a SQLite store's database file alone, its write-ahead log left out, has every
    one of ``task_ids`` in SUCCESS: what a checkpoint copied there (a copy of the file is
    read, in ``scratch``)."""
    import sqlite3

    from tests.sqlite_alone import database_file_alone

    marks = ",".join("?" * len(task_ids))
    try:
        with database_file_alone(database_url, scratch) as conn:
            done = conn.execute(
                f"SELECT count(*) FROM bidding_announcements WHERE task_id IN ({marks})"
                " AND state = 'SUCCESS'", task_ids).fetchone()[0]
    except sqlite3.DatabaseError:  # copied while a checkpoint wrote it: look again
        return False
    return bool(done == len(task_ids))


def assert_no_confident_bid(cluster: Cluster) -> None:
    """Seed 001's outcome when every bid's confidence is too low: given a task type every node
    has failed twice (confidence (0 + 2) / (2 + 2) = 0.5), a task announced with
    min_confidence 0.9 fails with "No bids met minimum confidence"."""
    import bidding
    from tests.integration.app import failing

    for _ in range(2 * len(NODES)):
        with pytest.raises(ValueError):
            failing.delay("warm-up").get(timeout=15)
    result = failing.apply_async(("x",), bidding={"min_confidence": 0.9})
    with pytest.raises(bidding.NoBidsError, match="No bids met minimum confidence"):
        result.get(timeout=15)
