"""The policies compared, in the report's order, and the ones issue 4's targets apply to."""

from __future__ import annotations

from collections.abc import Callable

from bench.simulation.auction import Auction
from bench.simulation.baselines import fifo, least_loaded, oracle, oracle_free_slot, random_node
from bench.simulation.proposals import (
    WeightedSlotShare,
    bid_learned_confidence,
    bid_smoothed_experience,
)
from bench.simulation.sim import Policy

#: (label, factory, kind). Factories, so that every run starts from a fresh policy.
#: kind: "base" (baselines and production strategies), "ref" (reference), "proposal".
POLICIES: tuple[tuple[str, Callable[[], Policy], str], ...] = (
    ("fifo", lambda: fifo, "base"),
    ("random", lambda: random_node, "base"),
    ("least_loaded", lambda: least_loaded, "base"),
    ("weighted (default)", lambda: Auction("weighted"), "base"),
    ("composite", lambda: Auction("composite"), "base"),
    ("routing", lambda: Auction("routing"), "base"),
    ("oracle", lambda: oracle, "base"),
    ("ref: oracle, free slot first", lambda: oracle_free_slot, "ref"),
    ("P1 weighted, learned conf", lambda: Auction("weighted", bid_learned_confidence), "proposal"),
    ("P2 P1 + slot share", lambda: Auction(WeightedSlotShare, bid_learned_confidence),
     "proposal"),
    ("P3 composite, smoothed exp", lambda: Auction("composite", bid_smoothed_experience),
     "proposal"),
)
TARGETED = ("weighted (default)", "composite", "routing", "P1 weighted, learned conf",
            "P2 P1 + slot share", "P3 composite, smoothed exp")
