"""A replica's bid: its confidence from its whole record on the task type (``nodes.records``),
smoothed toward its kin's rate there, while its latest episodes agree with that record
(``scores.informed_confidence``, ``scores.window_agrees``); the announcer's and the node's
bids read the record from the store. A node without kin bids from its latest episodes."""

from __future__ import annotations

import pytest
from sqlalchemy.exc import OperationalError

from bidding.auction import scores
from bidding.auction.bid import NodeHistory, compute_bid
from bidding.auction.history import place_bid
from bidding.auction.proxy import answers_inside, proxy_answers
from bidding.config import Settings
from bidding.execution.episodes import record_attempt
from bidding.models import Announcement, Bid
from bidding.nodes import records
from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import live_nodes
from bidding.store import write_session

ANNOUNCEMENT = Announcement(task_id="t", task_name="w", task_type="extract",
                            required_skills=["x"])


def confidence(history: NodeHistory, name: str = "a-1") -> float:
    bid = compute_bid(ANNOUNCEMENT, NodeProfile(name=name, capabilities=["x"]), history,
                      now=0.0)
    assert isinstance(bid, Bid)
    return bid.confidence


def test_replicas_with_the_same_latest_episodes_are_told_apart_by_their_whole_records() -> None:
    # given two replicas whose kin ran the type 100 times with 90 successes, and whose latest
    # 30 episodes of it are the same (one failure)
    latest = (True,) * 9 + (False,)
    earlier = (True,) * 20
    kin = (100, 90)
    # when one has succeeded 290 times in 300 there and the other 270 times
    better = confidence(NodeHistory(outcomes=latest, earlier=earlier, kin=kin,
                                    record=(300, 290)))
    worse = confidence(NodeHistory(outcomes=latest, earlier=earlier, kin=kin,
                                   record=(300, 270)))
    # then each bids its record smoothed toward the kin's rate, worth their 80 episodes at most
    kin_rate = scores.kin_prior(*kin)
    assert better == pytest.approx((290 + 80 * kin_rate) / 380)
    assert worse == pytest.approx((270 + 80 * kin_rate) / 380)
    assert better > worse


def test_a_replica_that_starts_failing_is_judged_on_its_latest_episodes_at_once() -> None:
    # given a replica whose record on the type is 290 successes in 300 (its kin's: 90 in 100)
    record, kin = (300, 290), (100, 90)
    # when seven of its latest ten fail (under that record, a chance under 1 in 10^7)
    latest = (False,) * 7 + (True,) * 3
    assert not scores.window_agrees(latest, 290 / 300)
    history = NodeHistory(outcomes=latest, earlier=(True,) * 20, kin=kin, record=record)
    # then its confidence is the estimate over its latest episodes, as without a record
    assert confidence(history) == pytest.approx(scores.windowed_confidence(
        latest, kin, ANNOUNCEMENT.min_confidence, (True,) * 20))
    assert confidence(history) < 0.7


def test_a_replica_that_recovered_is_judged_on_its_latest_episodes_too() -> None:
    # given a replica that failed 180 of its 300 tasks of the type (its kin: 60 of 100), then
    # succeeded ten in a row (a chance of about 1 in 10,000 at its record's rate)
    latest, kin = (True,) * 10, (100, 40)
    assert not scores.window_agrees(latest, (120 + 80 * scores.kin_prior(*kin)) / 380)
    history = NodeHistory(outcomes=latest, earlier=(True,) * 20, kin=kin, record=(300, 120))
    # then its record is set aside for its latest episodes
    assert confidence(history) == pytest.approx(scores.windowed_confidence(
        latest, kin, ANNOUNCEMENT.min_confidence, (True,) * 20))


def test_the_window_agrees_with_a_record_it_could_come_from() -> None:
    # given a record's rate of 0.9: one failure in ten agrees, as do none, and no episode
    assert scores.window_agrees((True,) * 9 + (False,), 0.9)
    assert scores.window_agrees((True,) * 10, 0.9)
    assert scores.window_agrees((), 0.9)
    # and so do five failures in ten (a chance of 1 in 600: the record is set aside only
    # under 1 in 1,000)
    assert scores.window_agrees((True,) * 5 + (False,) * 5, 0.9)
    # but six failures in ten do not (1 in 7,000)
    assert not scores.window_agrees((True,) * 4 + (False,) * 6, 0.9)


