"""Priority end to end: on a busy node, the work waiting in its queue starts most urgent first,
on Redis and on RabbitMQ, through real node workers (one node, capacity 1, one pool process:
``bidding worker`` runs as many tasks at once as the profile's capacity)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
from kombu import Connection

import bidding
from tests.conftest import REDIS_DB, require
from tests.integration.app import queued
from tests.integration.conftest import COUNTERS, Cluster, running_cluster, wait_for

pytestmark = pytest.mark.integration

AMQP_URL = os.environ.get("BIDDING_TEST_AMQP", "amqp://guest:guest@127.0.0.1:5672//")
RABBIT_BACKEND = COUNTERS.rsplit("/", 1)[0] + f"/{REDIS_DB + 2}"


def _rabbitmq_reachable() -> tuple[bool, str]:
    try:
        with Connection(AMQP_URL, connect_timeout=3) as conn:
            conn.ensure_connection(max_retries=1)
        return True, ""
    except Exception as exc:
        return False, str(exc)


@pytest.fixture(scope="module", params=["redis", "rabbitmq"])
def busy_node(request: pytest.FixtureRequest, redis_broker: str,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One node of capacity 1 (one pool process) that alone does the queued work."""
    directory = tmp_path_factory.mktemp(f"priority-{request.param}")
    options: dict[str, str] = {}
    if request.param == "rabbitmq":
        ok, reason = _rabbitmq_reachable()
        require("RabbitMQ", ok, f"{AMQP_URL}: {reason}")
        options = {"broker": AMQP_URL, "result_backend": RABBIT_BACKEND}
    with running_cluster(f"sqlite:///{directory}/store.db", directory, request.param,
                         nodes={"solo": ["shared"]}, capacity=1, **options) as cluster:
        yield cluster


def test_on_a_busy_node_the_urgent_task_starts_before_the_low_ones_that_came_first(
    busy_node: Cluster,
) -> None:
    key = uuid.uuid4().hex
    started = f"started:{key}"
    # given the node's one slot busy for 4 s
    blocker = queued.delay("blocker", key, 4.0)
    assert wait_for(lambda: busy_node.counters.lrange(started, 0, -1), timeout=20)
    # when four low-priority tasks are submitted, then one high-priority task (Celery's own
    # option for one, the bidding option for the others)
    lows = [queued.apply_async((f"low-{n}", key, 0.1), bidding={"priority": "low"})
            for n in range(4)]
    urgent = queued.apply_async(("urgent", key, 0.1), priority="high")
    for result in [blocker, *lows, urgent]:
        result.get(timeout=60)
    # then, once the slot freed, the urgent one started first, and the low ones after it (in
    # the order their auctions closed: among equals, no order is promised)
    order = [label.decode() for label in busy_node.counters.lrange(started, 0, -1)]
    assert order[:2] == ["blocker", "urgent"], order
    assert sorted(order[2:]) == ["low-0", "low-1", "low-2", "low-3"], order
    # and what an operator reads says so
    why = bidding.explain(urgent.id, app=busy_node.app)
    assert why.priority == 8
    assert "priority 8 (high)" in why.render()
    assert bidding.explain(lows[0].id, app=busy_node.app).priority == 2


def test_an_execution_queue_an_earlier_version_declared_without_priorities_is_replaced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    import logging

    from celery import Celery
    from kombu import Queue

    from bidding.config import celery_conf
    from bidding.execution.priority import execution_queue, redeclare_if_unprioritized

    ok, reason = _rabbitmq_reachable()
    require("RabbitMQ", ok, f"{AMQP_URL}: {reason}")
    node = f"upgraded{uuid.uuid4().hex[:8]}"
    name = f"exec.{node}"
    # given a node's execution queue as an earlier version declared it (no x-max-priority),
    # holding one execution
    with Connection(AMQP_URL) as conn:
        old = Queue(name, routing_key=name, durable=True)
        conn.SimpleQueue(old).put({"old": True})
    app = Celery("upgrade", set_as_current=False)
    app.conf.update(celery_conf(AMQP_URL))
    bidding.install(app)
    try:
        # when the node's worker starts with this version
        with caplog.at_level(logging.WARNING, logger="bidding.execution.priority"):
            redeclare_if_unprioritized(app, node)
        # then the queue is declared with priorities (declaring it so again is accepted), and
        # the log says what became of the execution it held
        with Connection(AMQP_URL) as conn:
            execution_queue(app, node)(conn.channel()).declare()
        assert any(f"{name} was declared without priorities" in r.getMessage()
                   and "the 1 execution(s) it held are sent again" in r.getMessage()
                   for r in caplog.records), caplog.text
        # and a worker starting again finds nothing to replace
        caplog.clear()
        redeclare_if_unprioritized(app, node)
        assert not caplog.records
    finally:
        with Connection(AMQP_URL) as conn:
            conn.channel().queue_delete(name)
