"""What an announcer reuses from one auction to the next rather than building again: a live
node's published profile, the built-ins' tie-break generator (reseeded in a forked pool
process), and whether a strategy class scores its bids."""

from __future__ import annotations

import dataclasses
import os
import types

from bidding.auction.proxy import profile_of
from bidding.nodes.registry import LiveNode
from bidding.strategies.builtins import WeightedScore, tie_random
from bidding.strategies.protocol import decides_at_once, is_scoring


def live(name: str = "north") -> LiveNode:
    return LiveNode(name=name, capabilities=("x", "y"), capacity=4, price_per_unit=0.02,
                    latency_ms=40, trust=80, last_heartbeat=0.0, resources={"gpu_mem_gb": 24},
                    warm=("model:a",))


def test_a_live_nodes_profile_is_built_once_from_what_it_published() -> None:
    # given a live node as read from the store
    node = live()
    # when its profile is asked for twice (two auctions within the live cache's second)
    first, second = profile_of(node), profile_of(node)
    # then it is one profile, saying what the node published
    assert first is second
    assert (first.name, first.capabilities, first.capacity, first.price_per_unit,
            first.latency_ms, first.trust, first.resources, first.warm) == (
        "north", ["x", "y"], 4, 0.02, 40, 80, {"gpu_mem_gb": 24}, ["model:a"])
    # and a node read again with other values gets a profile of its own, and compares by its
    # fields as before
    changed = dataclasses.replace(node, capacity=8)
    assert profile_of(changed).capacity == 8 and profile_of(node).capacity == 4
    assert node == live() and node != changed


def test_the_tie_break_generator_is_shared_and_reseeded_in_a_forked_child() -> None:
    # given built-in strategies built without a generator of their own: they break ties with
    # the process's one (seeding a strategy's own does not reseed it)
    assert WeightedScore().rng is None and tie_random() is tie_random()
    # when this process forks (as a prefork pool does) and parent and child draw
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: sends its first draws, and never returns into pytest
        try:
            os.close(read)
            os.write(write, repr([tie_random().random() for _ in range(4)]).encode())
        finally:
            os._exit(0)
    os.close(write)
    child = os.read(read, 4096).decode()
    os.close(read)
    os.waitpid(pid, 0)
    parent = repr([tie_random().random() for _ in range(4)])
    # then they draw differently: pool processes do not break ties alike
    assert child and child != parent


def test_whether_a_strategy_scores_is_known_per_class_and_asked_of_other_objects() -> None:
    # given a scoring strategy, one that only selects, and two strategies of one type (modules,
    # as a dotted path may name) of which only the first scores
    class SelectsOnly:
        def select(self, bids, announcement, capabilities):  # type: ignore[no-untyped-def]
            return bids[0] if bids else None

    scored, plain = types.ModuleType("scored"), types.ModuleType("plain")
    scored.select = plain.select = lambda bids, announcement, capabilities: None  # type: ignore[attr-defined]
    scored.score_all = lambda bids, announcement, capabilities: []  # type: ignore[attr-defined]
    # when asked twice, in that order, then each answer is the protocol's
    for _ in range(2):
        assert is_scoring(WeightedScore()) and decides_at_once(WeightedScore())
        assert not is_scoring(SelectsOnly()) and not decides_at_once(SelectsOnly())
        assert is_scoring(scored)  # type: ignore[arg-type]
        assert not is_scoring(plain) and not decides_at_once(plain)  # type: ignore[arg-type]
