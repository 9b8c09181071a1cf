"""Holes a review of the auction and lifecycle code found (issue 15), each shown where it is
pure or needs only a store (SQLite and PostgreSQL, no broker): a re-award that publishes
outside the write lock, a fallback that keeps to capable nodes, timeouts on the board and the
judge, independent sweeper phases, a bid posted during the close, and the strategy allowlist.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select
from sqlalchemy.engine import make_url

from bidding.auction import reaward as reaward_module
from bidding.auction import sweeper
from bidding.auction import watchdog as watchdog_module
from bidding.auction.award import award_answers, strategy_of
from bidding.auction.board import RedisBoard, StoreBoard
from bidding.auction.decision import fallback_pool
from bidding.auction.reaward import LostWinner
from bidding.config import Settings, load_settings
from bidding.context import Context
from bidding.errors import ConfigurationError, UnknownStrategyError
from bidding.lifecycle import journal
from bidding.lifecycle import states as lifecycle
from bidding.models import Announcement, Bid
from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import LiveNode, invalidate_cache
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow, BidRow
from bidding.strategies import AgentJudgment, Judgment, resolve_strategy
from tests.stored import add_announcement
from tests.unit.test_execution import assigned, log

APP = Celery("t", broker="memory://", set_as_current=False)


def live(name: str, skills: list[str]) -> LiveNode:
    return LiveNode(name=name, capabilities=tuple(skills), capacity=4, price_per_unit=0.01,
                    latency_ms=50, trust=70, last_heartbeat=time.time())


def bid(announcement: Announcement, node: str, **fields: Any) -> Bid:
    values: dict[str, Any] = {
        "capability": 1.0,
        "experience": 0.5,
        "load": 1.0,
        "confidence": 0.9,
        "trust": 70,
        "skills": announcement.required_skills,
        "capacity": 4,
    }
    values.update(fields)
    return Bid(task_id=announcement.task_id, node=node, attempt=announcement.attempt, **values)


def bidding_row(settings: Settings, announcement: Announcement, candidates: list[str]) -> None:
    """``announcement``'s auction, open for bids, in the store."""
    add_announcement(settings.database_url, announcement, lifecycle.BIDDING, candidates)


def make_announcement(**fields: Any) -> Announcement:
    values: dict[str, Any] = {"required_skills": ["gpu"], **fields}
    return Announcement(task_id=str(uuid.uuid4()), task_name="t.work", task_type="work", **values)


# --- 3. a re-award publishes after its commit, and one failure does not stop the sweep -----


