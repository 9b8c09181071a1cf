"""The same auction with RabbitMQ as the broker (AMQP), results in Redis, the store on SQLite.

Bid requests are plain kombu messages on the default exchange; on AMQP that exchange routes by
queue name natively, and these tests show it end to end.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from kombu import Connection

import bidding
from tests.conftest import REDIS_DB, require
from tests.integration.app import gpu, shared
from tests.integration.conftest import COUNTERS, NODES, Cluster, running_cluster

pytestmark = pytest.mark.integration

AMQP_URL = os.environ.get("BIDDING_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")
BACKEND = COUNTERS.rsplit("/", 1)[0] + f"/{REDIS_DB + 2}"


@pytest.fixture(scope="module")
def rabbit(redis_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    try:
        with Connection(AMQP_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
        ok, reason = True, ""
    except Exception as exc:
        ok, reason = False, str(exc)
    require("RabbitMQ", ok, f"{AMQP_URL}: {reason}")
    directory = tmp_path_factory.mktemp("cluster-rabbitmq")
    with running_cluster(f"sqlite:///{directory}/store.db", directory, "rabbitmq",
                         broker=AMQP_URL, result_backend=BACKEND) as cluster:
        yield cluster


def test_delay_and_get_through_rabbitmq(rabbit: Cluster) -> None:
    # given three nodes consuming from RabbitMQ
    # when a caller uses .delay() and .get()
    result = shared.delay("via amqp")
    value = result.get(timeout=20)
    # then the value comes back from a node that won an auction closed by all three bids
    assert value["value"] == "via amqp"
    why = bidding.explain(result.id, app=rabbit.app)
    assert why.closed_by == "all bids in"
    assert sorted(b.node for b in why.bids) == sorted(NODES)
    assert why.winner == value["node"]


def test_routing_follows_capability_through_rabbitmq(rabbit: Cluster) -> None:
    # given that only east has the gpu skill
    # when gpu work is submitted, then it runs on east
    assert gpu.delay(3).get(timeout=20)["node"] == "east"


def test_unconsumed_queue_closes_at_the_deadline_on_rabbitmq(rabbit: Cluster) -> None:
    # given a live node whose bid queue nobody consumes (its queue is declared on publish)
    rabbit.ghost(["shared"])
    try:
        started = time.monotonic()
        value = shared.delay("late").get(timeout=20)
        elapsed = time.monotonic() - started
    finally:
        rabbit.bury()
    # then the auction closed at its window with the real nodes' bids
    assert value["node"] in NODES
    assert rabbit.settings.window <= elapsed < rabbit.settings.window + 5


def test_no_bidders_fails_through_the_result_backend(rabbit: Cluster) -> None:
    # given no node with the skill, when such a task is submitted, then .get() raises at once
    result = shared.apply_async((1,), bidding={"required_skills": ["nobody_has_this"]})
    with pytest.raises(bidding.NoBidsError, match="No bidders registered"):
        result.get(timeout=10)