def test_a_record_shorter_than_the_episodes_read_counts_as_those_episodes() -> None:
    # given a node with kin whose record was not read (none) or is older than its episodes
    latest, earlier, kin = (True,) * 10, (True,) * 5 + (False,) * 5, (40, 36)
    expected = (15 + 40 * scores.kin_prior(*kin)) / (20 + 40)
    # then its episodes read are its record
    assert confidence(NodeHistory(outcomes=latest, earlier=earlier, kin=kin)) == pytest.approx(
        expected)
    assert confidence(NodeHistory(outcomes=latest, earlier=earlier, kin=kin,
                                  record=(12, 11))) == pytest.approx(expected)


def test_a_node_without_kin_bids_from_its_latest_episodes_whatever_its_record() -> None:
    # given a lone node (no replica of its profile has a record on the type) with a long record
    latest, earlier = (True,) * 10, (True,) * 20
    history = NodeHistory(outcomes=latest, earlier=earlier, record=(300, 150))
    # then its confidence is the windowed estimate: its record is not read into it (at 8
    # nodes, a lone node's steady whole record queued work at the best nodes at 90% load)
    assert confidence(history) == pytest.approx(
        scores.windowed_confidence(latest, (0, 0), ANNOUNCEMENT.min_confidence, earlier))


def _replicas_with_episodes(settings: Settings) -> NodeProfile:
    """Two replicas of one profile: north-1 with 40 episodes of the type (10 failures, then
    30 successes: the latest 30, the episodes a bid reads, all succeeded), north-2 with 20
    (18 successes). Returns north-1's profile."""
    profiles = [NodeProfile(name=f"north-{i}", capabilities=["x"]) for i in (1, 2)]
    for profile in profiles:
        heartbeat(settings, profile)
    runs = [("north-1", i, i >= 10) for i in range(40)] + [
        ("north-2", i, i >= 2) for i in range(20)]
    with write_session(settings.database_url) as session:
        for node, i, ok in runs:
            record_attempt(session, None, {
                "task_id": f"{node}-t{i}", "attempt": 1, "node": node, "task_type": "extract",
                "skills": ["x"], "success": ok, "duration_s": 1.0, "cost": 0.0,
                "finished_at": 1000.0 + i})
    return profiles[0]


#: north-1's confidence: its whole record, 30 of 40, smoothed toward its kin's rate (north-2's
#: 18 of 20, smoothed as a newcomer's), worth their 20 episodes; its latest ten agree with it.
WHOLE = (30 + 20 * (18 + 2) / (20 + 2)) / (40 + 20)


def test_a_replicas_own_bid_reads_its_whole_record_from_the_store(settings: Settings) -> None:
    # given two replicas with episodes of the type
    profile = _replicas_with_episodes(settings)
    # when north-1 bids on the type
    bid = place_bid(settings, ANNOUNCEMENT, profile)
    # then its confidence is its whole record's, not the 30 episodes' it read
    assert isinstance(bid, Bid)
    assert bid.confidence == pytest.approx(WHOLE)


def test_the_announcers_bids_for_a_replica_read_its_whole_record_too(settings: Settings) -> None:
    # given the same replicas
    _replicas_with_episodes(settings)
    live = [node for node in live_nodes(settings) if node.name == "north-1"]
    # when an announcer bids for north-1, before an award and in the award's transaction
    before = proxy_answers(settings, ANNOUNCEMENT, live)
    inside = answers_inside(settings, ANNOUNCEMENT, live)
    with write_session(settings.database_url) as session:
        made = inside.make(session, {})
    # then both bids are its whole record's, as its own is
    for answer in (*before, *made):
        assert isinstance(answer, Bid)
        assert answer.confidence == pytest.approx(WHOLE)


def test_a_replica_whose_records_cannot_be_read_bids_from_the_episodes_it_read(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # given the same replicas, and the store failing every read of the nodes' records (a
    # dropped connection on that statement)
    profile = _replicas_with_episodes(settings)

    def dropped(*args: object) -> dict[str, tuple[int, int]]:
        raise OperationalError("SELECT ... bidding_node_records", {}, Exception("gone"))

    monkeypatch.setattr(records, "read_records", dropped)
    records.invalidate_cache()
    # when north-1 bids on the type
    bid = place_bid(settings, ANNOUNCEMENT, profile)
    # then it still bids, from the 30 episodes it read (all successes), without its kin's
    # record (read with the records): the two-speed estimate of a node without kin
    assert isinstance(bid, Bid)
    assert bid.confidence == pytest.approx(scores.windowed_confidence(
        (True,) * 10, (0, 0), ANNOUNCEMENT.min_confidence, (True,) * 20))
