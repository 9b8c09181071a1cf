"""Pure scoring functions: a node's sub-scores (seed 000) and the scores strategies use.

Nothing here touches a broker or a database, so every number a bid carries can be tested alone.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Seed 000: capability score when a task requires no skills ("assume capable").
NO_REQUIREMENT_CAPABILITY = 0.8
#: Seed 000: experience score of a node that has no episode of this task type.
NO_EXPERIENCE = 0.3
#: Seed 000: the load score never drops below this, so a busy node can still win on merit.
MIN_LOAD = 0.1
#: Weight, in episodes, of a node's declared trust against its observed success rate.
TRUST_PRIOR_WEIGHT = 10.0

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


def capability_score(required: Sequence[str], skills: Sequence[str]) -> float:
    """Seed 000's capability: 0.8 with no requirements, 0.5 for an unknown node, else the match."""
    if not required:
        return NO_REQUIREMENT_CAPABILITY
    if not skills:
        return 0.5
    return skill_match(required, skills)


def experience_score(outcomes: Sequence[bool]) -> float:
    """Success rate over the node's latest episodes of this task type; 0.3 with none (seed 000)."""
    if not outcomes:
        return NO_EXPERIENCE
    return sum(1 for ok in outcomes if ok) / len(outcomes)


def load_score(in_flight: int, capacity: int) -> float:
    """Availability: 1.0 when idle, falling with in-flight work against capacity, floored at 0.1."""
    if capacity <= 0:
        return MIN_LOAD
    return max(MIN_LOAD, 1.0 - in_flight / capacity)


def confidence_score(content: str) -> float:
    """Seed 000's heuristic self-assessment: short tasks 0.9, medium 0.7, long 0.5."""
    n = len(content)
    if n < 500:
        return 0.9
    if n < 2000:
        return 0.7
    return 0.5


#: Weight, in episodes, of the prior in a node's estimate of its success on a task type.
SUCCESS_PRIOR_EPISODES = 2.0


def estimated_success(outcomes: Sequence[bool], prior: float = 1.0,
                      weight: float = SUCCESS_PRIOR_EPISODES) -> float:
    """A node's confidence: its success rate on this task type, smoothed toward ``prior``.

    ``(successes + weight * prior) / (n + weight)`` (a Beta-prior mean). The default prior is
    optimistic (1.0): a node with no record of a task type bids as if it could do it, so a
    newcomer gets tried and earns a history; failures then lower its confidence quickly
    (bench/quality.py measured this against the seed 000 heuristic as the prior: it meets the
    load-spread target, which that one misses).
    """
    n = len(outcomes)
    return (sum(1 for ok in outcomes if ok) + weight * prior) / (n + weight)


def slot_share(in_flight: int, capacity: int) -> float:
    """How much of a free slot the task would get: 1 while the node has a free slot, then
    ``capacity / (in_flight + 1)``, so a full node wins only when it is proportionally better."""
    if capacity <= 0:
        return 0.0
    return min(1.0, capacity / (in_flight + 1))


def learned_trust(declared: float, successes: int, attempts: int) -> float:
    """Trust 0-100: the declared trust, moved toward the observed success rate as episodes accrue.

    A Beta-style blend: the profile's trust counts as ``TRUST_PRIOR_WEIGHT`` episodes.
    """
    if attempts <= 0:
        return declared
    blended = (declared * TRUST_PRIOR_WEIGHT + 100.0 * successes) / (TRUST_PRIOR_WEIGHT + attempts)
    return max(0.0, min(100.0, blended))


def estimated_cost(price_per_unit: float, units: float) -> float:
    """AITP 7.1: cost = price per unit * units consumed."""
    return price_per_unit * units


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
