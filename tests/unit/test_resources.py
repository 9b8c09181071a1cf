"""Resources and warm items: what a task needs and a node has, checked at the boundary; the
award's placement; a node's start that waits for room; what a node holds warm."""

from __future__ import annotations

import random
from typing import Any

import pytest

import bidding
from bidding import resources
from bidding.auction.decision import decide
from bidding.auction.history import read_rooms
from bidding.auction.placement import Room
from bidding.config import Settings
from bidding.errors import ProfileError
from bidding.execution import attempt as execution
from bidding.execution.room import room_for
from bidding.models import Announcement, Bid
from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.profile import NodeProfile, load_profile
from bidding.nodes.warm import add_warm
from bidding.store import read_session
from bidding.store.engine import is_sqlite
from bidding.strategies.builtins import WeightedScore
from tests.unit.test_execution import assigned


def gpu_node(settings: Settings, name: str, gb: float, warm: list[str] | None = None) -> None:
    heartbeat(settings, NodeProfile(name=name, capabilities=["infer"], capacity=4,
                                    resources={"gpu_mem_gb": gb}, warm=warm or []))


def bid(node: str, confidence: float = 0.8) -> Bid:
    return Bid(task_id="t", node=node, skills=["infer"], capability=1.0, experience=0.5,
               load=1.0, confidence=confidence, cost=0.0, latency_ms=1.0, trust=70.0,
               capacity=4)


def task(**fields: Any) -> Announcement:
    return Announcement(task_id="t", task_name="t.infer", task_type="infer",
                        required_skills=["infer"], **fields)


@pytest.mark.parametrize(("value", "says"), [
    ({"gpu_mem_gb": -1}, "resources.gpu_mem_gb: must be more than 0"),
    ({"gpu_mem_gb": 0}, "resources.gpu_mem_gb: must be more than 0"),
    ({"gpu_mem_gb": "lots"}, "resources.gpu_mem_gb: expected a number"),
    ({"9lives": 1}, "'9lives' is not a resource name"),
    (["gpu_mem_gb"], "expected a table of resource names and amounts"),
])
def test_a_task_asking_for_bad_resources_is_refused_at_the_call_naming_them(
    value: Any, says: str,
) -> None:
    # given a bidding task
    # when a call asks for resources that are no amounts of named things
    with pytest.raises(bidding.ConfigurationError) as refused:
        from tests.integration.app import infer
        infer.apply_async(("k", 0.0), bidding={"resources": value})
    # then the call is refused, saying which and why
    assert says in str(refused.value)


def test_a_profile_declaring_a_negative_resource_is_refused_naming_it(tmp_path: Any) -> None:
    # given a profile whose [resources] table has a negative amount
    path = tmp_path / "gpu.toml"
    path.write_text('name = "gpu"\ncapabilities = ["infer"]\n[resources]\ngpu_mem_gb = -16\n')
    # when it is loaded, then it is refused naming the resource
    with pytest.raises(ProfileError, match=r"resources\.gpu_mem_gb: must be 0 or more"):
        load_profile(path)


def test_a_node_too_small_for_a_task_refuses_it_naming_the_resource() -> None:
    # given a 16 GB node and a task needing 20 GB
    # then its shortfall reads as a person would say it; a node that could hold it has none
    assert resources.shortfall({"gpu_mem_gb": 20}, {"gpu_mem_gb": 16}) == \
        "needs gpu_mem_gb 20, has 16"
    assert resources.shortfall({"gpu_mem_gb": 20, "cpu": 2}, {"cpu": 8}) == \
        "needs gpu_mem_gb 20, has 0"
    assert resources.shortfall({"gpu_mem_gb": 20}, {"gpu_mem_gb": 24}) is None


def test_spread_leaves_room_on_every_node_and_pack_fills_one_node_first() -> None:
    # given a 10 GB task, a 48 GB node with 20 GB held and an empty 24 GB node
    needs = {"gpu_mem_gb": 10}
    busy = Room(totals={"gpu_mem_gb": 48}, reserved={"gpu_mem_gb": 20})
    empty = Room(totals={"gpu_mem_gb": 24})
    rooms = {"big": busy, "small": empty}
    bids = [bid("big"), bid("small")]

    def winner(fit: str) -> str | None:
        return decide(task(resources=needs), bids, [], WeightedScore(), closed_by="all bids in",
                      candidates=2, rooms=rooms, fit=fit, rng=random.Random(1)).winner

    # when equal bids are placed, then spread takes the node it leaves the most free of
    # (empty: 14/24 left against 18/48), pack the one it leaves the least
    assert winner("spread") == "small"
    assert winner("pack") == "big"


