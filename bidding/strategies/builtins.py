"""The built-in selection strategies of seed 003 (and seed 000's composite, AITP's routing).

Each scores every bid (``score``/``score_all``, so ``bidding explain`` shows every breakdown)
and picks the highest; among equal scores the least busy node, then one at random.
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from bidding.errors import ConfigurationError
from bidding.models import Announcement, Bid, Score
from bidding.strategies import formulas
from bidding.strategies.protocol import NodeCapability

#: Scores closer than this are a tie.
TIE_EPSILON = 1e-9


def _skills_of(bid: Bid, capabilities: Mapping[str, NodeCapability]) -> list[str]:
    cap = capabilities.get(bid.node)
    return list(cap.skills) if cap is not None else list(bid.skills)


#: The generator the built-ins break ties with unless given one: seeding a new one for every
#: strategy built (a few per auction) cost 13 us each. Reseeded in a forked child, as the
#: ``random`` module's own generator is, so that pool processes do not break ties alike.
_TIES = random.Random()
os.register_at_fork(after_in_child=_TIES.seed)


def tie_random() -> random.Random:
    """The built-ins' shared tie-break generator."""
    return _TIES


def break_tie(tied: Sequence[Bid], rng: random.Random) -> Bid:
    """Among equally scored bids, the least busy node (in-flight / capacity), then at random.

    Concurrent auctions over equal idle nodes would otherwise pile onto one node by chance;
    the award refreshes each bid's in-flight count first, so this is the in-flight reservation.
    """
    if len(tied) == 1:
        return tied[0]
    busy = {b.node: b.in_flight / b.capacity for b in tied}
    least = min(busy.values())
    return rng.choice([b for b in tied if busy[b.node] <= least + TIE_EPSILON])


def best_of(bids: Sequence[Bid], totals: Mapping[str, float], rng: random.Random) -> Bid:
    """The bid whose node's total is highest; among equal totals, ``break_tie``'s."""
    best = max(totals[b.node] for b in bids)
    return break_tie([b for b in bids if best - totals[b.node] <= TIE_EPSILON], rng)


