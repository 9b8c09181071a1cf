"""AITP execution on real workers: retries with backoff on other nodes, a node killed mid-task,
a winner that never starts, timeouts, budgets, output schemas, deferral, progress.

Every test runs with the store on SQLite and on PostgreSQL. Each call names a task type of its
own, so no test's learned history (experience, confidence) changes which node wins another's
auction, and a test that takes a node away puts it back: the tests pass in any order.
"""

from __future__ import annotations

import json
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
from celery.exceptions import MaxRetriesExceededError
from kombu import Connection
from sqlalchemy import select

import bidding
from bidding.auction.bid_request import BidRequest
from bidding.auction.board import RedisBoard, get_board
from bidding.auction.board.redis_board import RequestListener
from bidding.auction.board.store_board import request_queue
from bidding.auction.consumer import answer
from bidding.context import Context
from bidding.execution.dispatch import send_execution
from bidding.models import Announcement as Spec
from bidding.nodes.embedded import free_port
from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import invalidate_cache
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow, Episode, LedgerEntry, Message, Node
from tests.integration.app import (
    countdown,
    flaky,
    ghostly,
    late,
    metered,
    retrying,
    shaped,
    sleepy,
    slow,
    steps,
    stubborn,
)
from tests.integration.conftest import (
    NODES,
    Cluster,
    _postgres_database,
    running_cluster,
    wait_for,
    write_profile,
)

pytestmark = pytest.mark.integration

TTL = 3.0


