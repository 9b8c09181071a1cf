"""A node's bid: sub-scores from its profile and its history (seed 000, AITP 4.1), as a pure
function.

``compute_bid`` turns a profile and a ``NodeHistory`` into a ``Bid``, or a ``Refusal`` (seed
001's ``will_bid=False``) with the reason when the node cannot do the task. The node's own
worker calls it (``history.place_bid``), and so does a proxy bidder (``proxy``), on the same
inputs.
"""

from __future__ import annotations

from dataclasses import dataclass

from bidding import clock, resources
from bidding.auction import scores
from bidding.models import Announcement, Bid, Refusal
from bidding.nodes.profile import NodeProfile
from bidding.strategies.formulas import skill_match


@dataclass(frozen=True)
class NodeHistory:
    """What the store knows about a node when it bids."""

    #: Outcomes of its latest episodes of this task type (``bidding_experience_window``),
    #: newest first.
    outcomes: tuple[bool, ...] = ()
    #: Outcomes of the episodes before those, newest first (up to ``Settings.episodes_read``
    #: in all): its longer record, the prior of its confidence.
    earlier: tuple[bool, ...] = ()
    #: Durations (seconds) of the successful ones among them, newest first.
    durations: tuple[float, ...] = ()
    #: Failures of this task type within ``bidding_recent_failure_seconds``.
    recent_failures: int = 0
    #: Tasks awarded to it that have not finished.
    in_flight: int = 0
    #: All its episodes, and how many succeeded (for learned trust).
    attempts: int = 0
    successes: int = 0
    #: Its kin's pooled record on this task type (attempts, successes; ``nodes.kin``): the
    #: prior of its confidence. (0, 0): none known, the optimistic prior.
    kin: tuple[int, int] = (0, 0)
    #: Its kin's pooled record on everything they ran (attempts, successes): with its own
    #: (``attempts``, ``successes``), how this replica does beside them.
    kin_overall: tuple[int, int] = (0, 0)
    #: Its whole record on this task type (attempts, successes; ``nodes.records``): a
    #: replica's confidence while its latest window agrees with it
    #: (``scores.informed_confidence``). (0, 0): not read; its episodes read count instead.
    record: tuple[int, int] = (0, 0)


def refusal_reason(announcement: Announcement, profile: NodeProfile, now: float) -> str | None:
    """Why ``profile``'s node will not bid on ``announcement``, or None when it will."""
    start_by = announcement.start_by
    if start_by is not None and now > start_by:
        return "deadline passed" if start_by == announcement.deadline else "expired"
    if (
        announcement.required_skills
        and skill_match(announcement.required_skills, profile.capabilities) == 0
    ):
        return (
            f"no matching capability: task needs {', '.join(announcement.required_skills)}; "
            f"node has {', '.join(profile.capabilities)}"
        )
    # What it could never hold, however idle: its declared totals fall short.
    return resources.shortfall(announcement.resources, profile.resources)


def compute_bid(
    announcement: Announcement,
    profile: NodeProfile,
    history: NodeHistory,
    now: float | None = None,
) -> Bid | Refusal:
    """The bid ``profile``'s node makes for ``announcement`` given its ``history``, or its
    refusal."""
    now = clock.now() if now is None else now
    reason = refusal_reason(announcement, profile, now)
    if reason is not None:
        return Refusal(
            task_id=announcement.task_id,
            node=profile.name,
            attempt=announcement.attempt,
            reason=reason,
            bid_at=now,
        )
    capability = scores.capability_score(announcement.required_skills, profile.capabilities)
    matched = [s for s in announcement.required_skills if s in profile.capabilities]
    cost = scores.estimated_cost(profile.price_per_unit, announcement.units)
    return Bid(
        task_id=announcement.task_id,
        node=profile.name,
        attempt=announcement.attempt,
        skills=list(profile.capabilities),
        capability=capability,
        experience=scores.experience_score(history.outcomes),
        load=scores.load_score(history.in_flight, profile.capacity),
        confidence=scores.informed_confidence(
            history.outcomes, history.kin, announcement.min_confidence, history.earlier,
            own_overall=(history.attempts, history.successes),
            kin_overall=history.kin_overall, record=history.record),
        cost=cost,
        latency_ms=profile.latency_ms,
        trust=scores.learned_trust(profile.trust, history.successes, history.attempts),
        recent_failures=history.recent_failures,
        in_flight=history.in_flight,
        capacity=profile.capacity,
        is_preferred_node=announcement.preferred_node == profile.name,
        proposal=(
            f"{profile.name} offers {', '.join(matched) or 'general capacity'} "
            f"at {cost:.4f} for {announcement.units:g} unit(s), "
            f"~{profile.latency_ms:.0f} ms latency, "
            f"{history.in_flight}/{profile.capacity} busy"
        ),
        estimated_cost=cost,
        estimated_duration_s=scores.estimated_duration(history.durations),
        metadata={"content_confidence": scores.confidence_score(announcement.content)},
        bid_at=now,
    )
