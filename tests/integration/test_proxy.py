"""Proxy bidding end to end (``bidding_bid_mode = "proxy"``): the announcer makes the
candidates' bids from their published profiles and their history in the store, awards at once,
and the task runs on real node workers. Redis broker; the store on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import select

import bidding
from bidding.auction import award, scores
from bidding.auction.proxy import PROXY_CLOSE
from bidding.config import reset_settings
from bidding.store import read_session
from bidding.store.schema import Message
from tests.integration.app import flaky, ghostly, gpu, shared
from tests.integration.conftest import (
    NODES,
    Cluster,
    assert_no_confident_bid,
    store_cluster,
    wait_for,
)

pytestmark = pytest.mark.integration

PROXY = {"BIDDING_BID_MODE": "proxy"}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def proxied(request: pytest.FixtureRequest, redis_broker: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The three test nodes, with every announcer (this process and the nodes' sweepers) in
    proxy mode."""
    with store_cluster(request.param, tmp_path_factory.mktemp(f"proxy-{request.param}"),
                    extra_env=PROXY) as c:
        yield c


def messages(cluster: Cluster, task_id: str) -> list[Message]:
    with read_session(cluster.settings.database_url) as s:
        return list(s.scalars(select(Message).where(Message.task_id == task_id)
                              .order_by(Message.id)))


def test_delay_is_awarded_by_proxy_and_runs_once_on_a_node(proxied: Cluster) -> None:
    # given three live nodes that can all do shared work, and a caller in proxy mode
    assert proxied.settings.bid_mode == "proxy"
    # when the caller uses plain .delay() and .get()
    result = shared.delay(7)
    value = result.get(timeout=15)
    # then the task's own value comes back from one of the nodes, run once
    assert value == {"node": value["node"], "value": 7} and value["node"] in NODES
    assert proxied.executions(result.id) == 1
    # and explain shows the three bids, scored, and the winner, closed by proxy bids
    why = bidding.explain(result.id, app=proxied.app)
    assert why.state == "SUCCESS" and why.closed_by == PROXY_CLOSE
    assert why.winner == value["node"]
    assert sorted(b.node for b in why.bids) == sorted(NODES)
    assert all(b.will_bid and b.score is not None for b in why.bids)
    assert [b.node for b in why.bids if b.is_winner] == [value["node"]]
    # and the log keeps the protocol's order: announced, each bid, awarded, then the execution
    kinds = [m.kind for m in why.messages]
    assert kinds == ["ANNOUNCED", "BID", "BID", "BID", "AWARDED", "TASK_ACCEPTED",
                     "TASK_COMPLETED", "TASK_SUCCEEDED"]


def test_routing_by_proxy_follows_capability(proxied: Cluster) -> None:
    # given that only east declares the gpu skill
    # when gpu work is submitted, then every one runs on east, the only candidate
    results = [gpu.delay(i) for i in range(4)]
    assert {r.get(timeout=15)["node"] for r in results} == {"east"}
    why = bidding.explain(results[-1].id, app=proxied.app)
    assert why.candidates == ["east"] and [b.node for b in why.bids] == ["east"]


def test_proxy_bids_count_the_work_a_node_has_in_flight(proxied: Cluster) -> None:
    # given a long task running on one node
    long = shared.delay("long", 3.0)
    assert wait_for(lambda: bidding.explain(long.id, app=proxied.app).state == "EXECUTING",
                    timeout=10)
    busy = bidding.explain(long.id, app=proxied.app).winner
    # when another task is announced meanwhile
    second = shared.delay("second")
    second.get(timeout=15)
    # then the busy node's bid has the load of one task in flight of 4, the others none
    bids = {b.node: b for b in bidding.explain(second.id, app=proxied.app).bids}
    assert bids[busy].load == scores.load_score(1, 4) < scores.load_score(0, 4)
    assert all(b.load == scores.load_score(0, 4) for node, b in bids.items() if node != busy)
    long.get(timeout=15)


def test_a_node_that_failed_a_task_type_bids_low_by_proxy(proxied: Cluster) -> None:
    # the proxy reads the nodes' records: seed 001's outcome when no bid is confident enough
    assert_no_confident_bid(proxied)


