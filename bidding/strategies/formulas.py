"""The formulas strategies rank with, as pure functions: skill match, slot share, seed 000's
composite score and AITP 4.2's routing score.

Nothing here touches a broker or a database, so every number a score carries can be tested alone.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Seed 000 composite weights.
COMPOSITE_WEIGHTS: dict[str, float] = {
    "capability": 0.40,
    "experience": 0.30,
    "load": 0.20,
    "confidence": 0.10,
}


PREFERRED_NODE_BONUS = 1.1


RECENT_FAILURE_PENALTY = 0.8


#: The penalty applies when a node has MORE than this many recent failures (seed 000: > 2).
RECENT_FAILURE_THRESHOLD = 2


def skill_match(required: Sequence[str], skills: Sequence[str]) -> float:
    """Fraction of the required skills the node has (seed 001); 0.0 when nothing is required."""
    if not required:
        return 0.0
    have = set(skills)
    return sum(1 for s in set(required) if s in have) / len(set(required))


def slot_share(in_flight: int, capacity: int) -> float:
    """How much of a free slot the task would get: 1 while the node has a free slot, then
    ``capacity / (in_flight + 1)``, so a full node wins only when it is proportionally better."""
    if capacity <= 0:
        return 0.0
    return min(1.0, capacity / (in_flight + 1))


def composite_score(
    capability: float,
    experience: float,
    load: float,
    confidence: float,
    *,
    is_preferred_node: bool = False,
    recent_failures: int = 0,
) -> tuple[float, dict[str, float], dict[str, float]]:
    """Seed 000's composite: 40/30/20/10, x1.1 preferred node, x0.8 after > 2 failures, cap 1.0.

    Returns the total, the weighted terms and the multipliers applied.
    """
    terms = {
        "capability": COMPOSITE_WEIGHTS["capability"] * capability,
        "experience": COMPOSITE_WEIGHTS["experience"] * experience,
        "load": COMPOSITE_WEIGHTS["load"] * load,
        "confidence": COMPOSITE_WEIGHTS["confidence"] * confidence,
    }
    total = sum(terms.values())
    multipliers: dict[str, float] = {}
    if is_preferred_node:
        multipliers["preferred_node"] = PREFERRED_NODE_BONUS
        total *= PREFERRED_NODE_BONUS
    if recent_failures > RECENT_FAILURE_THRESHOLD:
        multipliers["recent_failures"] = RECENT_FAILURE_PENALTY
        total *= RECENT_FAILURE_PENALTY
    return min(1.0, total), terms, multipliers


def routing_score(
    capability: float, trust: float, latency_ms: float, cost: float, max_cost: float
) -> tuple[float, dict[str, float]]:
    """AITP 4.2 routing score, with the document's slip corrected.

    The document writes ``(1 - latency/1000 * 0.2)``; the intended term is
    ``(1 - latency/1000) * 0.2`` (and likewise for cost), so each term is in [0, weight].
    Latency above 1 s and cost above ``max_cost`` clamp to 0 rather than going negative;
    with ``max_cost == 0`` every bid is free and the cost term is full.
    """
    latency_term = max(0.0, 1.0 - latency_ms / 1000.0)
    cost_term = 1.0 if max_cost <= 0 else max(0.0, 1.0 - cost / max_cost)
    terms = {
        "capability": 0.3 * capability,
        "trust": 0.3 * (trust / 100.0),
        "latency": 0.2 * latency_term,
        "cost": 0.2 * cost_term,
    }
    return sum(terms.values()), terms