@dataclass
class _Scored:
    """Shared ranking for the built-ins: highest score wins; see ``break_tie`` for ties."""

    name: ClassVar[str] = ""
    #: Keyword-only, so ``WeightedScore(0.2, 0.8)`` sets the weights as in seed 003.
    #: Its own generator for tie breaks (seeded, for a reproducible run); None: the process's
    #: shared one (``tie_random``), which seeding here would reseed for every strategy.
    rng: random.Random | None = field(default=None, repr=False, compare=False, kw_only=True)

    def score_all(
        self,
        bids: Sequence[Bid],
        announcement: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> list[Score]:
        """Score every bid of one auction."""
        return [self.score(b, announcement, capabilities) for b in bids]

    def score(
        self, bid: Bid, announcement: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """Score one bid (implemented by each built-in)."""
        raise NotImplementedError

    def select(
        self,
        bids: Sequence[Bid],
        announcement: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> Bid | None:
        """The highest-scoring bid; among equal scores the least busy, then one at random."""
        if not bids:
            return None
        scores = self.score_all(bids, announcement, capabilities)
        return best_of(bids, {s.node: s.total for s in scores}, self.rng or tie_random())


@dataclass
class HighestConfidence(_Scored):
    """Seed 003 3.1: the most confident bid wins."""

    name: ClassVar[str] = "highest_confidence"

    def score(
        self, bid: Bid, announcement: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """The bid's confidence."""
        return Score(node=bid.node, total=bid.confidence, terms={"confidence": bid.confidence})


@dataclass
class BestSkillMatch(_Scored):
    """Seed 003 3.2: the bid whose node covers most of the required skills wins."""

    name: ClassVar[str] = "best_skill_match"

    def score(
        self, bid: Bid, announcement: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """Fraction of required skills covered (0 when the task requires none, as in seed 003)."""
        match = formulas.skill_match(announcement.required_skills, _skills_of(bid, capabilities))
        return Score(node=bid.node, total=match, terms={"skill_match": match})


@dataclass
class WeightedScore(_Scored):
    """Seed 003 3.3, the default: ``0.6 * confidence + 0.4 * skill match``, the confidence
    taken at the node's slot share.

    Without required skills the seeds disagree (001: bare confidence; 003: confidence * 0.6).
    We follow seed 001: the score is the bare confidence, so it stays on the same 0-1 scale as
    a fully matched bid's; the ranking is the same either way.

    ``slot_share`` (our addition, on by default) scales the confidence term by
    ``min(1, capacity / (in_flight + 1))``: among nodes with a free slot the best estimate wins,
    and a full node wins only when its confidence is proportionally better than a free one's
    (0.94 queued behind three busy slots, x0.75, beats a free 0.6, not a free 0.78), instead
    of queueing work behind its busy slots. The score shows it as the ``slot_share`` term, the
    (negative) part of the confidence term the busy slots take. Scaling the whole score, as
    before, scaled the skill match too, which every capable node has alike, so a full node had
    to be far better to win: a free node with a third less success took the task
    (bench/quality.py at 90% load: 0.6-1.0 points closer to the oracle that fills free slots
    first, decision 0040). ``WeightedScore(slot_share=False)`` is seed 003's form.
    """

    name: ClassVar[str] = "weighted"
    confidence_weight: float = 0.6
    skill_weight: float = 0.4
    slot_share: bool = True

    def __post_init__(self) -> None:
        for label, w in (("confidence_weight", self.confidence_weight),
                         ("skill_weight", self.skill_weight)):
            if w < 0:
                raise ConfigurationError(f"WeightedScore.{label}: must be >= 0 (got {w})")

    def score(
        self, bid: Bid, announcement: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """Weighted confidence and skill match (bare confidence when no skill is required),
        the confidence at the node's slot share."""
        if not announcement.required_skills:
            terms = {"confidence": bid.confidence}
        else:
            match = formulas.skill_match(announcement.required_skills,
                                         _skills_of(bid, capabilities))
            terms = {
                "confidence": self.confidence_weight * bid.confidence,
                "skill_match": self.skill_weight * match,
            }
        share = formulas.slot_share(bid.in_flight, bid.capacity) if self.slot_share else 1.0
        if share < 1.0:
            terms["slot_share"] = -terms["confidence"] * (1.0 - share)
        return Score(node=bid.node, total=sum(terms.values()), terms=terms)


@dataclass
class Composite(_Scored):
    """Seed 000's composite score: capability 40%, experience 30%, load 20%, confidence 10%."""

    name: ClassVar[str] = "composite"

    def score(
        self, bid: Bid, announcement: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """The composite with the preferred-node bonus and recent-failure penalty, capped at 1."""
        total, terms, multipliers = formulas.composite_score(
            bid.capability,
            bid.experience,
            bid.load,
            bid.confidence,
            is_preferred_node=bid.is_preferred_node,
            recent_failures=bid.recent_failures,
        )
        return Score(node=bid.node, total=total, terms=terms, multipliers=multipliers)


@dataclass
class Routing(_Scored):
    """AITP 4.2's routing score over capability, trust, latency and cost.

    ``max_cost`` is the task's budget when it has one, else the dearest bid of the auction.
    """

    name: ClassVar[str] = "routing"

    def score_all(
        self,
        bids: Sequence[Bid],
        announcement: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> list[Score]:
        """Score every bid against the auction's own cost range."""
        max_cost = self.max_cost(bids, announcement)
        return [self._score(b, max_cost) for b in bids]

    @staticmethod
    def max_cost(bids: Sequence[Bid], announcement: Announcement) -> float:
        """The cost that scores 0: the budget, else the highest bid cost."""
        if announcement.budget is not None and announcement.budget > 0:
            return announcement.budget
        return max((b.cost for b in bids), default=0.0)

    def score(
        self, bid: Bid, announcement: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """The routing score of a bid alone (its cost range is its own budget or cost)."""
        return self._score(bid, self.max_cost([bid], announcement))

    @staticmethod
    def _score(bid: Bid, max_cost: float) -> Score:
        total, terms = formulas.routing_score(
            bid.capability, bid.trust, bid.latency_ms, bid.cost, max_cost
        )
        return Score(node=bid.node, total=total, terms=terms)
