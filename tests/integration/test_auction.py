"""The auction end to end: real worker processes on Redis, the store on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
from celery.result import AsyncResult
from sqlalchemy import delete, func, insert, select, update

import bidding
from bidding.auction import scores
from bidding.auction.announcement import build_announcement
from bidding.auction.bid import NodeHistory, compute_bid
from bidding.auction.board import RedisBoard, get_board
from bidding.auction.close import close_auction
from bidding.auction.opening import row_values
from bidding.auction.proxy import PROXY_CLOSE
from bidding.context import Context
from bidding.lifecycle import journal
from bidding.nodes.profile import NodeProfile
from bidding.nodes.records import read_records
from bidding.nodes.registry import invalidate_cache
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow, Message, Node, NodeRecord
from tests.integration.app import failing, gpu, phantom, shared
from tests.integration.conftest import (
    NODES,
    ROOT,
    Cluster,
    assert_no_confident_bid,
    finished_in_the_database_file,
    wait_for,
)

pytestmark = pytest.mark.integration


def test_delay_runs_the_task_on_a_bidder_and_get_returns_its_value(cluster: Cluster) -> None:
    # given three live nodes that can all do shared work
    # when a caller uses plain Celery .delay() and .get()
    result = shared.delay(21)
    value = result.get(timeout=15)
    # then the task's own return value comes back, computed on one of the nodes
    assert value["value"] == 21
    assert value["node"] in NODES
    # and explain shows every bid, its breakdown, the strategy and that same winner
    why = bidding.explain(result.id, app=cluster.app)
    assert why.state == "SUCCESS"
    assert why.winner == value["node"]
    assert why.strategy == "weighted"
    assert why.closed_by == "all bids in"
    assert sorted(b.node for b in why.bids) == sorted(NODES)
    assert all(b.will_bid and b.score is not None for b in why.bids)
    winner_bid = next(b for b in why.bids if b.is_winner)
    assert winner_bid.node == value["node"]
    assert set(winner_bid.breakdown["terms"]) == {"confidence", "skill_match"}
    kinds = [m.kind for m in why.messages]
    assert kinds[0] == "ANNOUNCED" and kinds.count("BID") == 3
    assert kinds[-4:] == ["AWARDED", "TASK_ACCEPTED", "TASK_COMPLETED", "TASK_SUCCEEDED"]
    assert cluster.executions(result.id) == 1


def test_routing_follows_capability(cluster: Cluster) -> None:
    # given that only east declares the gpu skill
    # when gpu work is submitted
    results = [gpu.delay(i) for i in range(5)]
    # then every one runs on east, and only east was asked to bid
    assert {r.get(timeout=15)["node"] for r in results} == {"east"}
    why = bidding.explain(results[0].id, app=cluster.app)
    assert why.candidates == ["east"]
    assert [b.node for b in why.bids] == ["east"]


def test_a_capped_auction_asks_the_node_with_the_best_record_on_the_task_type(
    cluster: Cluster,
) -> None:
    # given three nodes that can all do shared work, and a task type on which east has
    # done well (40 attempts, 39 succeeded) and north and south poorly (40, 16)
    task_type = f"ranked-{uuid.uuid4().hex[:8]}"
    with write_session(cluster.settings.database_url) as session:
        session.execute(insert(NodeRecord), [
            {"node": name, "task_type": task_type, "attempts": 40,
             "successes": 39 if name == "east" else 16} for name in NODES])
    invalidate_cache()
    # when five such tasks are announced, each asking one node only (the best by record)
    results = [shared.apply_async((i,), bidding={"candidate_cap": 1, "task_type": task_type})
               for i in range(5)]
    # then every one was asked of east and ran there
    assert {r.get(timeout=20)["node"] for r in results} == {"east"}
    assert {tuple(bidding.explain(r.id, app=cluster.app).candidates) for r in results} == {
        ("east",)}


def test_a_capped_auction_ranks_a_replica_new_to_the_type_by_its_kins_record_there(
    cluster: Cluster,
) -> None:
    # given north and south, kin (one profile but for the name), and east, each with 950
    # successes in 1,000 attempts overall; and a task type on which south failed 32 of 40
    # times and east succeeded 30 of 40, and which north never ran
    task_type = f"kin-ranked-{uuid.uuid4().hex[:8]}"
    with write_session(cluster.settings.database_url) as session:
        before = {name: (attempts, successes) for name, attempts, successes in session.execute(
            select(Node.name, Node.attempts, Node.successes).where(Node.name.in_(NODES)))}
        session.execute(update(Node).where(Node.name.in_(NODES))
                        .values(attempts=1000, successes=950))
        session.execute(insert(NodeRecord), [
            {"node": "south", "task_type": task_type, "attempts": 40, "successes": 8},
            {"node": "east", "task_type": task_type, "attempts": 40, "successes": 30}])
    try:
        invalidate_cache()
        # when five such tasks are announced, each asking one node only (the best by rank)
        results = [shared.apply_async((i,), bidding={"candidate_cap": 1,
                                                     "task_type": task_type})
                   for i in range(5)]
        # then every one was asked of east and ran there: north is ranked by what its kin's
        # record says of it on the type (about 0.24), not by its good record overall (a
        # newcomer to the type ranked on that would have been asked every time)
        assert {r.get(timeout=20)["node"] for r in results} == {"east"}
        assert {tuple(bidding.explain(r.id, app=cluster.app).candidates)
                for r in results} == {("east",)}
    finally:
        with write_session(cluster.settings.database_url) as session:
            for name, (attempts, successes) in before.items():
                session.execute(update(Node).where(Node.name == name).values(
                    attempts=Node.attempts - 1000 + attempts,
                    successes=Node.successes - 950 + successes))
        invalidate_cache()


def test_a_node_new_to_a_task_type_bids_from_its_kins_record_there(cluster: Cluster) -> None:
    # given north and south, whose profiles are the same but for the name (kin), and east,
    # whose skills differ; north has succeeded 800 times in 1,000 overall, south 950 times; and
    # two task types that south ran 30 times, one with 21 successes, one with 3, which north
    # and east never ran
    fair, poor = (f"{kind}-{uuid.uuid4().hex[:8]}" for kind in ("fair", "poor"))
    records = {"north": (1000, 800), "south": (1000, 950)}
    with write_session(cluster.settings.database_url) as session:
        before = {name: (attempts, successes) for name, attempts, successes in session.execute(
            select(Node.name, Node.attempts, Node.successes).where(Node.name.in_(records)))}
        for name, (attempts, successes) in records.items():
            session.execute(update(Node).where(Node.name == name)
                            .values(attempts=attempts, successes=successes))
        session.execute(insert(NodeRecord), [
            {"node": "south", "task_type": fair, "attempts": 30, "successes": 21},
            {"node": "south", "task_type": poor, "attempts": 30, "successes": 3}])
    try:
        invalidate_cache()
        time.sleep(cluster.settings.live_cache_seconds + 0.2)  # the nodes' cached live nodes
        # (north does worse than south over everything it ran: its rate over theirs, ~0.85; a
        # replica judged on its latest episodes is placed by that, decision 0042)
        assert scores.replica_factor(records["north"], records["south"]) < 0.9
        # when a task of each type is bid on by the nodes themselves, then by the announcer
        for mode in ("ask", "proxy"):
            confidence = {}
            for task_type in (fair, poor):
                tried, won = read_records(cluster.settings, task_type, ["south"])["south"]
                result = shared.apply_async((1,), bidding={"task_type": task_type,
                                                           "bid_mode": mode})
                assert result.get(timeout=20)["value"] == 1
                bids = {b.node: b for b in bidding.explain(result.id, app=cluster.app).bids}
                confidence[task_type] = (bids["north"].confidence, (won + 2) / (tried + 2))
                # then east, without kin, bids as a newcomer does (1.0)
                assert bids["east"].confidence == 1.0
            # and north bids its kin's rate on the fair type, (21 + 2) / (30 + 2) at first: its
            # whole record there (none yet) smoothed toward theirs (decision 0045; a task it
            # ran meanwhile moves it a little)
            assert confidence[fair][0] == pytest.approx(confidence[fair][1], rel=0.02), mode
            assert confidence[fair][1] < 0.8
            # and on the poor type the minimum confidence, not its kin's rate: what they did
            # lowers its first bids, only its own record could rule it out
            assert confidence[poor][1] < 0.5
            assert confidence[poor][0] == 0.5, mode
    finally:
        # the nodes' records as they were, with what this test ran added
        with write_session(cluster.settings.database_url) as session:
            for name, (attempts, successes) in records.items():
                was_attempts, was_successes = before[name]
                session.execute(update(Node).where(Node.name == name).values(
                    attempts=Node.attempts - attempts + was_attempts,
                    successes=Node.successes - successes + was_successes))
        invalidate_cache()


def test_a_node_whose_queue_has_no_consumer_does_not_stall_the_auction(cluster: Cluster) -> None:
    # given a live node (fresh heartbeat) whose bid queue no worker consumes
    cluster.ghost(["shared"])
    try:
        # when shared work is announced to all four
        started = time.monotonic()
        result = shared.delay("x")
        value = result.get(timeout=15)
        elapsed = time.monotonic() - started
    finally:
        cluster.bury()
    # then the auction closes at the deadline with the three bids that arrived
    why = bidding.explain(result.id, app=cluster.app)
    assert "ghost" in why.candidates
    assert why.closed_by == "deadline"
    assert sorted(b.node for b in why.bids) == sorted(NODES)
    assert value["node"] in NODES
    window = cluster.settings.window
    assert window <= elapsed < window + 5


def test_no_answer_at_all_fails_with_a_clear_result(cluster: Cluster) -> None:
    # given that the only node claiming the phantom skill never answers
    cluster.ghost(["phantom"])
    try:
        result = phantom.delay(1)
        # when the caller waits for the result
        with pytest.raises(bidding.NoBidsError, match="No bids received: none of 1 candidate"):
            result.get(timeout=15)
    finally:
        cluster.bury()
    # then the task is FAILED in the store and never ran
    assert bidding.explain(result.id, app=cluster.app).state == "FAILED"
    assert cluster.executions(result.id) == 0


def test_a_task_whose_deadline_passed_before_the_call_is_never_announced(
    cluster: Cluster,
) -> None:
    # given a task whose deadline has already passed when it is called
    result = shared.apply_async((1,), bidding={"deadline": time.time() - 1})
    # when the caller waits
    with pytest.raises(bidding.TaskExpiredError) as err:
        result.get(timeout=15)
    # then the error says it expired, by its deadline, as it was called
    assert "expired: not started by its deadline" in str(err.value)
    assert "while it was called" in str(err.value)
    # and no node was asked to bid, and nothing ran
    assert bidding.explain(result.id, app=cluster.app).bids == []
    assert cluster.executions(result.id) == 0


def test_no_bidders_registered(cluster: Cluster) -> None:
    # given no live node with the required skill
    # when such a task is submitted
    result = shared.apply_async((1,), bidding={"required_skills": ["underwater_welding"]})
    # then seed 001's outcome arrives at once
    with pytest.raises(bidding.NoBidsError, match="No bidders registered"):
        result.get(timeout=5)


def test_no_valid_bid_fails_or_falls_back_as_configured(cluster: Cluster) -> None:
    # given bids that cannot reach min_trust 100 (the nodes declare 70)
    failed = shared.apply_async((1,), bidding={"min_trust": 100, "no_bid": "fail"})
    fallback = shared.apply_async((2,), bidding={"min_trust": 100, "no_bid": "fallback"})
    # then "fail" gives a clear error naming each bid's reason ...
    with pytest.raises(bidding.NoBidsError, match=r"No valid bids: .*below min_trust 100"):
        failed.get(timeout=15)
    # ... and "fallback" assigns the task to a live node (seed 000) and it runs
    assert fallback.get(timeout=15)["value"] == 2
    why = bidding.explain(fallback.id, app=cluster.app)
    assert why.outcome == "fallback"
    assert all("below min_trust" in b.breakdown["reason"] for b in why.bids)


def test_no_confident_bid_gives_seed_001s_error(cluster: Cluster) -> None:
    # the nodes bid on their records: seed 001's outcome when no bid is confident enough
    assert_no_confident_bid(cluster)


def test_a_failing_task_reaches_the_caller_and_is_recorded(cluster: Cluster) -> None:
    # given a task body that raises on the winning node
    result = failing.delay("boom")
    # when the caller waits, it sees the task's own exception
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=15)
    # and the store records the failed attempt
    why = bidding.explain(result.id, app=cluster.app)
    assert why.state == "FAILED"
    assert [m.kind for m in why.messages][-1] == "TASK_FAILED"
    assert "ValueError: boom" in (why.messages[-1].detail["error"] or "")


def test_a_duplicated_award_executes_the_task_once(cluster: Cluster) -> None:
    # given an open auction: three bids in, a fourth candidate that never answers
    cluster.ghost(["shared"])
    try:
        result = shared.apply_async(("once",), bidding={"window": 3.0})

        board = get_board(Context(cluster.settings, cluster.app))

        def bids_in() -> bool:
            return len(board.peek(result.id, 1)) == 3

        assert wait_for(bids_in, timeout=10)
        # when the award is triggered many times at once here, and again by every node's
        # deadline sweeper when the window ends
        threads = [
            threading.Thread(target=close_auction,
                             args=(Context(cluster.settings, cluster.app), result.id, 1, "test"))
            for _ in range(6)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert result.get(timeout=15)["value"] == "once"
        time.sleep(3.5)  # past the window: the sweepers find the auction closed
    finally:
        cluster.bury()
    # then exactly one award was made and the body ran exactly once
    with read_session(cluster.settings.database_url) as s:
        awards = s.scalar(select(func.count()).select_from(Message).where(
            Message.task_id == result.id, Message.kind == "AWARDED"))
    assert awards == 1
    assert cluster.executions(result.id) == 1


def test_fifty_concurrent_auctions_spread_over_three_equal_idle_nodes(cluster: Cluster) -> None:
    # given three equal idle nodes, and a task type none of them has run (so that no record,
    # nor a kin's, sets their bids apart: the earlier tests leave them different records)
    task_type = f"spread-{uuid.uuid4().hex[:8]}"
    # when 50 auctions run at once
    results = [shared.apply_async((i, 0.05), bidding={"task_type": task_type})
               for i in range(50)]
    nodes = Counter(r.get(timeout=60)["node"] for r in results)
    # then all three nodes get a share of the work
    assert set(nodes) == set(NODES)
    assert min(nodes.values()) >= 5, nodes


def test_nodes_busy_with_long_tasks_still_bid_at_once(cluster: Cluster) -> None:
    # given every worker process of every node busy with a long task (3 nodes x 2 processes),
    # of a type none of them has run (so that their bids tie: no record, nor a kin's, tells
    # them apart)
    task_type = f"long-{uuid.uuid4().hex[:8]}"
    long_running = [shared.apply_async((f"long-{i}", 3.0), bidding={"task_type": task_type})
                    for i in range(6)]

    def all_busy() -> bool:
        with read_session(cluster.settings.database_url) as s:
            return s.scalar(select(func.count()).select_from(AnnouncementRow).where(
                AnnouncementRow.task_id.in_([r.id for r in long_running]),
                AnnouncementRow.state == "EXECUTING")) == 6

    # (equal bids tie; ties go to the least busy node, so the six spread two per node)
    assert wait_for(all_busy, timeout=15)
    # when another task is announced
    result = shared.delay("next")
    # then every node answers within the window (bids are not queued behind executions) ...
    def awarded() -> bool:
        with read_session(cluster.settings.database_url) as s:
            row = s.get(AnnouncementRow, result.id)
            return row is not None and row.awarded_at is not None

    assert wait_for(awarded, timeout=5)
    why = bidding.explain(result.id, app=cluster.app)
    assert why.closed_by == "all bids in"
    assert sorted(b.node for b in why.bids) == sorted(NODES)
    # ... reporting its in-flight work as a lower load score (2 of capacity 4 busy)
    assert all(b.load is not None and b.load <= 0.5 for b in why.bids)
    # and the task still runs once a process frees up
    assert result.get(timeout=20)["value"] == "next"
    for r in long_running:
        r.get(timeout=20)


def test_bids_in_before_the_announcement_is_stored_still_win(cluster: Cluster) -> None:
    # given an auction whose only bid is on the board before the caller's insert commits
    # (new auctions ask for bids first, so the insert overlaps the bidding)
    announcement = build_announcement(shared, cluster.settings, ("early",), {}, {})
    north = NodeProfile(name="north", capabilities=NODES["north"], capacity=4,
                        price_per_unit=0.01, latency_ms=50, trust=70)
    get_board(Context(cluster.settings, cluster.app)).post(
        compute_bid(announcement, north, NodeHistory()), expected=1, window=announcement.window)
    awards: list[Any] = []
    closer = threading.Thread(target=lambda: awards.append(close_auction(
        Context(cluster.settings, cluster.app), announcement.task_id, 1, "all bids in",
        announcement=announcement, candidates=1)))
    # when the award starts first and the row is written 0.3 s later
    closer.start()
    time.sleep(0.3)
    with write_session(cluster.settings.database_url) as s:
        s.execute(insert(AnnouncementRow), [row_values(announcement, "BIDDING", ["north"])])
        journal.record(
            s,
            announcement.task_id,
            journal.ANNOUNCED,
            at=announcement.announced_at,
            candidates=["north"],
        )  # as the caller's insert writes it
    closer.join(timeout=10)
    # then the award waited for the row, and the task runs on the bidder
    assert awards and awards[0] is not None and awards[0].winner == "north"
    assert AsyncResult(announcement.task_id, app=cluster.app).get(timeout=15)["node"] == "north"


def test_an_open_auction_shows_its_bids_and_is_announced_again_if_the_board_is_lost(
    cluster: Cluster,
) -> None:
    # given an open auction: three bids in, a fourth candidate that never answers
    cluster.ghost(["shared"])
    try:
        result = shared.apply_async(("lost",), bidding={"window": 2.0})
        board = get_board(Context(cluster.settings, cluster.app))
        assert wait_for(lambda: len(board.peek(result.id, 1)) == 3, timeout=10)
        # then explain shows the auction open, with the three answers not scored yet
        why = bidding.explain(result.id, app=cluster.app)
        assert why.state == "BIDDING"
        assert sorted(b.node for b in why.bids) == sorted(NODES)
        assert all(b.score is None for b in why.bids)
        # when the board's data is lost (as when Redis restarts without persistence)
        assert isinstance(board, RedisBoard)
        board.client.delete(board.key(result.id, 1))
        # then the deadline sweeper finds no answer, announces the task again (a new attempt)
        # rather than fail it, and it runs
        assert result.get(timeout=20)["value"] == "lost"
    finally:
        cluster.bury()
    with read_session(cluster.settings.database_url) as s:
        deferred = list(
            s.scalars(
                select(Message.detail).where(
                    Message.task_id == result.id, Message.kind == "DEFERRED"
                )
            )
        )
    assert deferred and "none of 4 candidate(s) answered" in deferred[0]["reason"]
    assert bidding.explain(result.id, app=cluster.app).state == "SUCCESS"


def test_one_call_can_be_bid_by_proxy_where_the_default_is_to_ask(cluster: Cluster) -> None:
    # given nodes and a caller that ask for bids by default
    assert cluster.settings.bid_mode == "ask"
    # when one call asks for proxy bids, and another does not
    proxied_call = shared.apply_async((1,), bidding={"bid_mode": "proxy"})
    asked_call = shared.delay(2)
    assert proxied_call.get(timeout=15)["value"] == 1 and asked_call.get(timeout=15)["value"] == 2
    # then the first was closed by proxy bids and the second by the nodes' answers
    assert bidding.explain(proxied_call.id, app=cluster.app).closed_by == PROXY_CLOSE
    assert bidding.explain(asked_call.id, app=cluster.app).closed_by != PROXY_CLOSE


def test_nodes_refuse_a_strategy_path_they_do_not_allow(
    cluster: Cluster,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a caller that allows a strategy by dotted path, and nodes that do not
    from bidding.config import reset_settings

    path = "bidding.strategies.builtins:Composite"
    monkeypatch.setenv("BIDDING_ALLOWED_STRATEGIES", path)
    reset_settings(cluster.app)
    try:
        result = shared.apply_async((1,), bidding={"strategy": path})
    finally:
        monkeypatch.delenv("BIDDING_ALLOWED_STRATEGIES")
        reset_settings(cluster.app)
    # when the nodes close the auction, then the one that awards refuses to import it, and
    # the caller learns why instead of waiting
    with pytest.raises(bidding.NoBidsError, match="not allowed here"):
        result.get(timeout=15)
    assert cluster.executions(result.id) == 0
    # (a registered name stays allowed everywhere)
    assert (
        shared.apply_async((2,), bidding={"strategy": "composite"}).get(timeout=15)["value"] == 2
    )


# -- the protocol checker over this module's real logs (last: it corrupts some of them) ------

Log = list[dict[str, Any]]


def bidding_check(cluster: Cluster) -> tuple[int, str, dict[str, Any]]:
    """``bidding check --database-url URL`` as an operator runs it: exit status, text, JSON."""

    def run(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "bidding.cli",
                "check",
                "--database-url",
                cluster.settings.database_url,
                *extra,
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    text, as_json = run(), run("--json")
    assert text.returncode == as_json.returncode, text.stdout + as_json.stdout
    return text.returncode, text.stdout + text.stderr, json.loads(as_json.stdout)


def relog(cluster: Cluster, task_id: str, edit: Callable[[Log], Log]) -> None:
    """Rewrite a task's log by hand, in SQL: ``edit`` gets its messages in log order and
    returns them as they shall be (dropped, changed, added or moved); they are written back
    with new ids in that order."""
    columns = (Message.kind, Message.node, Message.attempt, Message.detail, Message.at)
    with write_session(cluster.settings.database_url) as s:
        rows = [
            dict(r._mapping)
            for r in s.execute(
                select(*columns).where(Message.task_id == task_id).order_by(Message.id)
            )
        ]
        base = int(s.scalar(select(func.max(Message.id))) or 0) + 1000
        s.execute(delete(Message).where(Message.task_id == task_id))
        s.execute(
            insert(Message),
            [{**row, "id": base + i, "task_id": task_id} for i, row in enumerate(edit(rows))],
        )


def _first(log: Log, kind: str, node: str | None = None) -> dict[str, Any]:
    return next(m for m in log if m["kind"] == kind and (node is None or m["node"] == node))


def _winner(log: Log) -> str:
    return str(_first(log, "AWARDED")["node"])


def _loser(log: Log) -> dict[str, Any]:
    return next(m for m in log if m["kind"] == "BID" and m["node"] != _winner(log))


def _tail(log: Log, start: str) -> Log:
    at = next(i for i, m in enumerate(log) if m["kind"] == start)
    return log[at:]


#: rule -> how a real log of a task that three nodes bid on and that succeeded is broken.
CORRUPTIONS: dict[str, Callable[[Log], Log]] = {
    "announced_first": lambda log: [m for m in log if m["kind"] != "ANNOUNCED"],
    "known_kind": lambda log: [*log, {**log[-1], "kind": "HEARTBEAT"}],
    "attempt_numbers": lambda log: [
        {**m, "attempt": 2} if m["kind"] == "TASK_SUCCEEDED" else m for m in log
    ],
    "lifecycle": lambda log: [m for m in log if m["kind"] != "TASK_COMPLETED"],
    # a loser's bid (in time) moved after the award
    "bids_while_open": lambda log: [
        *[
            m
            for m in log
            if m is not _loser(log)
            and m["kind"] not in ("TASK_ACCEPTED", "TASK_COMPLETED", "TASK_SUCCEEDED")
        ],
        _loser(log),
        *_tail(log, "TASK_ACCEPTED"),
    ],
    "candidates_only": lambda log: [
        {**m, "node": "intruder"} if m is _loser(log) else m for m in log
    ],
    # the award written twice
    "one_award": lambda log: [
        *[
            m
            for m in log
            if m["kind"] not in ("TASK_ACCEPTED", "TASK_COMPLETED", "TASK_SUCCEEDED")
        ],
        _first(log, "AWARDED"),
        *_tail(log, "TASK_ACCEPTED"),
    ],
    "award_to_bidder": lambda log: [m for m in log if m is not _first(log, "BID", _winner(log))],
    "holder_only": lambda log: [
        {**m, "node": _loser(log)["node"]} if m["kind"] == "TASK_COMPLETED" else m for m in log
    ],
    # progress reported before the task was accepted
    "run_order": lambda log: [
        *[
            m
            for m in log
            if m["kind"] not in ("TASK_ACCEPTED", "TASK_COMPLETED", "TASK_SUCCEEDED")
        ],
        {**_first(log, "TASK_ACCEPTED"), "kind": "PROGRESS_UPDATE"},
        *_tail(log, "TASK_ACCEPTED"),
    ],
    "final_is_final": lambda log: [*log, _first(log, "TASK_ACCEPTED")],
}


def test_bidding_check_passes_real_logs_and_names_each_task_whose_log_was_corrupted(
    cluster: Cluster,
) -> None:
    # given the real auctions of this module (retries, refusals, silent rounds, proxy bids,
    # duplicate awards, no-bid failures...) and one task per rule that three nodes bid on
    tasks = [shared.delay(f"check-{rule}") for rule in CORRUPTIONS]
    for result in tasks:
        result.get(timeout=30)
    # when `bidding check` reads the store's log, then every task keeps the protocol
    status, text, verdict = bidding_check(cluster)
    assert status == 0, text
    assert verdict["ok"] and verdict["violations"] == [] and verdict["tasks"] >= len(tasks)
    assert "every one keeps the protocol" in text
    # when one task's log per rule is corrupted by hand with SQL
    broken = dict(zip(CORRUPTIONS, (r.id for r in tasks), strict=True))
    for rule, task_id in broken.items():
        relog(cluster, task_id, CORRUPTIONS[rule])
    # then it exits 1, printing each corrupted task with the rule it breaks, and no other task
    status, text, verdict = bidding_check(cluster)
    assert status == 1, text
    found = {(v["task_id"], v["rule"]) for v in verdict["violations"]}
    assert found == {(task_id, rule) for rule, task_id in broken.items()}, text
    for rule, task_id in broken.items():
        assert f"{task_id} {rule}: " in text, text


def test_the_sweeping_node_checkpoints_a_sqlite_stores_log(
    cluster: Cluster, tmp_path: Any,
) -> None:
    if cluster.backend != "sqlite":
        pytest.skip("a SQLite store's write-ahead log only")
    # given the cluster's nodes, one of them sweeping the federation
    # when ten tasks run to their end (their final states are in the store's log: no write
    # checkpoints before 10,000 pages of it, and these write a few hundred)
    results = [shared.delay(i) for i in range(10)]
    assert [r.get(timeout=30)["value"] for r in results] == list(range(10))
    ids = [r.id for r in results]
    # then within a few of the sweeper's passes the database file itself has them finished:
    # the sweeping node checkpointed the log
    assert wait_for(lambda: finished_in_the_database_file(
        cluster.settings.database_url, ids, tmp_path), timeout=10, interval=0.2)
