"""The pure decision of an award: which bids may win, the strategy's pick with every bid's
score, the no-bid outcomes of seeds 000 and 001, and seed 000's fallback node.

Nothing here reads or writes the store: ``award`` applies a decision in one transaction, and
``bench/quality.py`` drives the same code in a simulation.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from bidding.auction import placement
from bidding.auction.placement import Room
from bidding.auction.scores import load_score
from bidding.models import BUDGET_EPSILON, Announcement, Award, Bid, Refusal, Score
from bidding.strategies.builtins import best_of, tie_random
from bidding.strategies.protocol import (
    SelectionStrategy,
    capabilities_of,
    is_scoring,
    run_select,
)
from bidding.strategies.resolver import strategy_name


class Candidate(Protocol):
    """What the fallback needs to know of a live node (``nodes.registry.LiveNode`` has it)."""

    @property
    def name(self) -> str:
        """The node's name."""

    @property
    def capacity(self) -> int:
        """Its declared capacity."""

    @property
    def capabilities(self) -> Sequence[str]:
        """Its declared skills."""


NO_BIDDERS = "No bidders registered"


NO_BIDS = "No bids received"


NO_CONFIDENT_BIDS = "No bids met minimum confidence"


NO_VALID_BIDS = "No valid bids"


def ineligibility(bid: Bid, announcement: Announcement) -> str | None:
    """Why ``bid`` may not win ``announcement`` (seed 001's min_confidence, AITP's min_trust
    and budget)."""
    if bid.confidence < announcement.min_confidence:
        return (f"confidence {bid.confidence:.2f} below min_confidence "
                f"{announcement.min_confidence:.2f}")
    if bid.trust < announcement.min_trust:
        return f"trust {bid.trust:.1f} below min_trust {announcement.min_trust:.1f}"
    # A tolerance, so a bid of exactly the budget left is not lost to float rounding
    # (1.0 - 0.8 is 0.19999999999999996).
    if (
        announcement.budget is not None
        and bid.cost > announcement.budget - announcement.spent + BUDGET_EPSILON
    ):
        left = announcement.budget - announcement.spent
        spent = f" ({announcement.spent:.4f} already spent)" if announcement.spent else ""
        return f"cost {bid.cost:.4f} exceeds remaining budget {left:.4f}{spent}"
    return None


def decide(
    announcement: Announcement,
    bids: Sequence[Bid],
    refusals: Sequence[Refusal],
    strategy: SelectionStrategy,
    *,
    closed_by: str,
    candidates: int,
    rooms: Mapping[str, Room] | None = None,
    fit: str = "spread",
    rng: random.Random | None = None,
) -> Award:
    """Rank the bids of ``announcement`` and name the winner, or say why there is none.

    ``rooms``: the bidders' room for the task (``placement``), read under the award's lock;
    a scoring strategy's scores of a task that needs resources or warm items are multiplied
    by each node's placement (``fit``: "spread" or "pack") and the best of them wins. A
    strategy that only selects is given the bids as they are."""
    name = strategy_name(strategy)
    eligible: list[Bid] = []
    scores: list[Score] = []
    caps = capabilities_of(bids)
    for bid in bids:
        why = ineligibility(bid, announcement)
        if why is None:
            eligible.append(bid)
        else:
            scores.append(Score(node=bid.node, total=0.0, eligible=False, reason=why))
    def award(**outcome: Any) -> Award:
        return Award(task_id=announcement.task_id, attempt=announcement.attempt, strategy=name,
                     closed_by=closed_by, scores=scores, **outcome)

    if not eligible:
        return award(outcome="failed",
                     error=_no_winner_message(announcement, bids, refusals, scores, candidates))
    if rooms is not None and placement.placed(announcement) and is_scoring(strategy):
        free_slot = {b.node: b.in_flight < b.capacity for b in eligible}
        placed = [_placed(score, placement.multipliers(announcement, rooms.get(score.node), fit,
                                                       free_slot.get(score.node, True)))
                  for score in strategy.score_all(eligible, announcement, caps)]
        scores.extend(placed)
        return award(outcome="awarded", winner=best_of(
            eligible, {s.node: s.total for s in placed}, rng or tie_random()).node)
    if is_scoring(strategy):
        scores.extend(strategy.score_all(eligible, announcement, caps))
    winner = run_select(strategy, eligible, announcement, caps)
    reasoning = getattr(strategy, "last_reasoning", "")
    if winner is None:
        return award(outcome="failed",
                     error=f"{NO_VALID_BIDS}: strategy {name} selected none of "
                     f"{len(eligible)} eligible bid(s)" + (f" ({reasoning})" if reasoning else ""))
    if reasoning:
        scores = [
            s.model_copy(update={"reason": reasoning}) if s.node == winner.node else s
            for s in scores
        ]
    return award(outcome="awarded", winner=winner.node)