def test_a_reaward_is_sent_after_its_commit_and_a_failed_send_is_resent_later(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a task running on a node that died, and a live next-best bidder of its auction
    announcement = assigned(settings, node="dead")
    with write_session(settings.database_url) as session:
        session.add(
            BidRow(
                task_id=announcement.task_id,
                attempt=1,
                node="next",
                will_bid=True,
                score=0.5,
                breakdown={"eligible": True},
                payload={},
                bid_at=0.0,
            )
        )
        session.get(AnnouncementRow, announcement.task_id).state = lifecycle.EXECUTING  # type: ignore[union-attr]
    heartbeat(settings, NodeProfile(name="next", capabilities=["s1"]))
    heartbeat(settings, NodeProfile(name="dead", capabilities=["s1"]), now=time.time() - 3600)
    invalidate_cache()
    # and a broker that is down; while it is being tried, the store must be writable
    writable: list[bool] = []

    def broker_down(app: Any, rfp_: Any, node: str, settings_: Any = None) -> None:
        writable.append(_store_is_writable(settings))
        raise ConnectionError("broker down")

    monkeypatch.setattr(reaward_module, "send_execution", broker_down)
    # when the watchdog runs
    moved, _ = watchdog_module.check_winners(Context(settings, APP))
    # then the move to the next-best bidder is committed, and the send was tried outside the
    # write transaction
    assert moved == 1 and writable == [True]
    with read_session(settings.database_url) as session:
        found = session.get(AnnouncementRow, announcement.task_id)
        assert found is not None
        assert (found.state, found.assigned_node) == (lifecycle.ASSIGNED, "next")
    # and the failed send is logged against the new winner, due for a resend
    kinds = [(k, n) for k, n, _, _ in log(settings, announcement.task_id)]
    assert kinds[-2:] == [(journal.REAWARDED, "next"), (journal.SEND_FAILED, "next")]


def _store_is_writable(settings: Settings) -> bool:
    """Whether another connection can take the store's write lock now."""
    url = make_url(settings.database_url)
    if url.get_backend_name() != "sqlite":
        return True  # PostgreSQL's row locks do not stop other tasks' writes
    conn = sqlite3.connect(url.database or "", timeout=0)
    try:
        conn.isolation_level = None
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        conn.close()


def test_one_lost_task_that_cannot_be_handled_does_not_stop_the_others(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given two tasks on a dead node, the first of which fails to be re-placed
    first, second = assigned(settings, node="dead"), assigned(settings, node="dead")
    heartbeat(settings, NodeProfile(name="dead", capabilities=["s1"]), now=time.time() - 3600)
    real = watchdog_module.replace_winner

    def flaky_replace(ctx: Context, lost: LostWinner, *args: Any, **kwargs: Any) -> bool:
        if lost.announcement.task_id == first.task_id:
            raise ConnectionError("store hiccup")
        return real(ctx, lost, *args, **kwargs)

    monkeypatch.setattr(watchdog_module, "replace_winner", flaky_replace)
    # when the watchdog runs
    moved, _ = watchdog_module.check_winners(Context(settings, APP))
    # then the second task was still re-placed, and the failure is in the log
    assert moved == 1
    with read_session(settings.database_url) as session:
        assert session.get(AnnouncementRow, second.task_id).state == lifecycle.RETRYING  # type: ignore[union-attr]
    assert f"(task {first.task_id}: ConnectionError: store hiccup)" in caplog.text


# --- 4. the fallback keeps to capable nodes that are not excluded ------------------------


def test_the_fallback_pool_has_the_required_skills_and_no_excluded_node() -> None:
    nodes = [live("cpu", ["shared"]), live("gpu1", ["shared", "gpu"]), live("gpu2", ["gpu"])]
    assert [n.name for n in fallback_pool(make_announcement(), nodes)] == ["gpu1", "gpu2"]
    excluded = make_announcement(exclude_nodes=["gpu1"])
    assert [n.name for n in fallback_pool(excluded, nodes)] == ["gpu2"]
    assert fallback_pool(make_announcement(exclude_nodes=["gpu1", "gpu2"]), nodes) == []


def test_a_gpu_task_without_a_gpu_bid_falls_back_to_a_gpu_node_or_fails_clearly(
    settings: Settings,
) -> None:
    # given live nodes with and without a GPU, and a GPU task nobody bid on in time
    heartbeat(settings, NodeProfile(name="cpu", capabilities=["shared"]))
    heartbeat(settings, NodeProfile(name="gpu", capabilities=["gpu"]))
    invalidate_cache()
    announcement = make_announcement(no_bid="fallback")
    bidding_row(settings, announcement, ["gpu"])
    # when the auction closes with no answers
    won = award_answers(settings, announcement, [], closed_by="deadline", candidates=1, write=True)
    # then seed 000's fallback gives it to the GPU node, never to the CPU one
    assert won is not None and (won.outcome, won.winner) == ("fallback", "gpu")
    # and with the GPU node excluded (it failed the task), the task fails, saying why
    again = make_announcement(no_bid="fallback", exclude_nodes=["gpu"])
    bidding_row(settings, again, ["gpu"])
    lost = award_answers(settings, again, [], closed_by="deadline", candidates=1, write=True)
    assert lost is not None and lost.winner is None
    assert "no live node with gpu to fall back to" in (lost.error or "")


# --- 5. timeouts on the paths every auction depends on -----------------------------------


def test_the_redis_boards_calls_time_out() -> None:
    board = RedisBoard("redis://127.0.0.1:1/0")
    kwargs = board.client.connection_pool.connection_kwargs
    assert kwargs["socket_timeout"] == kwargs["socket_connect_timeout"] == 5.0
    assert board.blocking.connection_pool.connection_kwargs["socket_timeout"] == 10.0


def test_a_judge_that_does_not_answer_in_time_leaves_the_decision_to_the_fallback() -> None:
    # given a judge that hangs, with a 0.2 s timeout
    release = threading.Event()

    def hangs(*_: Any) -> Judgment:
        release.wait(10)
        return Judgment(selected_agent_id="slow")

    announcement = make_announcement()
    bids = [bid(announcement, "a", confidence=0.6), bid(announcement, "b", confidence=0.9)]
    strategy = AgentJudgment(judge=hangs, timeout=0.2)
    # when it is asked
    started = time.monotonic()
    chosen = strategy.select(bids, announcement, {})
    release.set()
    # then the fallback (WeightedScore) decided within about the timeout, and says why
    assert chosen is not None and chosen.node == "b"
    assert time.monotonic() - started < 2
    assert "did not answer within 0.2s" in strategy.last_reasoning


def test_a_blocked_sweeper_phase_does_not_stop_the_others(
    store_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a deadline closer stuck on a dead connection
    settings = load_settings(
        {"bidding_database_url": store_url, "bidding_sweep_interval": 0.05}, environ={}
    )
    stuck, ran = threading.Event(), threading.Event()
    monkeypatch.setattr(sweeper, "close_expired", lambda *_: stuck.wait(10))
    monkeypatch.setattr(sweeper, "announce_due", lambda *_: 0)
    monkeypatch.setattr(sweeper, "check_winners", lambda *_: (ran.set(), (0, 1))[1])
    node_sweeper = sweeper.Sweeper(settings, APP)
    # when the node's sweeper runs
    node_sweeper.start()
    try:
        # then the watchdog still runs while the closer is blocked
        assert ran.wait(2)
    finally:
        stuck.set()
        node_sweeper.stop()


# --- 6. a bid posted on the store board while the auction closes ---------------------------


def test_a_bid_posted_after_the_close_read_the_board_is_late(settings: Settings) -> None:
    # given an auction on the store board with two candidates; a answered in time
    announcement = make_announcement(required_skills=["s1"])
    bidding_row(settings, announcement, ["a", "b"])
    board = StoreBoard(settings.database_url)
    board.post(bid(announcement, "a", confidence=0.6), expected=2, window=announcement.window)
    # when the close reads the board, b's bid is posted, and then the award is committed
    answers = board.close(announcement.task_id, announcement.attempt)
    board.post(bid(announcement, "b", confidence=0.99), expected=2, window=announcement.window)
    won = award_answers(
        settings, announcement, answers, closed_by="deadline", candidates=2, write=False
    )
    # then a won, and b's bid, which the decision never saw, is marked late
    assert won is not None and won.winner == "a"
    with read_session(settings.database_url) as session:
        rows = {
            r.node: r
            for r in session.scalars(select(BidRow).where(BidRow.task_id == announcement.task_id))
        }
    assert rows["b"].late is True and rows["b"].score is None
    assert rows["a"].late is False and rows["a"].is_winner is True


# --- 7. strategy names from messages are resolved against an allowlist ---------------------


def test_a_dotted_strategy_path_must_be_allowed() -> None:
    path = "bidding.strategies.builtins:Composite"
    with pytest.raises(UnknownStrategyError, match="not allowed here"):
        resolve_strategy(path, allowed=frozenset())
    assert resolve_strategy(path, allowed=frozenset({path})).__class__.__name__ == "Composite"
    # registered names are always allowed
    assert resolve_strategy("composite", allowed=frozenset()).__class__.__name__ == "Composite"


def test_a_node_refuses_a_strategy_it_does_not_allow_and_the_award_says_why(
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given an announcement (from a message) naming a module the node does not allow
    announcement = make_announcement(strategy="os.path:join", required_skills=["s1"])
    # when the node resolves it, then it refuses, without importing, and logs why
    refused = strategy_of(settings, announcement)
    assert refused.select([bid(announcement, "a")], announcement, {}) is None
    assert "strategy refused" in caplog.text
    # and an award under it fails with the reason
    bidding_row(settings, announcement, ["a"])
    lost = award_answers(
        settings,
        announcement,
        [bid(announcement, "a")],
        closed_by="all bids in",
        candidates=1,
        write=True,
    )
    assert lost is not None and lost.winner is None
    assert "not allowed here" in (lost.error or "")


def test_the_caller_refuses_a_strategy_path_not_allowed_at_apply_async(store_url: str) -> None:
    from bidding.auction.announcement import build_announcement

    class Task:
        name = "t.work"
        task_type = "work"
        required_skills = ["s1"]

    settings = load_settings({"bidding_database_url": store_url}, environ={})
    with pytest.raises(ConfigurationError, match="bidding_allowed_strategies"):
        build_announcement(Task(), settings, [], {}, {"strategy": "os.path:join"})  # type: ignore[arg-type]
    allowed = load_settings(
        {"bidding_database_url": store_url},
        environ={"BIDDING_ALLOWED_STRATEGIES": "bidding.strategies.builtins:Composite"},
    )
    announcement = build_announcement(
        Task(),
        allowed,
        [],
        {},  # type: ignore[arg-type]
        {"strategy": "bidding.strategies.builtins:Composite"},
    )
    assert announcement.strategy == "bidding.strategies.builtins:Composite"