def test_a_retry_is_auctioned_again_by_proxy_on_another_node(proxied: Cluster) -> None:
    # given a task that fails its first two attempts, retried after 0.2 s and 0.4 s
    policy = bidding.RetryPolicy(max_retries=3, backoff="exponential", base_ms=200)
    key = f"proxy-flaky-{time.time()}"
    result = flaky.apply_async((key, 2), bidding={"retry_policy": policy.model_dump()})
    # when the caller waits, then the third attempt's value arrives
    assert result.get(timeout=30)["attempts"] == 3
    # and each attempt ran on another node, each awarded by proxy (the retries by a sweeper)
    tried = [n.decode() for n in proxied.counters.lrange(f"nodes:{key}", 0, -1)]
    assert len(set(tried)) == 3, tried
    awarded = [m for m in messages(proxied, result.id) if m.kind == "AWARDED"]
    assert [m.attempt for m in awarded] == [1, 2, 3]
    assert all(m.detail["closed_by"] == PROXY_CLOSE for m in awarded)


def test_a_proxied_winner_that_never_starts_is_replaced_by_the_next_best_bidder(
    proxied: Cluster,
) -> None:
    # given a live node that matches best but has no worker at all (a heartbeat only)
    proxied.ghost(["shared", "ghostly"])
    try:
        started = time.monotonic()
        result = ghostly.apply_async(("boo",), bidding={"schedule_to_start_timeout": 1.0})
        # when it does not start the task within 1 s, then the next-best bidder runs it
        value = result.get(timeout=20)
        elapsed = time.monotonic() - started
    finally:
        proxied.bury()
    assert value["node"] in NODES
    log = messages(proxied, result.id)
    assert next(m for m in log if m.kind == "AWARDED").node == "ghost"
    moved = next(m for m in log if m.kind == "REAWARDED")
    assert moved.detail["from"] == "ghost" and moved.detail["to"] == value["node"]
    assert 1.0 <= elapsed < 6
    assert proxied.executions(result.id) == 1


def test_an_award_the_caller_could_not_send_is_sent_by_a_sweeper(
    proxied: Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a caller whose execution message fails to reach the broker once (as when the
    # broker is down past Celery's publish retries), after the award is committed
    def broker_down(*_: object, **__: object) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(award, "send_execution", broker_down)
    result = shared.delay(11)
    monkeypatch.undo()
    # when the caller waits, then a node's sweeper sends it again and its value comes back
    value = result.get(timeout=15)
    assert value == {"node": value["node"], "value": 11}
    assert proxied.executions(result.id) == 1
    # and the log says why: the failed send, then the resend to the same winner
    log = messages(proxied, result.id)
    # (RESENT is logged once the send went out, so the node may have started it just before)
    kinds = [m.kind for m in log]
    assert kinds.index("AWARDED") < kinds.index("SEND_FAILED") < kinds.index("TASK_ACCEPTED")
    assert kinds.count("RESENT") == 1 and "REAWARDED" not in kinds
    failed = next(m for m in log if m.kind == "SEND_FAILED")
    assert failed.detail["error"] == "ConnectionError: broker down"
    assert {m.node for m in log if m.kind in ("AWARDED", "SEND_FAILED", "RESENT")} == {
        value["node"]}



def test_an_award_whose_message_was_lost_is_sent_again_at_its_delivery_check(
    proxied: Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a caller that dies, as far as this task goes, between committing its award and
    # sending it (the message is never sent), with a delivery check after 1 s and no
    # schedule-to-start timeout
    monkeypatch.setenv("BIDDING_DELIVERY_CHECK_SECONDS", "1")
    monkeypatch.setenv("BIDDING_SCHEDULE_TO_START_TIMEOUT", "0")
    reset_settings(proxied.app)
    monkeypatch.setattr(award, "send_execution", lambda *_, **__: None)
    try:
        result = shared.delay(12)
    finally:
        monkeypatch.undo()
        reset_settings(proxied.app)
    # when the caller waits, then a node's sweeper sends it to its winner and it runs once
    value = result.get(timeout=15)
    assert value == {"node": value["node"], "value": 12}
    assert proxied.executions(result.id) == 1
    # and the log says why, and the task stayed with the node it was awarded to
    log = messages(proxied, result.id)
    resent = next(m for m in log if m.kind == "RESENT")
    assert "sent again in case its message was lost" in resent.detail["why"]
    assert {m.node for m in log if m.kind in ("AWARDED", "RESENT")} == {value["node"]}