class Hook(BaseHTTPRequestHandler):
    """A webhook receiver: keeps every JSON body it is sent."""

    received: list[dict[str, Any]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        Hook.received.append(json.loads(self.rfile.read(length)))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def webhook() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", free_port()), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook"
    finally:
        server.shutdown()


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def nodes(request: pytest.FixtureRequest, redis_broker: str, webhook: str,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The three test nodes with a short heartbeat TTL and the webhook, on either store."""
    directory = tmp_path_factory.mktemp(f"cluster-lifecycle-{request.param}")
    env = {"BIDDING_HEARTBEAT_TTL": str(TTL), "BIDDING_HEARTBEAT_INTERVAL": "0.5",
           "BIDDING_NOTIFY_URL": webhook, "BIDDING_HARD_TIMEOUT_GRACE": "0.5"}
    if request.param == "sqlite":
        with running_cluster(f"sqlite:///{directory}/store.db", directory, "sqlite",
                             extra_env=env) as cluster:
            yield cluster
        return
    databases = _postgres_database()
    url = next(databases)
    try:
        with running_cluster(url, directory, "postgresql", extra_env=env) as cluster:
            yield cluster
    finally:
        for _ in databases:  # runs the database's teardown
            pass


def fresh_type() -> str:
    """A task type no node has history of."""
    return f"lifecycle-{uuid.uuid4().hex[:8]}"


def messages(cluster: Cluster, task_id: str) -> list[Message]:
    with read_session(cluster.settings.database_url) as s:
        return list(s.scalars(select(Message).where(Message.task_id == task_id)
                              .order_by(Message.id)))


def state_of(cluster: Cluster, task_id: str) -> str | None:
    with read_session(cluster.settings.database_url) as s:
        row = s.get(AnnouncementRow, task_id)
        return None if row is None else row.state


def node_record(cluster: Cluster, name: str) -> tuple[int, int]:
    """A node's record in the store: finished attempts and successes."""
    with read_session(cluster.settings.database_url) as s:
        row = s.get(Node, name)
        assert row is not None
        return row.attempts, row.successes


def assert_reaches(cluster: Cluster, task_id: str, state: str, timeout: float) -> None:
    """Wait for ``task_id`` to be in ``state``; on failure show its state and its log."""
    if not wait_for(lambda: state_of(cluster, task_id) == state, timeout):
        log = [(m.kind, m.node, m.detail) for m in messages(cluster, task_id)]
        lines = [f"{name}: {line}" for name, node in cluster.federation.nodes.items()
                 for line in node.log.read_text(errors="replace").splitlines()
                 if task_id in line]
        pytest.fail(f"{task_id} not {state} after {timeout}s: state "
                    f"{state_of(cluster, task_id)}, log {log}, node logs:\n" + "\n".join(lines))


@contextmanager
def bidding_ghost(cluster: Cluster, skills: list[str]) -> Iterator[NodeProfile]:
    """A node that heartbeats and bids (through the production bid code) but never executes:
    its exec queue has no consumer, as when a node's workers are stuck."""
    profile = NodeProfile(name="ghost", capabilities=skills, capacity=4, price_per_unit=0.01,
                          latency_ms=50, trust=70)
    stop = threading.Event()

    def run() -> None:
        def on_request(request: BidRequest) -> None:
            answer(Context(cluster.settings, cluster.app), profile, request)

        board = get_board(Context(cluster.settings, cluster.app))
        if isinstance(board, RedisBoard):
            listener = RequestListener(board, profile.name, on_request)
            listener.start()
            try:
                while not stop.wait(0.5):
                    heartbeat(cluster.settings, profile)
            finally:
                listener.stop()
            return
        with Connection(cluster.app.conf.broker_url) as conn, conn.Consumer(
                [request_queue(profile.name)],
                on_message=lambda message: on_request(BidRequest.from_json(message.body)),
                no_ack=True):
            beat = 0.0
            while not stop.is_set():
                if time.monotonic() - beat > 0.5:
                    heartbeat(cluster.settings, profile)
                    beat = time.monotonic()
                with suppress(TimeoutError):
                    conn.drain_events(timeout=0.2)

    heartbeat(cluster.settings, profile)
    invalidate_cache()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield profile
    finally:
        stop.set()
        thread.join(timeout=5)
        cluster.bury(profile.name)


@contextmanager
def killed(cluster: Cluster, name: str) -> Iterator[None]:
    """Kill node ``name`` with SIGKILL; afterwards start it again, as systemd would, because
    the other tests count on all three nodes."""
    cluster.federation.kill(name, signal.SIGKILL)
    try:
        yield
    finally:
        cluster.federation.restart(name)
        cluster.federation.wait_live(cluster.settings, [name], timeout=60)


def test_a_task_that_fails_twice_succeeds_on_a_third_node_after_the_policy_delays(
    nodes: Cluster,
) -> None:
    # given a task that fails its first two attempts, with AITP's exponential policy (base 0.5 s)
    policy = bidding.RetryPolicy(max_retries=3, backoff="exponential", base_ms=500)
    key = f"flaky-{time.time()}"
    result = flaky.apply_async((key, 2), bidding={"retry_policy": policy.model_dump(),
                                                  "task_type": fresh_type()})
    # when the caller waits on the id .delay() returned
    value = result.get(timeout=30)
    # then the third attempt's value arrives, and each attempt ran on a different node
    assert value["attempts"] == 3
    tried = [n.decode() for n in nodes.counters.lrange(f"nodes:{key}", 0, -1)]
    assert len(tried) == 3 and len(set(tried)) == 3, tried
    # and the new auctions came after the policy's delays, on time: 0.5 s, then 1.0 s (the
    # failing node announces each at its time; an idle sweeper passes only once a second)
    log = messages(nodes, result.id)
    retried = [m for m in log if m.kind == "RETRYING"]
    assert [m.detail["delay_s"] for m in retried] == [0.5, 1.0]
    announced = {m.attempt: m.at for m in log if m.kind == "ANNOUNCED"}
    for m in retried:
        waited = announced[m.detail["next_attempt"]] - m.at
        assert m.detail["delay_s"] - 0.01 <= waited <= m.detail["delay_s"] + 0.6, waited
    assert bidding.explain(result.id, app=nodes.app).state == "SUCCESS"


def test_a_countdown_starts_its_auction_on_time_on_an_idle_federation(nodes: Cluster) -> None:
    # given an idle federation (after 3 s with nothing to do its sweeper passes once a second)
    # and calls with a 0.3 s countdown, each after such a spell, at different moments of the
    # sweeper's pass
    results = []
    for idle in (3.0, 3.4, 3.8):
        time.sleep(idle)
        results.append(shaped.apply_async((idle,), countdown=0.3,
                                          bidding={"task_type": fresh_type()}))
        # when it runs
        assert results[-1].get(timeout=30) == {"value": idle}
    # then each auction opened at its time, not at the sweeper's next pass (up to 1 s late)
    for result in results:
        log = messages(nodes, result.id)
        scheduled = next(m.at for m in log if m.kind == "SCHEDULED")
        announced = next(m.at for m in log if m.kind == "ANNOUNCED")
        assert 0.29 <= announced - scheduled <= 0.3 + 0.35, announced - scheduled


def test_a_countdown_whose_caller_is_gone_starts_at_its_time_from_the_idle_sweeper(
    nodes: Cluster,
) -> None:
    from bidding.auction.alarm import ALARM

    # given an idle federation (its sweeper's phases idle: one look a second reads the store)
    time.sleep(3.0)
    # when a task is scheduled 1.5 s ahead and its calling process's alarm is gone before it
    # rings (the process killed: only the sweeper knows of the task now)
    result = shaped.apply_async(("late",), countdown=1.5, bidding={"task_type": fresh_type()})
    ALARM.clear()
    # then it runs, announced by the sweeper at its time (the look saw when it comes due and
    # woke the announcing phase then), not at a later idle pause
    assert result.get(timeout=30) == {"value": "late"}
    log = messages(nodes, result.id)
    scheduled = next(m.at for m in log if m.kind == "SCHEDULED")
    announced = next(m.at for m in log if m.kind == "ANNOUNCED")
    assert 1.49 <= announced - scheduled <= 1.5 + 0.35, announced - scheduled


def test_a_non_retryable_error_fails_at_once(nodes: Cluster) -> None:
    # given a policy that does not retry RuntimeError
    policy = {"max_retries": 3, "base_ms": 100, "non_retryable": ["RuntimeError"]}
    result = flaky.apply_async((f"nr-{time.time()}", 5), bidding={"retry_policy": policy,
                                                                  "task_type": fresh_type()})
    # then the first failure is final
    with pytest.raises(RuntimeError, match="attempt 1 fails"):
        result.get(timeout=15)
    kinds = [m.kind for m in messages(nodes, result.id)]
    assert "RETRYING" not in kinds and kinds[-1] == "TASK_FAILED"


def test_self_retry_is_a_new_auction_on_another_node(nodes: Cluster) -> None:
    # given a task that calls self.retry(countdown=0.3) twice, as Celery users write it
    key = f"retry-{time.time()}"
    # when it runs, then the third attempt returns, each on a different node
    value = retrying.apply_async((key, 2), bidding={"task_type": fresh_type()}).get(timeout=30)
    assert value["attempts"] == 3
    tried = [n.decode() for n in nodes.counters.lrange(f"nodes:{key}", 0, -1)]
    assert len(set(tried)) == 3, tried


def test_self_retry_passes_its_new_arguments_and_stops_at_max_retries(nodes: Cluster) -> None:
    # given a task that retries itself with new arguments, max_retries=2 (as in plain Celery)
    key = f"countdown-{time.time()}"
    # when it needs two retries, then each attempt got the arguments its retry gave
    assert countdown.apply_async((key, 2), bidding={"task_type": fresh_type()}).get(
        timeout=30) == [2, 1, 0]
    # and when it would need five, then the third attempt's retry is refused, as Celery does
    key = f"countdown-{time.time()}"
    with pytest.raises(MaxRetriesExceededError):
        countdown.apply_async((key, 5), bidding={"task_type": fresh_type()}).get(timeout=30)
    assert [int(v) for v in nodes.counters.lrange(f"args:{key}", 0, -1)] == [5, 4, 3]


def test_a_winner_that_never_starts_the_task_is_replaced_by_the_next_best_bidder(
    nodes: Cluster,
) -> None:
    # given a node that bids best but whose workers never take the task
    with bidding_ghost(nodes, ["shared", "ghostly"]):
        started = time.monotonic()
        result = ghostly.apply_async(("boo",), bidding={"schedule_to_start_timeout": 1.0,
                                                        "task_type": fresh_type()})
        # when it is not started within 1 s, then the next-best bidder runs it
        value = result.get(timeout=20)
        elapsed = time.monotonic() - started
    assert value["node"] in NODES
    log = messages(nodes, result.id)
    awarded = next(m for m in log if m.kind == "AWARDED")
    assert awarded.node == "ghost"
    moved = next(m for m in log if m.kind == "REAWARDED")
    assert moved.detail["from"] == "ghost" and moved.detail["to"] == value["node"]
    assert "did not start the task in time" in moved.detail["reason"]
    assert 1.0 <= elapsed < 6
    assert nodes.executions(result.id) == 1


def test_a_soft_time_limit_is_retried_with_the_extended_limit(nodes: Cluster) -> None:
    # given a 1.5 s job with a 0.5 s soft limit, extended to 5 s on timeout
    result = sleepy.apply_async((1.5,), bidding={
        "task_type": fresh_type(),
        "timeout_seconds": 0.5,
        "fallbacks": {"on_timeout": "extend", "extended_timeout_seconds": 5},
    })
    # then the second attempt, with the extended limit, completes
    assert result.get(timeout=20)["slept"] == 1.5
    log = messages(nodes, result.id)
    retry = next(m for m in log if m.kind == "RETRYING")
    assert "SoftTimeLimitExceeded" in retry.detail["error"]
    assert "retrying with 5s" in retry.detail["why"]
    with read_session(nodes.settings.database_url) as s:
        row = s.get(AnnouncementRow, result.id)
        assert row is not None and row.spec["timeout_seconds"] == 5


def test_a_hard_time_limit_fails_the_task_for_the_caller_and_in_the_store(
    nodes: Cluster,
) -> None:
    # given a task that ignores its 0.5 s soft limit (the hard limit follows 0.5 s later)
    result = stubborn.apply_async((5.0,), bidding={"timeout_seconds": 0.5,
                                                   "fallbacks": {"on_timeout": "fail"},
                                                   "task_type": fresh_type()})
    # then Celery kills it at the hard limit and the caller sees TimeLimitExceeded ...
    from celery.exceptions import TimeLimitExceeded

    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=15)
    # ... and the store agrees: FAILED, with the reason, not EXECUTING for ever
    assert_reaches(nodes, result.id, "FAILED", 5)
    last = messages(nodes, result.id)[-1]
    assert last.kind == "TASK_FAILED" and last.detail["why"] == "hard time limit"


def test_a_budget_overrun_fails_the_task_and_notifies(nodes: Cluster) -> None:
    # given a budget of 0.5 and a task that consumes 100 units at 0.01 each
    Hook.received.clear()
    result = metered.apply_async((100,), bidding={"budget": 0.5, "task_type": fresh_type()})
    # then the caller sees the overrun ...
    with pytest.raises(bidding.CostExceededError, match=r"spent 1\.0000 of budget 0\.5000"):
        result.get(timeout=15)
    # ... the ledger has the attempt, the task is FAILED, and the webhook was called
    status = bidding.status.task_status(nodes.settings.database_url, result.id)
    assert status.state == "FAILED"
    assert [(e.units, e.total) for e in status.ledger] == [(100.0, pytest.approx(1.0))]
    assert wait_for(lambda: any(h.get("task_id") == result.id for h in Hook.received), 5)
    hook = next(h for h in Hook.received if h["task_id"] == result.id)
    assert hook["event"] == "cost_exceeded" and hook["budget"] == 0.5


def test_bids_over_the_remaining_budget_are_not_awarded(nodes: Cluster) -> None:
    # given a budget below every node's price for the announced units
    result = metered.apply_async((1,), bidding={"budget": 0.001, "units": 1,
                                                "task_type": fresh_type()})
    # then no bid is valid, and nothing ran
    with pytest.raises(bidding.NoBidsError, match="exceeds remaining budget"):
        result.get(timeout=15)


def test_the_output_schema_decides_success(nodes: Cluster) -> None:
    schema = {"type": "object", "properties": {"value": {"type": "integer"}},
              "required": ["value"]}
    # given a result that matches the schema, then SUCCESS
    ok = shaped.apply_async((7,), bidding={"output_schema": schema, "task_type": fresh_type()})
    assert ok.get(timeout=15) == {"value": 7}
    assert state_of(nodes, ok.id) == "SUCCESS"
    # given one that does not, then FAILED with the validation error
    bad = shaped.apply_async(("seven",), bidding={"output_schema": schema,
                                                  "task_type": fresh_type()})
    with pytest.raises(bidding.OutputValidationError, match="at value: 'seven' is not of"):
        bad.get(timeout=15)
    assert state_of(nodes, bad.id) == "FAILED"
    assert [m.kind for m in messages(nodes, bad.id)][-2:] == ["TASK_COMPLETED", "OUTPUT_INVALID"]


def test_progress_is_recorded_and_shown(nodes: Cluster) -> None:
    # given a task reporting progress after each of 3 steps
    result = steps.apply_async((3, 0.2), bidding={"task_type": fresh_type()})
    assert result.get(timeout=15) == 3
    # then every report is a PROGRESS_UPDATE message, and status shows the last one
    updates = [m.detail for m in messages(nodes, result.id) if m.kind == "PROGRESS_UPDATE"]
    assert [(u["current"], u["total"], u["note"]) for u in updates] == [
        (1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
    status = bidding.status.task_status(nodes.settings.database_url, result.id)
    assert status.progress["percent"] == 100.0


def test_a_task_that_reaches_its_node_after_its_deadline_is_failed_unstarted(
    nodes: Cluster,
) -> None:
    # given every execution slot busy for 20 s (three nodes, two slots each: two blockers sent
    # to each node, whatever the nodes' records from earlier tests would make them bid; 20 s
    # so that on a slow machine the first still runs when the last starts: a CI run with a
    # chaos soak beside it once took more than 10 s to start all six)
    busy = fresh_type()
    blockers = [steps.apply_async((20, 1.0), bidding={
        "task_type": busy, "preferred_node": node, "strategy": "preferred_only"})
        for node in NODES for _ in range(2)]
    # (40 s: on a slow machine an earlier test's tasks may still hold a slot for a while)
    assert wait_for(lambda: sum(state_of(nodes, b.id) == "EXECUTING" for b in blockers) == 6,
                    40)
    # when a task with a deadline 2 s away is announced: it is awarded, and waits in a queue
    key = f"late-{time.time()}"
    result = slow.apply_async((key, 0.1), bidding={"deadline": time.time() + 2.0,
                                                   "task_type": fresh_type()})
    # then it fails without starting (it expired: a deadline and an expiry are one limit),
    # and the caller and the log say why
    with pytest.raises(bidding.DeadlinePassedError, match="expired: not started by its deadline"):
        result.get(timeout=30)
    assert nodes.counters.get(f"started:{key}") is None
    assert state_of(nodes, result.id) == "FAILED"
    expired = [m for m in messages(nodes, result.id) if m.kind == "EXPIRED"]
    assert len(expired) == 1 and "expired: not started by its deadline" in expired[0].detail[
        "error"]
    # and nothing is charged for the body that never ran
    with read_session(nodes.settings.database_url) as s:
        assert sum(e.total for e in s.scalars(
            select(LedgerEntry).where(LedgerEntry.task_id == result.id))) == 0.0
    for b in blockers:
        b.get(timeout=40)


def test_an_execution_message_for_a_task_the_store_does_not_know_is_dropped(
    nodes: Cluster,
) -> None:
    # given an execution message for a task that was never announced in this store (a leftover
    # on a reused broker, or a caller with another store)
    key = f"stray-{time.time()}"
    stray = Spec(task_id=str(uuid.uuid4()), task_name=slow.name, task_type=fresh_type(),
                 args=[key, 0.1])
    send_execution(nodes.app, stray, "north", nodes.settings)
    # then the node drops it with an error naming the task, and the body never runs
    log = nodes.federation.nodes["north"].log
    assert wait_for(lambda: f"execution of {stray.task_id} (attempt 1) dropped"
                    in log.read_text(errors="replace"), 15)
    assert nodes.counters.get(f"started:{key}") is None


def test_a_task_no_node_can_do_is_deferred_until_a_capable_node_joins(nodes: Cluster,
                                                                       tmp_path: Any) -> None:
    # given no node with late_skill, and a task that defers every 0.5 s (for up to a minute:
    # a worker starting on a loaded machine can take longer than the default 12 deferrals)
    result = late.apply_async((5,), bidding={
        "task_type": fresh_type(),
        "fallbacks": {"on_capability_unavailable": "defer", "defer_seconds": 0.5,
                      "max_deferrals": 120}})
    assert_reaches(nodes, result.id, "DEFERRED", 5)
    # when a capable node joins
    nodes.federation.start([write_profile(tmp_path, "latecomer", ["late_skill"])])
    try:
        nodes.federation.wait_live(nodes.settings, ["latecomer"], timeout=60)
        # then the task runs there
        assert result.get(timeout=30)["node"] == "latecomer"
        kinds = [m.kind for m in messages(nodes, result.id)]
        assert kinds[0] == "DEFERRED" and "ANNOUNCED" in kinds and kinds[-1] == "TASK_SUCCEEDED"
    finally:
        # The later tests count on the three equal nodes alone.
        nodes.federation.stop_node("latecomer")


def test_a_node_killed_mid_task_loses_it_to_another_node_that_runs_it_once(
    nodes: Cluster,
) -> None:
    # given a 3 s task running on some node
    key = f"slow-{time.time()}"
    result = slow.apply_async((key, 3.0), bidding={"task_type": fresh_type()})
    assert_reaches(nodes, result.id, "EXECUTING", 20)
    victim = bidding.explain(result.id, app=nodes.app).winner
    assert victim in NODES
    record_before = node_record(nodes, victim)
    # when that node is killed with SIGKILL (no warm shutdown, no heartbeat any more)
    with killed(nodes, victim):
        # then, once its heartbeat is older than the TTL, the next-best bidder runs the task
        value = result.get(timeout=30)
        assert value["node"] != victim
        # and the body ran to completion exactly once
        assert int(nodes.counters.get(f"finished:{key}") or 0) == 1
        moved = next(m for m in messages(nodes, result.id) if m.kind == "REAWARDED")
        assert moved.detail["from"] == victim
        assert "stopped heartbeating" in moved.detail["reason"]
        with read_session(nodes.settings.database_url) as s:
            lost = s.scalars(select(Episode).where(Episode.task_id == result.id,
                                                   Episode.node == victim)).one()
        assert lost.success is False
        # and the lost attempt counts in the victim's record, as a failure
        attempts, successes = node_record(nodes, victim)
        assert (attempts - record_before[0], successes - record_before[1]) == (1, 0)