def test_a_node_the_task_fits_only_later_loses_to_one_it_fits_now_unless_much_better() -> None:
    # given a 10 GB task, a full 16 GB node and a free one
    rooms = {"full": Room(totals={"gpu_mem_gb": 16}, reserved={"gpu_mem_gb": 10}),
             "free": Room(totals={"gpu_mem_gb": 16})}
    announcement = task(resources={"gpu_mem_gb": 10})
    # when the full node bids a little better, then the free one wins, and explain shows why
    award = decide(announcement, [bid("full", 0.9), bid("free", 0.8)], [], WeightedScore(),
                   closed_by="all bids in", candidates=2, rooms=rooms)
    assert award.winner == "free"
    full = next(s for s in award.scores if s.node == "full")
    assert full.multipliers["fit"] == resources.WAIT_MULTIPLIER


def test_a_warm_node_wins_over_an_equal_cold_one_but_not_when_it_is_full() -> None:
    # given two equal nodes, one holding the model warm
    announcement = task(affinity=["model:llama-3-8b"])
    warm = Room(warm=frozenset({"model:llama-3-8b"}))
    award = decide(announcement, [bid("cold"), bid("warm")], [], WeightedScore(),
                   closed_by="all bids in", candidates=2, rooms={"warm": warm, "cold": Room()})
    # then the warm one wins, by the warm bonus
    assert award.winner == "warm"
    assert next(s for s in award.scores if s.node == "warm").multipliers["warm"] == \
        pytest.approx(1 + resources.WARM_BONUS)
    # and when the warm node's slots are all busy, a free cold one wins
    busy = bid("warm").model_copy(update={"in_flight": 4})
    award = decide(announcement, [bid("cold"), busy], [], WeightedScore(),
                   closed_by="all bids in", candidates=2, rooms={"warm": warm, "cold": Room()})
    assert award.winner == "cold"


def test_an_award_reads_what_each_node_holds_and_has_reserved(settings: Settings) -> None:
    # given a 16 GB node running a 10 GB task, and a 48 GB node holding a model warm
    gpu_node(settings, "gpu16", 16)
    gpu_node(settings, "gpu48", 48, warm=["model:a"])
    assigned(settings, node="gpu16", resources={"gpu_mem_gb": 10})
    assigned(settings, node="gpu16")  # needs nothing: holds nothing
    # when the award reads their rooms
    with read_session(settings.database_url) as session:
        rooms = read_rooms(session, ["gpu16", "gpu48"])
    # then each has its totals, its reservations and its warm items
    assert rooms["gpu16"] == Room(totals={"gpu_mem_gb": 16}, reserved={"gpu_mem_gb": 10})
    assert rooms["gpu48"] == Room(totals={"gpu_mem_gb": 48}, warm=frozenset({"model:a"}))


def test_a_node_starts_an_attempt_only_while_its_running_ones_leave_room(
    settings: Settings,
) -> None:
    # given a 16 GB node running a 10 GB attempt, and a second 10 GB task awarded to it
    gpu_node(settings, "gpu16", 16)
    lock = not is_sqlite(settings.database_url)
    first = assigned(settings, node="gpu16", resources={"gpu_mem_gb": 10})
    needs = {"gpu_mem_gb": 10.0}
    running = execution.begin(settings, first.task_id, 1, "gpu16", room=room_for(
        first.task_id, 1, "gpu16", needs, {"gpu_mem_gb": 16}, lock=lock))
    assert running.start is execution.Start.FIRST
    second = assigned(settings, node="gpu16", resources={"gpu_mem_gb": 10})
    room = room_for(second.task_id, 1, "gpu16", needs, {"gpu_mem_gb": 16}, lock=lock)
    # when the second tries to start, then it waits, writing nothing
    waiting = execution.begin(settings, second.task_id, 1, "gpu16", room=room)
    assert waiting.start is execution.Start.WAITING
    # and once the first has ended, it starts
    execution.complete(settings, running, {"ok": True})
    started = execution.begin(settings, second.task_id, 1, "gpu16", room=room)
    assert started.start is execution.Start.FIRST
    # and the first one's copy, delivered again, is no waiting attempt: it is a duplicate
    again = execution.begin(settings, first.task_id, 1, "gpu16", room=room_for(
        first.task_id, 1, "gpu16", needs, {"gpu_mem_gb": 16}, lock=lock))
    assert again.start is execution.Start.DUPLICATE


def test_what_a_task_body_marks_warm_adds_to_the_node_until_it_starts_again(
    settings: Settings,
) -> None:
    # given a node holding one model warm from its profile
    gpu_node(settings, "gpu48", 48, warm=["model:a"])
    # when a body marks another warm, then the node holds both
    assert add_warm(settings, "gpu48", ["model:b", "model:a"]) == ["model:a", "model:b"]
    # and when its worker starts again, it holds its profile's only
    gpu_node(settings, "gpu48", 48, warm=["model:a"])
    with read_session(settings.database_url) as session:
        assert read_rooms(session, ["gpu48"])["gpu48"].warm == frozenset({"model:a"})
    # and a bad item is refused naming it
    with pytest.raises(ValueError, match="mark_warm: 'a model' is not an item"):
        add_warm(settings, "gpu48", ["a model"])
