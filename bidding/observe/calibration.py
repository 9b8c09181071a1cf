"""How a node's claims compare with what then happened (pure): the confidence its winning bids
claimed against the share of those attempts that succeeded, and the cost and duration they
estimated against the actual ones, each over the attempts that made that claim.

An operator reads it in ``bidding nodes`` and ``GET /aitp/nodes`` to see which bidders
overstate: a positive ``confidence_gap`` claims more success than it delivers; a
``cost_ratio`` or ``duration_ratio`` above 1 costs or takes more than it said.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pydantic import BaseModel


@dataclass(frozen=True)
class Claimed:
    """One finished attempt: what its bid claimed (None: not said) and what happened."""

    success: bool
    cost: float
    duration_s: float
    claimed_confidence: float | None = None
    estimated_cost: float | None = None
    estimated_duration_s: float | None = None


class Calibration(BaseModel):
    """A node's claims against its outcomes; each mean is over the attempts counted beside it
    (None when there are none)."""

    #: Attempts whose bid claimed a confidence; the mean claim and the share that succeeded.
    confidence_attempts: int = 0
    claimed_confidence: float | None = None
    success_rate: float | None = None
    #: ``claimed_confidence - success_rate``: above 0, it claims more than it delivers.
    confidence_gap: float | None = None
    #: Attempts whose bid estimated a cost; mean estimate, mean actual (the ledger's), ratio.
    cost_attempts: int = 0
    estimated_cost: float | None = None
    actual_cost: float | None = None
    #: ``actual_cost / estimated_cost``: above 1, it costs more than it said (None when the
    #: estimates are all 0).
    cost_ratio: float | None = None
    #: Attempts whose bid estimated a duration (of those that succeeded: a failure's duration
    #: says nothing of how long the work takes); mean estimate, mean actual, ratio.
    duration_attempts: int = 0
    estimated_duration_s: float | None = None
    actual_duration_s: float | None = None
    duration_ratio: float | None = None


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def _ratio(actual: float | None, estimated: float | None) -> float | None:
    if actual is None or not estimated:
        return None
    return actual / estimated


def calibrate(attempts: Iterable[Claimed]) -> Calibration:
    """The calibration of one node's finished ``attempts`` (attempts lost with their worker
    are no verdict on the work: leave them out)."""
    confidence: list[tuple[float, bool]] = []
    costs: list[tuple[float, float]] = []
    durations: list[tuple[float, float]] = []
    for a in attempts:
        if a.claimed_confidence is not None:
            confidence.append((a.claimed_confidence, a.success))
        if a.estimated_cost is not None:
            costs.append((a.estimated_cost, a.cost))
        if a.estimated_duration_s is not None and a.success:
            durations.append((a.estimated_duration_s, a.duration_s))
    claimed = _mean([c for c, _ in confidence])
    rate = _mean([1.0 if ok else 0.0 for _, ok in confidence])
    est_cost, cost = _mean([e for e, _ in costs]), _mean([c for _, c in costs])
    est_time, took = _mean([e for e, _ in durations]), _mean([d for _, d in durations])
    return Calibration(
        confidence_attempts=len(confidence), claimed_confidence=claimed, success_rate=rate,
        confidence_gap=None if claimed is None or rate is None else claimed - rate,
        cost_attempts=len(costs), estimated_cost=est_cost, actual_cost=cost,
        cost_ratio=_ratio(cost, est_cost),
        duration_attempts=len(durations), estimated_duration_s=est_time,
        actual_duration_s=took, duration_ratio=_ratio(took, est_time))
