"""Unit tests of bidding.bid: a node's bid from its profile and history.

``compute_bid`` is pure. ``gather_history`` reads a real SQLite store in tmp_path (no broker).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.orm import Session

from bidding.auction import scores as scoring
from bidding.auction.bid import NodeHistory, compute_bid, refusal_reason
from bidding.auction.history import cached_history, forget_history, gather_history
from bidding.config import Settings, load_settings
from bidding.execution.episodes import count_episode
from bidding.lifecycle import states as lifecycle
from bidding.models import Announcement, Bid, Refusal
from bidding.nodes.profile import NodeProfile
from bidding.store import write_session
from bidding.store.schema import AnnouncementRow, Episode, Node

NOW = 10_000.0

# --- helpers -------------------------------------------------------------------------------


def make_rfp(**fields: Any) -> Announcement:
    values: dict[str, Any] = {"task_id": "t-1", "task_name": "demo.work", "task_type": "analysis"}
    values.update(fields)
    return Announcement(**values)


REDFIN = NodeProfile(name="redfin", capabilities=["gpu", "nlp"], capacity=4,
                     price_per_unit=0.02, latency_ms=40, trust=70)


def bid_of(announcement: Announcement, history: NodeHistory | None = None,
           profile: NodeProfile = REDFIN) -> Bid:
    answer = compute_bid(announcement, profile, history or NodeHistory(), now=NOW)
    assert isinstance(answer, Bid), answer
    return answer


def store_settings(url: str, **conf: Any) -> Settings:
    values = {"bidding_database_url": url, **{f"bidding_{k}": v for k, v in conf.items()}}
    return load_settings(values, environ={})


def episode(task_id: str, node: str, task_type: str, success: bool, finished_at: float,
            attempt: int = 1) -> Episode:
    return Episode(task_id=task_id, attempt=attempt, node=node, task_type=task_type,
                   success=success, finished_at=finished_at)


def record(session: Session, episodes: list[Episode]) -> None:
    """Store episodes as a node's worker does: each one also counts in its node's record."""
    for name in sorted({e.node for e in episodes}):
        if session.get(Node, name) is None:
            session.add(Node(name=name))
    session.flush()
    for e in episodes:
        session.add(e)
        count_episode(session, e.node, bool(e.success))


def announcement_row(task_id: str, state: str, node: str | None) -> AnnouncementRow:
    return AnnouncementRow(task_id=task_id, task_name="demo.work", task_type="extraction",
                           strategy="weighted", state=state, assigned_node=node,
                           announced_at=NOW - 5, closes_at=NOW - 3)


# --- compute_bid: refusals -----------------------------------------------------------------


def test_refuses_when_no_required_skill_matches():
    # given a task needing skills redfin does not have
    announcement = make_rfp(required_skills=["quantum", "sql"], attempt=2)
    # when redfin answers
    answer = compute_bid(announcement, REDFIN, NodeHistory(), now=NOW)
    # then it refuses, naming the needed skills and its own
    assert isinstance(answer, Refusal)
    assert answer.reason == "no matching capability: task needs quantum, sql; node has gpu, nlp"
    assert (answer.task_id, answer.node, answer.attempt, answer.bid_at) == ("t-1", "redfin",
                                                                            2, NOW)


def test_one_matching_skill_is_enough_to_bid():
    # given a task needing gpu and sql; redfin has gpu only
    answer = compute_bid(make_rfp(required_skills=["gpu", "sql"]), REDFIN, NodeHistory(), now=NOW)
    # then it bids with capability 1/2
    assert isinstance(answer, Bid)
    assert answer.capability == 0.5


def test_refuses_when_the_deadline_has_passed():
    # given a task whose deadline was one second ago
    announcement = make_rfp(required_skills=["gpu"], deadline=NOW - 1)
    # when redfin answers
    answer = compute_bid(announcement, REDFIN, NodeHistory(), now=NOW)
    # then it refuses
    assert isinstance(answer, Refusal)
    assert answer.reason == "deadline passed"


def test_bids_up_to_the_deadline():
    # given a task whose deadline is now, or later
    # then the node still bids
    assert isinstance(compute_bid(make_rfp(deadline=NOW), REDFIN, NodeHistory(), now=NOW), Bid)
    assert refusal_reason(make_rfp(deadline=NOW + 60), REDFIN, NOW) is None


# --- compute_bid: the bid's numbers --------------------------------------------------------


def test_bid_numbers_come_from_scoring():
    # given a history of 3 successes out of 4 (newest first), 3 of 4 slots busy, 10 of 10
    # episodes succeeded overall, and a task of 5 units needing gpu
    history = NodeHistory(outcomes=(True, True, False, True), recent_failures=1, in_flight=3,
                          attempts=10, successes=10)
    announcement = make_rfp(required_skills=["gpu"], units=5, content="short task")
    # when redfin bids
    bid = bid_of(announcement, history)
    # then every number is the one bidding.scoring computes
    assert bid.capability == 1.0
    assert bid.experience == 0.75
    assert bid.load == 0.25
    # confidence: 3 of 4 successes smoothed toward the node's longer record, worth 10
    # episodes; that record (here the same four, none earlier) is itself smoothed toward an
    # optimistic prior worth 2: (3 + 2) / (4 + 2) = 5/6, so (3 + 10 * 5/6) / (4 + 10);
    # seed 000's content heuristic rides along in the metadata
    assert bid.confidence == pytest.approx((3 + 10 * 5 / 6) / 14)
    longer = scoring.estimated_success(history.outcomes)
    assert bid.confidence == pytest.approx(
        scoring.estimated_success(history.outcomes, prior=longer, weight=10))
    assert bid.metadata["content_confidence"] == 0.9
    assert bid.cost == pytest.approx(0.1)
    assert bid.latency_ms == 40.0
    assert bid.trust == 85.0  # (70 * 10 + 100 * 10) / (10 + 10)
    assert bid.experience == scoring.experience_score(history.outcomes)
    assert bid.load == scoring.load_score(3, 4)
    assert bid.cost == scoring.estimated_cost(0.02, 5)
    assert bid.trust == scoring.learned_trust(70, 10, 10)
    # and the bid carries the inputs the strategies and the award use
    assert bid.recent_failures == 1
    assert bid.in_flight == 3
    assert bid.capacity == 4
    assert bid.skills == ["gpu", "nlp"]
    assert (bid.task_id, bid.node, bid.attempt, bid.bid_at) == ("t-1", "redfin", 1, NOW)
    assert bid.is_preferred_node is False
    assert bid.proposal == (
        "redfin offers gpu at 0.1000 for 5 unit(s), ~40 ms latency, 3/4 busy"
    )


def test_bid_without_history_uses_the_seed_defaults():
    # given a node with no episodes and no work, and a task without required skills
    bid = bid_of(make_rfp())
    # then experience is 0.3, load 1.0, capability 0.8, trust the declared 70
    assert bid.experience == 0.3
    assert bid.load == 1.0
    assert bid.capability == 0.8
    assert bid.trust == 70.0
    assert bid.proposal.startswith("redfin offers general capacity at 0.0200 for 1 unit(s)")


def test_content_length_is_reported_but_confidence_comes_from_the_record():
    # given tasks of 600 and 2500 characters and no history
    short, long = bid_of(make_rfp(content="x" * 600)), bid_of(make_rfp(content="x" * 2500))
    # then seed 000's content heuristic (0.7, 0.5) is in the bid's metadata ...
    assert short.metadata["content_confidence"] == 0.7
    assert long.metadata["content_confidence"] == 0.5
    # ... and the confidence is the optimistic estimate of a node with no record
    assert short.confidence == long.confidence == 1.0


def test_preferred_node_flag():
    # given a task preferring redfin, and one preferring another node
    # then only the first bid is flagged preferred
    assert bid_of(make_rfp(preferred_node="redfin")).is_preferred_node is True
    assert bid_of(make_rfp(preferred_node="bluefin")).is_preferred_node is False


def test_full_node_load_is_floored():
    # given a node with more work in flight than its capacity
    bid = bid_of(make_rfp(), NodeHistory(in_flight=9))
    # then its load is seed 000's floor 0.1, and the proposal says 9/4 busy
    assert bid.load == 0.1
    assert bid.proposal.endswith("9/4 busy")


def test_learned_trust_falls_with_failures():
    # given 10 attempts of which 2 succeeded, from a declared trust of 70
    bid = bid_of(make_rfp(), NodeHistory(attempts=10, successes=2))
    # then trust is (700 + 200) / 20
    assert bid.trust == 45.0


# --- gather_history ------------------------------------------------------------------------


def test_history_of_a_node_without_records_is_empty(store_url):
    # given an empty store
    # when redfin's history is gathered
    history = gather_history(store_settings(store_url), "redfin", "extraction", now=NOW)
    # then it is the empty history
    assert history == NodeHistory()


def test_history_reads_episodes_and_in_flight_work(store_url):
    # given redfin's episodes of "extraction" (inserted out of order), of another task type,
    # another node's episode, and announcements in every state
    with write_session(store_url) as session:
        record(session, [
            episode("e3", "redfin", "extraction", False, NOW - 200),  # not recent (> 100 s)
            episode("e1", "redfin", "extraction", False, NOW - 10),  # newest, recent
            episode("e4", "redfin", "extraction", True, NOW - 1000),  # beyond the window of 3
            episode("e2", "redfin", "extraction", True, NOW - 50),
            episode("o1", "redfin", "summary", False, NOW - 5),
            episode("o2", "redfin", "summary", True, NOW - 3000),
            episode("o3", "redfin", "summary", True, NOW - 4000),
            episode("x1", "bluefin", "extraction", False, NOW - 1),
            episode("x2", "bluefin", "extraction", True, NOW - 2),
        ])
        session.add_all([
            announcement_row("a1", lifecycle.ASSIGNED, "redfin"),
            announcement_row("a2", lifecycle.EXECUTING, "redfin"),
            announcement_row("a3", lifecycle.EXECUTING, "redfin"),
            announcement_row("a4", lifecycle.SUCCESS, "redfin"),
            announcement_row("a5", lifecycle.FAILED, "redfin"),
            announcement_row("a6", lifecycle.BIDDING, None),
            announcement_row("a7", lifecycle.PENDING, None),
            announcement_row("a8", lifecycle.ASSIGNED, "bluefin"),
        ])
    settings = store_settings(store_url, experience_window=3, recent_failure_seconds=100)
    # when redfin's history for "extraction" is gathered
    history = gather_history(settings, "redfin", "extraction", now=NOW)
    # then the outcomes are its latest 3 extraction episodes, newest first
    assert history.outcomes == (False, True, False)
    # and only the failure within the last 100 s is recent
    assert history.recent_failures == 1
    # and only its ASSIGNED and EXECUTING tasks are in flight
    assert history.in_flight == 3
    # and trust counts all its episodes, of every task type (4 of 7 succeeded)
    assert history.attempts == 7
    assert history.successes == 4


def test_history_window_limits_outcomes(store_url):
    # given 12 alternating episodes and the default experience window of 10
    with write_session(store_url) as session:
        record(session, [episode(f"e{i}", "redfin", "extraction", i % 2 == 0, NOW - i)
                         for i in range(12)])
    history = gather_history(store_settings(store_url), "redfin", "extraction", now=NOW)
    # then the 10 newest are used, newest (i = 0, a success) first
    assert history.outcomes == (True, False) * 5
    # and trust still counts all 12
    assert (history.attempts, history.successes) == (12, 6)


def test_recent_failure_cutoff_is_inclusive(store_url):
    # given failures exactly 100 s old and 100.5 s old, with a 100 s recency
    with write_session(store_url) as session:
        record(session, [episode("e1", "redfin", "extraction", False, NOW - 100),
                         episode("e2", "redfin", "extraction", False, NOW - 100.5)])
    settings = store_settings(store_url, recent_failure_seconds=100)
    # when the history is gathered
    history = gather_history(settings, "redfin", "extraction", now=NOW)
    # then the one at the cutoff counts, the older one does not
    assert history.recent_failures == 1
    assert history.outcomes == (False, False)


def test_recent_failures_are_not_limited_by_the_experience_window(store_url):
    # given 3 failures in the last minute and an experience window of 2
    with write_session(store_url) as session:
        record(session, [episode(f"e{i}", "redfin", "extraction", False, NOW - 10 * i)
                         for i in range(1, 4)])
    settings = store_settings(store_url, experience_window=2, recent_failure_seconds=3600)
    # when the history is gathered
    history = gather_history(settings, "redfin", "extraction", now=NOW)
    # then all 3 are recent failures (NodeHistory: "failures within recent_failure_seconds"),
    # which is what triggers seed 000's x0.8 penalty (more than 2)
    assert history.recent_failures == 3


def test_gathered_history_feeds_the_bid(store_url):
    # given 2 successes of 2 for redfin and one task in flight
    with write_session(store_url) as session:
        record(session, [episode("e1", "redfin", "extraction", True, NOW - 10),
                         episode("e2", "redfin", "extraction", True, NOW - 20)])
        session.add(announcement_row("a1", lifecycle.EXECUTING, "redfin"))
    history = gather_history(store_settings(store_url), "redfin", "extraction", now=NOW)
    # when redfin bids on an extraction task
    bid = bid_of(make_rfp(task_type="extraction"), history)
    # then experience 1.0, load 3/4, trust (700 + 200) / 12
    assert bid.experience == 1.0
    assert bid.load == 0.75
    assert bid.in_flight == 1
    assert bid.trust == pytest.approx(75.0)


# --- cached_history ------------------------------------------------------------------------


def test_a_cached_history_is_reused_while_the_nodes_version_holds(store_url):
    forget_history()
    settings = store_settings(store_url, history_cache_seconds=60)
    # given redfin's history read at history version 3
    first = cached_history(settings, "redfin", "extraction", NOW, version=3)
    # when it finishes an attempt that the store records
    with write_session(store_url) as session:
        record(session, [episode("n1", "redfin", "extraction", False, NOW - 1)])
    # then a bid at the same version reuses the cached record ...
    assert cached_history(settings, "redfin", "extraction", NOW, version=3) == first
    # ... and a bid at the next version (the attempt raised it) reads the failure
    assert cached_history(settings, "redfin", "extraction", NOW, version=4).outcomes == (False,)


def test_without_a_version_the_history_is_read_every_time(store_url):
    forget_history()
    settings = store_settings(store_url)
    # given a history read without a version (the store board, e.g. on RabbitMQ)
    assert cached_history(settings, "redfin", "extraction", NOW).outcomes == ()
    with write_session(store_url) as session:
        record(session, [episode("n1", "redfin", "extraction", True, NOW - 1)])
    # then the next bid sees the new episode at once
    assert cached_history(settings, "redfin", "extraction", NOW).outcomes == (True,)


def test_the_history_cache_stays_within_its_bound_and_still_answers_right(
        store_url, monkeypatch):
    # given a cache bounded to 64 entries, and bids on 500 distinct task types (callers choose
    # task types: nothing else bounds how many a node sees)
    from bidding.auction import history

    forget_history()
    monkeypatch.setattr(history, "HISTORY_CACHE_LIMIT", 64)
    settings = store_settings(store_url, history_cache_seconds=60)
    with write_session(store_url) as session:
        record(session, [episode("old", "redfin", "type-0", True, NOW - 5)])
    first = cached_history(settings, "redfin", "type-0", NOW, version=1)
    assert first.outcomes == (True,)
    for n in range(1, 500):
        cached_history(settings, "redfin", f"type-{n}", NOW, version=1)
    # then the cache holds at most its bound
    assert history.history_cache_size() <= 64
    # and an evicted entry is read again, correctly (here: with the episode since recorded)
    with write_session(store_url) as session:
        record(session, [episode("new", "redfin", "type-0", False, NOW - 1)])
    assert cached_history(settings, "redfin", "type-0", NOW, version=1).outcomes == (
        False, True)
    # and a recent one is still served from the cache while its version holds
    with write_session(store_url) as session:
        record(session, [episode("newer", "redfin", "type-499", False, NOW - 1)])
    assert cached_history(settings, "redfin", "type-499", NOW, version=1).outcomes == ()
    forget_history()
