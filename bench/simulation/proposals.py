"""Proposed changes to the scoring, evaluated in the simulation only.

Nothing here is production code and ``bidding/`` is not modified: a bid function that calls
``compute_bid`` and replaces one sub-score, and a subclass of the production ``WeightedScore``
that adds one multiplier. The comment below says what each proposal is and where it would go.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

from bidding.auction.bid import NodeHistory, compute_bid
from bidding.models import Announcement, Bid, Refusal, Score
from bidding.nodes.profile import NodeProfile
from bidding.strategies import NodeCapability, WeightedScore
from bidding.strategies.formulas import slot_share

# --------------------------------------------------------------------------------------------
# PROPOSALS (simulation only; nothing here is production code and bidding/ is not modified)
#
# P1 "learned confidence" (bid): a node's confidence is its honest estimate of success on this
#    task type: the mean of a Beta posterior over its latest episodes of the type
#    (NodeHistory.outcomes, the production experience window of 10), with an OPTIMISTIC prior
#    worth A episodes that all succeeded:
#        confidence = (successes + A) / (n + A),   A = 2
#    A node with no episode of the type (a newcomer) bids 1.0 and so is tried; the estimate
#    falls as failures come in; a node estimated below the announcement's min_confidence (0.5)
#    is no longer eligible for that type (decide() already applies min_confidence). The content
#    heuristic leaves the ranking: it is the same for every bidder of an auction.
#    Production then: new ``scoring.estimated_success(outcomes)``, used by ``bid.compute_bid``
#    for ``confidence=`` instead of ``scoring.confidence_score(content)``; production's is now
#    ``scoring.informed_confidence`` (the kin's record and the longer record as priors), and P1
#    here keeps the first form.
# P2 = P1 + "slot share" (strategy): WeightedScore's total (0.6 confidence + 0.4 skill match,
#    unchanged) is multiplied, like composite's multipliers, by the share of a slot the task
#    would get on the node: slot_share = min(1, capacity / (in_flight + 1)). Among nodes with a
#    free slot the best estimate wins; a full node wins only if it is that much better. It uses
#    the bid's in_flight and capacity, which refresh_loads keeps current.
#    Production then: new ``scoring.slot_share(in_flight, capacity)``, applied in
#    ``strategies.WeightedScore.score`` as ``multipliers["slot_share"]``; since decision 0040
#    it scales the confidence term only (a negative ``slot_share`` term). P2 here keeps the
#    form first measured: the plain seed-003 score times the share.
#    (Putting the share into the bid's confidence instead was tried and rejected: a busy node's
#    confidence then falls under min_confidence, and when every capable node is busy the task
#    fails with NoBidsError. Load belongs in the ranking, not in the eligibility.)
# P3 "composite, smoothed experience" (bid): seed 000's composite unchanged, except that the
#    experience sub-score is the same estimate, (successes + 2) / (n + 2), instead of the raw
#    rate with a fixed 0.3 for a newcomer. Production: ``scoring.experience_score``.
# --------------------------------------------------------------------------------------------

#: A, the optimistic prior's weight in episodes (``--prior-episodes``).
PRIOR_EPISODES = 2.0


def estimated_success(outcomes: Sequence[bool], prior_episodes: float | None = None) -> float:
    """Optimistic Beta posterior mean of success: (successes + A) / (n + A)."""
    a = PRIOR_EPISODES if prior_episodes is None else prior_episodes
    return (sum(outcomes) + a) / (len(outcomes) + a)


def bid_learned_confidence(announcement: Announcement, profile: NodeProfile, history: NodeHistory,
                           now: float) -> Bid | Refusal:
    """P1: the production bid, with confidence = estimated_success(outcomes)."""
    bid = compute_bid(announcement, profile, history, now)
    if isinstance(bid, Refusal):
        return bid
    return bid.model_copy(update={"confidence": estimated_success(history.outcomes)})


def bid_smoothed_experience(announcement: Announcement, profile: NodeProfile, history: NodeHistory,
                            now: float) -> Bid | Refusal:
    """P3: the production bid, with experience = estimated_success(outcomes)."""
    bid = compute_bid(announcement, profile, history, now)
    if isinstance(bid, Refusal):
        return bid
    return bid.model_copy(update={"experience": estimated_success(history.outcomes)})


@dataclass
class WeightedSlotShare(WeightedScore):
    """P2: seed 003's WeightedScore (no slot share of its own), its total multiplied by the
    bidder's slot share."""

    name: ClassVar[str] = "weighted_slot_share"
    slot_share: bool = False

    def score(
        self, bid: Bid, announcement: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """Seed 003's score, its total times ``slot_share`` when the bidder is full."""
        base = super().score(bid, announcement, capabilities)
        share = slot_share(bid.in_flight, bid.capacity)
        if share >= 1.0:
            return base
        return base.model_copy(update={"total": base.total * share,
                                       "multipliers": {"slot_share": share}})
