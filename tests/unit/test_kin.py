"""A node's kin (the live nodes that declare its profile but for the name) and their pooled
record on a task type, the prior of its confidence there (``nodes.kin``, ``scores.kin_prior``)."""

from __future__ import annotations

import dataclasses

import pytest

from bidding.auction import scores
from bidding.auction.bid import NodeHistory, compute_bid
from bidding.models import Announcement, Bid
from bidding.nodes.kin import KinRecord, kin_of, kin_pools, pooled
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import LiveNode

BASE = LiveNode(name="a-1", capabilities=("x", "y"), capacity=4, price_per_unit=0.01,
                latency_ms=50, trust=70, last_heartbeat=0.0, resources={"gpu_mem_gb": 16})


def test_kin_declare_the_same_profile_but_for_the_name_and_what_they_hold_warm() -> None:
    # given replicas of one profile (one holds a model warm, one lists its skills in another
    # order), and nodes that differ in one declared field each
    live = [
        BASE,
        dataclasses.replace(BASE, name="a-2", warm=("model:m",)),
        dataclasses.replace(BASE, name="a-3", capabilities=("y", "x")),
        dataclasses.replace(BASE, name="cheaper", price_per_unit=0.005),
        dataclasses.replace(BASE, name="bigger", resources={"gpu_mem_gb": 48}),
        dataclasses.replace(BASE, name="own-bidder", bidder="pkg.mod:judge"),
    ]
    # when each one's kin are found
    kin = kin_of(live, [n.name for n in live])
    # then the replicas are each other's kin, and the others have none
    assert kin == {"a-1": ["a-2", "a-3"], "a-2": ["a-1", "a-3"], "a-3": ["a-1", "a-2"]}
    # and their records on a type are summed
    assert pooled({"a-2": (10, 2), "a-3": (5, 1), "cheaper": (9, 9)}, kin["a-1"]) == (15, 3)


def test_each_nodes_kin_records_are_pooled_without_its_own() -> None:
    # given three replicas of one profile with records on a type and node-wide, and a node of
    # another profile
    live = [
        dataclasses.replace(BASE, attempts=100, successes=90),
        dataclasses.replace(BASE, name="a-2", attempts=50, successes=40),
        dataclasses.replace(BASE, name="a-3"),
        dataclasses.replace(BASE, name="cheaper", price_per_unit=0.005, attempts=9,
                            successes=9),
    ]
    on_type = {"a-1": (10, 9), "a-2": (4, 2), "cheaper": (9, 9)}
    # when their kin's records are pooled for all of them
    pools = kin_pools(live, [n.name for n in live], on_type)
    # then each replica gets the sums of the two others', and the lone node none
    assert pools == {
        "a-1": KinRecord((4, 2), (50, 40)),
        "a-2": KinRecord((10, 9), (100, 90)),
        "a-3": KinRecord((14, 11), (150, 130)),
    }
    # as kin_of and pooled would give them, one node at a time
    kin = kin_of(live, ["a-3"])["a-3"]
    assert pools["a-3"] == KinRecord(pooled(on_type, kin),
                                     pooled({n.name: (n.attempts, n.successes) for n in live},
                                            kin))


def test_the_kins_record_is_the_prior_of_a_nodes_confidence_never_under_the_minimum() -> None:
    # given a node with no episode of a type (the announcement's minimum confidence: 0.5)
    announcement = Announcement(task_id="t", task_name="w", task_type="extract",
                                required_skills=["x"])
    assert announcement.min_confidence == 0.5
    profile = NodeProfile(name="a-1", capabilities=["x"])

    def confidence(history: NodeHistory) -> float:
        bid = compute_bid(announcement, profile, history, now=0.0)
        assert isinstance(bid, Bid)
        return bid.confidence

    # when its kin ran the type 20 times with 14 successes, then it bids their rate, smoothed
    # as its own would be: (14 + 2) / (20 + 2)
    assert scores.kin_prior(20, 14) == pytest.approx(16 / 22)
    assert confidence(NodeHistory(kin=(20, 14))) == pytest.approx(16 / 22)
    # and when they failed it 18 times of 20, it bids the minimum (their 4 / 22 would rule it
    # out for what they did: only its own record may)
    assert scores.kin_prior(20, 2) == pytest.approx(4 / 22)
    assert confidence(NodeHistory(kin=(20, 2))) == 0.5
    # and without a kin's record it bids as a newcomer does (the optimistic 1.0)
    assert scores.kin_prior(0, 0) == 1.0
    assert confidence(NodeHistory()) == 1.0
    # and its own episodes outweigh the prior as they accrue: 10 successes of 10, its record
    # there, smoothed toward the kin's rate (which weighs as many episodes as they ran, 20,
    # up to 80; ``tests/unit/test_whole_record.py``)
    assert confidence(NodeHistory(outcomes=(True,) * 10, kin=(20, 14))) == pytest.approx(
        (10 + 20 * 16 / 22) / 30)
    # and its kin's failures never rule it out while its own record does not: one failure of
    # its own (2 / 3 with the optimistic prior) keeps it at the minimum
    assert confidence(NodeHistory(outcomes=(False,), kin=(20, 2))) == 0.5
    # but three failures of its own do (2 / 5 under the minimum), as without kin
    assert confidence(NodeHistory(outcomes=(False,) * 3, kin=(20, 2))) == pytest.approx(
        2 / 5)
    assert confidence(NodeHistory(outcomes=(False,) * 3)) == pytest.approx(2 / 5)


def test_a_replica_judged_on_its_latest_episodes_is_placed_by_how_it_does_beside_its_kin(
) -> None:
    # given two replicas whose latest episodes of a type contradict their record there (so
    # that each is judged on its latest episodes: ``scores.windowed_confidence``), whose kin
    # ran it 100 times with 80 successes, and ran 1,000 tasks of every type with 850 successes
    announcement = Announcement(task_id="t", task_name="w", task_type="extract",
                                required_skills=["x"])
    kin = {"kin": (100, 80), "kin_overall": (1000, 850)}
    outcomes = (True, True, False, False, False, True, False, False)
    assert not scores.window_agrees(outcomes, (290 + 80 * scores.kin_prior(100, 80)) / 380)

    def confidence(name: str, attempts: int, successes: int) -> float:
        history = NodeHistory(outcomes=outcomes, attempts=attempts, successes=successes,
                              record=(300, 290), **kin)
        bid = compute_bid(announcement, NodeProfile(name=name, capabilities=["x"]), history,
                          now=0.0)
        assert isinstance(bid, Bid)
        return bid.confidence

    # when one has succeeded 190 times in 200 overall and the other 150 times in 200
    better, worse = confidence("a-1", 200, 190), confidence("a-2", 200, 150)
    # then the first bids higher on the type, though their episodes of it are the same
    assert better > worse
    # and the factor is its node-wide rate (smoothed toward the kin's) over the kin's
    kin_rate = (850 + 2) / (1000 + 2)
    assert scores.replica_factor((200, 190), (1000, 850)) == pytest.approx(
        (190 + 20 * kin_rate) / 220 / kin_rate)
    assert scores.replica_factor((200, 150), (1000, 850)) < 1.0
    # and a node with no record of its own, or whose kin have none, is taken as its kin
    assert scores.replica_factor((0, 0), (1000, 850)) == pytest.approx(1.0)
    assert scores.replica_factor((200, 150), (0, 0)) == 1.0
