"""A broker or a store restarted under a federation at work, through real worker processes.

The broker is a Redis server of the test's own with an append-only file (as production runs
it); the store is SQLite. The result backend is the broker too, the common setup, so while it
is down no worker can write a result: the store keeps every outcome, and a sweeper writes it
to the backend once it can. Celery is made to give up its own retries after one, so the
sweeper's path is the one under test. The store outage is PostgreSQL refusing connections to
the federation's database and ending the open ones for a few seconds, as a restart does
(without restarting the server the other tests use).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bench.chaos.chaos import restart_store
from bench.common.redis_server import PrivateRedis
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow
from tests.conftest import POSTGRES_URL
from tests.integration.app import shared, slow
from tests.integration.conftest import (
    NODES,
    Cluster,
    _postgres_database,
    running_cluster,
    wait_for,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRedis]:
    server = PrivateRedis(tmp_path_factory.mktemp("broker"))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def outage_cluster(broker: PrivateRedis, tmp_path_factory: pytest.TempPathFactory,
                   redis_broker: str) -> Iterator[Cluster]:
    directory: Path = tmp_path_factory.mktemp("outage")
    with running_cluster(f"sqlite:///{directory}/store.db", directory, "sqlite",
                         broker=broker.url,
                         extra_env={"BIDDING_IT_RESULT_RETRIES": "1"}) as cluster:
        yield cluster


def state(cluster: Cluster, task_id: str) -> str | None:
    with read_session(cluster.settings.database_url) as s:
        row = s.get(AnnouncementRow, task_id)
        return None if row is None else row.state


def logs(cluster: Cluster) -> str:
    return "\n".join(cluster.federation.tail(name, 5000) for name in NODES)


def test_a_result_written_while_the_broker_is_down_reaches_the_caller(
    outage_cluster: Cluster, broker: PrivateRedis,
) -> None:
    # given a 2 s task running on a node
    key = f"outage-{uuid.uuid4().hex}"
    result = slow.apply_async((key, 2.0), bidding={"task_type": f"outage-{key[-8:]}"})
    assert wait_for(lambda: state(outage_cluster, result.id) == "EXECUTING", 20)
    # (its caller already waiting for it)
    waiting = ThreadPoolExecutor(1).submit(result.get, timeout=60)
    time.sleep(0.2)
    # when the broker (the result backend too) stops while it runs, and comes back only after
    # the body has finished and Celery has given up writing its result
    broker.stop()
    try:
        assert wait_for(lambda: state(outage_cluster, result.id) == "SUCCESS", 20)
        time.sleep(3.0)
    finally:
        broker.start()
    # then the caller gets the task's real result, not a transport error, and it ran once
    value = result.get(timeout=60)
    assert value["node"] in NODES
    assert waiting.result(timeout=60) == value
    assert int(outage_cluster.counters.get(f"started:{key}") or 0) == 1
    # and the node's log says what happened
    assert wait_for(lambda: "its result is in the backend now" in logs(outage_cluster), 10)


def test_tasks_keep_running_after_a_broker_restart(
    outage_cluster: Cluster, broker: PrivateRedis,
) -> None:
    # given a federation that has been working
    assert shared.delay(1).get(timeout=30)["value"] == 1
    # when the broker restarts and tasks are submitted right after it is back
    broker.restart(down_for=2.0)
    results = [shared.delay(i) for i in range(10)]
    # then every one of them runs and returns its value
    assert [r.get(timeout=60)["value"] for r in results] == list(range(10))


@pytest.fixture(scope="module")
def pg_cluster(tmp_path_factory: pytest.TempPathFactory, redis_broker: str) -> Iterator[Cluster]:
    databases = _postgres_database()
    url = next(databases)
    try:
        with running_cluster(url, tmp_path_factory.mktemp("pg-outage"), "postgresql") as c:
            yield c
    finally:
        for _ in databases:  # drops the database
            pass


def store_down(url: str, seconds: float) -> None:
    """The store's database refuses connections and loses the open ones for ``seconds``
    (the soak's store restart, in its database mode)."""
    restart_store("database", url, POSTGRES_URL, seconds)


def test_a_task_that_finishes_while_the_store_restarts_still_succeeds(
    pg_cluster: Cluster,
) -> None:
    # given a 2 s task running on a node
    key = f"pg-{uuid.uuid4().hex}"
    result = slow.apply_async((key, 2.0), bidding={"task_type": f"pg-{key[-8:]}"})
    assert wait_for(lambda: state(pg_cluster, result.id) == "EXECUTING", 20)
    # when PostgreSQL is unreachable for 5 s, during which the body ends
    store_down(pg_cluster.settings.database_url, 5.0)
    # then the caller gets its result, the store says SUCCESS, and the body ran once
    value = result.get(timeout=60)
    assert value["node"] in NODES
    assert wait_for(lambda: state(pg_cluster, result.id) == "SUCCESS", 10)
    assert int(pg_cluster.counters.get(f"started:{key}") or 0) == 1
    assert int(pg_cluster.counters.get(f"finished:{key}") or 0) == 1
    # and the node's log says it waited for the store
    assert "the store is unreachable" in logs(pg_cluster)
    # and the federation works on: new tasks run
    assert shared.delay(7).get(timeout=30)["value"] == 7
