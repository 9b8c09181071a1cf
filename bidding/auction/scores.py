"""A bid's sub-scores and a node's learned trust, as pure functions (seed 000, AITP 4.1 and 7.1).

What a node says about itself in a bid: capability, experience, load, confidence, cost and trust.
Nothing here touches a broker or a database, so every number a bid carries can be tested alone.
The formulas strategies rank bids with are in ``bidding.strategies.formulas``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from bidding.strategies.formulas import skill_match

#: Seed 000: capability score when a task requires no skills ("assume capable").
NO_REQUIREMENT_CAPABILITY = 0.8
#: Seed 000: experience score of a node that has no episode of this task type.
NO_EXPERIENCE = 0.3
#: Seed 000: the load score never drops below this, so a busy node can still win on merit.
MIN_LOAD = 0.1
#: Weight, in episodes, of a node's declared trust against its observed success rate.
TRUST_PRIOR_WEIGHT = 10.0


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
    return smoothed_rate(len(outcomes), sum(1 for ok in outcomes if ok), prior, weight)


def smoothed_rate(attempts: int, successes: int, prior: float = 1.0,
                  weight: float = SUCCESS_PRIOR_EPISODES) -> float:
    """``estimated_success`` from counts: ``(successes + weight * prior) / (attempts +
    weight)``, as the announcer ranks a node by its stored record (attempts, successes)."""
    return (successes + weight * prior) / (attempts + weight)


def kin_prior(attempts: int, successes: int) -> float:
    """The prior of a node's estimate on a task type from its kin's pooled record there
    (``nodes.kin``): their rate, smoothed toward the optimistic 1.0 as a node's own estimate
    is; 1.0 without a record.

    bench/quality.py's simulated federation (replicas of eight kinds of node, each replica's
    true rates x0.9-1.05 of its kind's): at 32 to 256 nodes it came up to 2.3 points closer to
    the oracle that fills free slots first than the optimistic prior alone
    (``informed_confidence`` keeps it from ruling a node out).
    """
    if attempts <= 0:
        return 1.0
    return smoothed_rate(attempts, successes)


#: Weight, in episodes, of a node's longer record on a task type (its latest episodes before
#: and with the window, ``earlier``) as the prior of its estimate over the window.
LONGER_RECORD_EPISODES = 10.0
#: Weight, in episodes, of what the kin's record says of a node on a task type, as the prior
#: of its longer record there: at most this, and no more than the kin's attempts there (but
#: at least ``SUCCESS_PRIOR_EPISODES``).
KIN_RECORD_EPISODES = 80.0
#: Weight, in episodes, of the kin's node-wide rate in a node's own (``replica_factor``).
REPLICA_PRIOR_EPISODES = 20.0


def replica_factor(own: tuple[int, int], kin: tuple[int, int]) -> float:
    """How a node does beside its kin over everything it ran: its node-wide success rate
    (``own``: attempts, successes), smoothed toward the kin's, over the kin's (``kin``: their
    pooled node-wide record). 1.0 without a kin record; above 1 for a replica that does better.

    Replicas of one profile differ (a slower disk, a flakier network): a node-wide difference
    shows in every type it runs, so its whole record sees it long before its few episodes of
    one type can.
    """
    attempts, successes = kin
    if attempts <= 0:
        return 1.0
    kin_rate = smoothed_rate(attempts, successes)
    return smoothed_rate(*own, prior=kin_rate, weight=REPLICA_PRIOR_EPISODES) / kin_rate


def kin_informed_prior(kin: tuple[int, int], own_overall: tuple[int, int],
                       kin_overall: tuple[int, int]) -> tuple[float, float]:
    """What a node's kin say of it on a task type, as a prior and its weight in episodes: the
    kin's pooled rate there (``kin``: attempts, successes) times the node's ``replica_factor``,
    worth as many episodes as the kin ran the type, up to ``KIN_RECORD_EPISODES``; the
    optimistic 1.0, worth ``SUCCESS_PRIOR_EPISODES``, when they have no record there.
    """
    if kin[0] <= 0:
        return 1.0, SUCCESS_PRIOR_EPISODES
    # Worth up to KIN_RECORD_EPISODES: the kin's record on the type pools every replica's, and
    # the node's own node-wide record places it among them; a node's 30 episodes of the type
    # alone could not tell replicas a few points apart (bench/quality.py).
    prior = min(1.0, kin_prior(*kin) * replica_factor(own_overall, kin_overall))
    return prior, kin_weight(kin[0])


def kin_weight(attempts: int) -> float:
    """What the kin's record on a task type weighs as a prior, in episodes: as many as they
    ran the type (``attempts``), up to ``KIN_RECORD_EPISODES``, at least
    ``SUCCESS_PRIOR_EPISODES``."""
    return max(SUCCESS_PRIOR_EPISODES, min(KIN_RECORD_EPISODES, float(attempts)))


def informed_confidence(outcomes: Sequence[bool], kin: tuple[int, int], minimum: float,
                        earlier: Sequence[bool] = (), *, own_overall: tuple[int, int] = (0, 0),
                        kin_overall: tuple[int, int] = (0, 0),
                        record: tuple[int, int] = (0, 0)) -> float:
    """A bid's confidence: what the node's whole ``record`` on the task type says of it,
    smoothed toward its kin's rate there (``kin``), while its latest ``outcomes`` agree with
    that (``window_agrees``); otherwise, and for a node without kin (none of which has a
    record on the type), its estimate over the latest ``outcomes`` with the ``earlier`` ones
    as the prior (``windowed_confidence``). Never pushed under ``minimum`` (the
    announcement's ``min_confidence``) by a prior alone.

    Replicas of one profile differ by a few points, which the 30 episodes read cannot tell
    apart and their whole records can (bench/quality.py, 32 to 256 nodes); a node whose latest
    window is unlikely under its record (a node that started failing) is judged on its latest
    episodes instead. A lone node keeps the two speeds: at 8 nodes its whole record queued
    work behind the best nodes at 90% load (decision 0045).
    """
    read = (*outcomes, *earlier)
    own = estimated_success(outcomes)
    if kin[0] > 0:
        # A record the store has not counted up to the episodes read (a cached one, or none)
        # is no longer than they are.
        attempts, successes = record if record[0] >= len(read) else (
            len(read), sum(1 for ok in read if ok))
        whole = smoothed_rate(attempts, successes, prior=kin_prior(*kin),
                              weight=kin_weight(kin[0]))
        if window_agrees(outcomes, whole):
            return max(whole, min(own, minimum))
    return windowed_confidence(outcomes, kin, minimum, earlier, own_overall=own_overall,
                               kin_overall=kin_overall)


def windowed_confidence(outcomes: Sequence[bool], kin: tuple[int, int], minimum: float,
                        earlier: Sequence[bool] = (), *, own_overall: tuple[int, int] = (0, 0),
                        kin_overall: tuple[int, int] = (0, 0)) -> float:
    """The node's estimate over its latest ``outcomes``, with its longer record as the prior
    (those and the ``earlier`` outcomes before them, themselves smoothed toward what its kin's
    record says of it: their pooled rate on the type, ``kin``, times how the node does beside
    them over everything it ran, ``replica_factor`` of ``own_overall`` and ``kin_overall``),
    never pushed under ``minimum`` by the prior alone.

    Two speeds: the latest window (10 episodes) sees a node start failing within a few
    tasks; the longer record (30) tells apart nodes whose rates differ by a few points, which
    ten episodes cannot. In bench/quality.py at 8 nodes it came 0.4 points closer to the
    oracle that fills free slots first at 50% load, and no run's queue built up at 90%.

    The kin and the older episodes only move the estimate; only the latest window may rule
    a node out: while its estimate over them with the optimistic prior is at least
    ``minimum``, so is its confidence. Failures of a task's own making on one replica must
    not leave its type without a bidder.
    """
    prior, weight = kin_informed_prior(kin, own_overall, kin_overall)
    longer = estimated_success((*outcomes, *earlier), prior=prior, weight=weight)
    informed = estimated_success(outcomes, prior=longer, weight=LONGER_RECORD_EPISODES)
    own = estimated_success(outcomes)
    return max(informed, min(own, minimum))


#: How unlikely the latest window may be under a node's whole record before the record is
#: set aside for its latest episodes (``window_agrees``): at 1 in 1,000, five failures in ten
#: where the record says 0.9 still agree, six do not. bench/quality.py: 1% and 5% set good
#: replicas' records aside for an unlucky window too often (0.4 and 0.8 points further from
#: the oracle at 32 nodes), and a node that fails from mid-run on is still caught within a
#: few tasks.
RECORD_DOUBT = 0.001


def window_agrees(outcomes: Sequence[bool], rate: float) -> bool:
    """Whether the latest ``outcomes`` could come from a node that succeeds at ``rate``: the
    chance of at least as many failures in as many tries, and of at most as many, are both
    at least ``RECORD_DOUBT`` (1 in 1,000). A node that started failing (or that recovered)
    shows within a few tasks."""
    n = len(outcomes)
    failures = n - sum(1 for ok in outcomes if ok)
    fail = min(1.0, max(0.0, 1.0 - rate))
    chances = [math.comb(n, k) * fail**k * (1.0 - fail) ** (n - k) for k in range(n + 1)]
    return sum(chances[failures:]) >= RECORD_DOUBT and sum(chances[:failures + 1]) >= RECORD_DOUBT


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




def estimated_duration(durations: Sequence[float]) -> float | None:
    """The built-in bidder's estimate of an attempt's duration: the mean of the node's latest
    successful episodes of the task type (seconds); None without any (it does not guess)."""
    if not durations:
        return None
    return sum(durations) / len(durations)
