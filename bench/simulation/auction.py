"""A production auction in the simulation: who is asked, their bids, fresh loads, ``decide``.

Every step calls the PRODUCTION code (modules of ``bidding``):
``auction.candidates.select_candidates`` (who is asked, ranked with each node's record on the
task type as ``nodes.records`` keeps it), ``auction.bid.compute_bid`` (with each node's kin's
pooled record, as ``nodes.kin`` reads it) (each node's
bid from its profile and a ``NodeHistory`` built as ``auction.history.gather_history`` builds it
from the store), ``auction.decision.refresh_loads`` and ``auction.decision.decide`` with the
strategy from ``strategies.resolve_strategy``.
Nothing of their formulas is copied here.

A task that needs resources is announced with them; each node's registry entry carries its
declared totals, so ``select_candidates`` keeps the nodes whose totals cover the needs (the
simulation's own pre-filter below only spares it building the others), and ``decide`` gets
each bidder's ``placement.Room`` (its totals and what its unfinished attempts reserve) and
``fit``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.simulation.federation import capable
from bench.simulation.sim import Sim
from bench.simulation.tasks import Task
from bidding import resources
from bidding.auction.bid import NodeHistory, compute_bid
from bidding.auction.candidates import select_candidates
from bidding.auction.decision import decide, refresh_loads
from bidding.auction.placement import Room
from bidding.models import Announcement, Bid, Refusal
from bidding.nodes.kin import kin_of, pooled
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import LiveNode
from bidding.strategies import SelectionStrategy, resolve_strategy, strategy_name

#: A node's answer to an announcement: ``compute_bid``, or a proposal's variant of it.
BidFn = Callable[[Announcement, NodeProfile, NodeHistory, float], Bid | Refusal]


@dataclass
class Auction:
    """A production auction: candidates, bids, fresh loads, then ``decide`` with a strategy."""

    #: A registered strategy name, or a strategy class (the proposals), as resolve_strategy takes.
    strategy_spec: str | type
    bid_fn: BidFn = compute_bid
    #: ``bidding_candidate_cap`` (None: the production default; 0: ask every eligible node).
    cap: int | None = None
    #: ``bidding_fit``: how a task that needs resources is placed ("spread" or "pack").
    fit: str = "spread"
    #: Resolved per run, its tie-break rng seeded, so that a run is reproducible.
    strategy: SelectionStrategy | None = None

    _names: list[str] = field(default_factory=list)
    _cache: dict[str, tuple[int, int, LiveNode]] = field(default_factory=dict)
    _rng: random.Random = field(default_factory=random.Random)

    def reset(self, seed: int) -> None:
        """A fresh strategy for a new run, its tie-breaks drawn from ``seed``."""
        self._names, self._cache = [], {}
        self._rng = random.Random(seed + 1)
        self.strategy = resolve_strategy(self.strategy_spec)
        if hasattr(self.strategy, "rng"):
            self.strategy.rng = random.Random(seed)

    def __call__(self, sim: Sim, task: Task, now: float) -> str | None:
        assert self.strategy is not None
        announcement = Announcement(
            task_id=f"t{task.idx}",
            task_name="sim.work",
            task_type=task.task_type,
            content=task.content,
            required_skills=list(task.skills),
            strategy=strategy_name(self.strategy),
            announced_at=now,
            resources=dict(task.needs),
            **({} if self.cap is None else {"candidate_cap": self.cap}),
        )
        # The registry lists live nodes ordered by name. Only the capable ones are built:
        # select_candidates' first step keeps exactly those (``federation.capable`` is its
        # filter), in the same order, so its answer and its draws are the same, and a large
        # federation costs the bench less.
        if len(self._names) != len(sim.present):
            self._names = sorted(sim.present)
        live = [
            self._live(sim, n, now)
            for n in self._names
            if capable(sim.specs[n], task.skills)
            and (not task.needs
                 or resources.shortfall(task.needs, sim.specs[n].profile.resources) is None)
        ]
        candidates = select_candidates(
            announcement, live, sim.rng,
            records=lambda names: {n: sim.typed[(n, task.task_type)] for n in names
                                   if (n, task.task_type) in sim.typed},
            loads=lambda names: {n: sim.in_flight(n) for n in names})
        bids: list[Bid] = []
        refusals: list[Refusal] = []
        # Each candidate's kin (same profile but the name) and their pooled records, on the
        # type and overall, as ``nodes.kin.kin_records`` reads them from the store.
        typed = {n: sim.typed[(n, task.task_type)] for n in self._names
                 if (n, task.task_type) in sim.typed}
        kin = {name: (pooled(typed, others),
                      (sum(sim.attempts[k] for k in others), sum(sim.successes[k] for k in others)))
               for name, others in kin_of(live, candidates).items()}
        for name in candidates:
            history = sim.history(name, task.task_type, now)
            if name in kin and kin[name][0][0] > 0:
                history = dataclasses.replace(history, kin=kin[name][0], kin_overall=kin[name][1])
            answer = self.bid_fn(announcement, sim.specs[name].profile, history, now)
            if isinstance(answer, Bid):
                bids.append(answer)
            else:
                refusals.append(answer)
        bids = refresh_loads(bids, {b.node: sim.in_flight(b.node) for b in bids})
        award = decide(
            announcement,
            bids,
            refusals,
            self.strategy,
            closed_by="all bids in",
            candidates=len(candidates),
            rooms={b.node: Room(sim.specs[b.node].profile.resources, dict(sim.reserved[b.node]))
                   for b in bids} if task.needs else None,
            fit=self.fit,
            # Placed awards break ties with this rng: seeded, so that a run is reproducible.
            rng=self._rng,
        )
        return award.winner


    def _live(self, sim: Sim, name: str, now: float) -> LiveNode:
        """The node's registry entry, rebuilt only when its record changed (the heartbeat
        time is not read by the candidate filter)."""
        attempts, successes = sim.attempts[name], sim.successes[name]
        cached = self._cache.get(name)
        if cached is None or cached[:2] != (attempts, successes):
            cached = (attempts, successes,
                      _live(sim.specs[name].profile, now, attempts, successes))
            self._cache[name] = cached
        return cached[2]


def _live(profile: NodeProfile, now: float, attempts: int, successes: int) -> LiveNode:
    """The node as ``registry.query_live_nodes`` lists it, record included."""
    return LiveNode(
        name=profile.name,
        capabilities=tuple(profile.capabilities),
        capacity=profile.capacity,
        price_per_unit=profile.price_per_unit,
        latency_ms=profile.latency_ms,
        trust=profile.trust,
        last_heartbeat=now,
        attempts=attempts,
        successes=successes,
        resources=dict(profile.resources),
    )