def _placed(score: Score, by: dict[str, float]) -> Score:
    """``score`` with its node's placement multipliers applied (and shown)."""
    if not by:
        return score
    total = score.total
    for factor in by.values():
        total *= factor
    return score.model_copy(update={"total": total,
                                    "multipliers": {**score.multipliers, **by}})


def _no_winner_message(
    announcement: Announcement,
    bids: Sequence[Bid],
    refusals: Sequence[Refusal],
    scores: Sequence[Score],
    candidates: int,
) -> str:
    why = _no_winner_reason(announcement, bids, refusals, scores, candidates)
    if announcement.attempt > 1 and announcement.last_error:
        # A retry that finds no winner: the caller must still learn what failed first.
        why += f" (attempt {announcement.attempt - 1} failed: {announcement.last_error})"
    return why


def _no_winner_reason(
    announcement: Announcement,
    bids: Sequence[Bid],
    refusals: Sequence[Refusal],
    scores: Sequence[Score],
    candidates: int,
) -> str:
    if candidates == 0:
        return f"{NO_BIDDERS}: no live node offers {announcement.wanted}"
    if not bids:
        if refusals:
            reasons = "; ".join(f"{r.node}: {r.reason}" for r in refusals)
            return f"{NO_BIDS}: every answering node refused ({reasons})"
        return (f"{NO_BIDS}: none of {candidates} candidate(s) answered within "
                f"{announcement.window:g}s")
    reasons = "; ".join(f"{s.node}: {s.reason}" for s in scores)
    if all(s.reason.startswith("confidence") for s in scores):
        return f"{NO_CONFIDENT_BIDS} ({announcement.min_confidence:.2f}): {reasons}"
    return f"{NO_VALID_BIDS}: {reasons}"


def fallback_pool(announcement: Announcement, live: Sequence[Candidate]) -> list[Candidate]:
    """The live nodes seed 000's fallback may choose from: those with every required skill,
    and not excluded from the task (they failed it, or went offline with it). A task that needs
    a GPU must not fall back to a node without one."""
    required = set(announcement.required_skills)
    excluded = set(announcement.exclude_nodes)
    return [n for n in live if n.name not in excluded and required <= set(n.capabilities)]


def fallback_node(
    live: Sequence[Candidate], in_flight: dict[str, int], rng: random.Random | None = None
) -> str | None:
    """Seed 000's fallback assignment: the least busy live node (in-flight / capacity), ties at
    random. Not the load score: its 0.1 floor would make every saturated node tie."""
    if not live:
        return None
    rng = rng or tie_random()
    busy = {n.name: in_flight.get(n.name, 0) / max(1, n.capacity) for n in live}
    least = min(busy.values())
    return rng.choice(sorted(name for name, b in busy.items() if b == least))


def refresh_loads(bids: Sequence[Bid], in_flight: dict[str, int]) -> list[Bid]:
    """Bring each bid's load up to date with work awarded since it was made.

    Bids of concurrent auctions are made before any of them is awarded, so all of them see
    idle nodes; awards raise a node's in-flight count at once, and the award uses it here so
    concurrent auctions spread instead of piling onto the same node.
    """
    out = []
    for bid in bids:
        now_busy = in_flight.get(bid.node, 0)
        if now_busy > bid.in_flight:
            fresh = load_score(now_busy, bid.capacity)
            bid = bid.model_copy(update={"load": min(bid.load, fresh), "in_flight": now_busy})
        out.append(bid)
    return out
