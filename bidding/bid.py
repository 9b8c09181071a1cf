"""A node's bid: sub-scores from its profile and its history in the store (seed 000, AITP 4.1).

``compute_bid`` is pure; ``place_bid`` reads the node's history and calls it. A node refuses
(seed 001's ``will_bid=False``) with a reason instead of bidding when it cannot do the task.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Select, bindparam, func, select, union_all
from sqlalchemy.orm import Session

from bidding import scoring
from bidding.award import count_in_flight
from bidding.config import Settings
from bidding.models import Announcement, Bid, Refusal
from bidding.profile import NodeProfile
from bidding.store import read_session
from bidding.store.engine import core
from bidding.store.schema import Episode, Node


@dataclass(frozen=True)
class NodeHistory:
    """What the store knows about a node when it bids."""

    #: Outcomes of its latest episodes of this task type, newest first.
    outcomes: tuple[bool, ...] = ()
    #: Failures of this task type within ``bidding_recent_failure_seconds``.
    recent_failures: int = 0
    #: Tasks awarded to it that have not finished.
    in_flight: int = 0
    #: All its episodes, and how many succeeded (for learned trust).
    attempts: int = 0
    successes: int = 0


def refusal_reason(rfp: Announcement, profile: NodeProfile, now: float) -> str | None:
    """Why ``profile``'s node will not bid on ``rfp``, or None when it will."""
    if rfp.deadline is not None and now > rfp.deadline:
        return "deadline passed"
    if rfp.required_skills and scoring.skill_match(rfp.required_skills, profile.capabilities) == 0:
        return (
            f"no matching capability: task needs {', '.join(rfp.required_skills)}; "
            f"node has {', '.join(profile.capabilities)}"
        )
    return None


def compute_bid(
    rfp: Announcement, profile: NodeProfile, history: NodeHistory, now: float | None = None
) -> Bid | Refusal:
    """The bid ``profile``'s node makes for ``rfp`` given its ``history``, or its refusal."""
    now = time.time() if now is None else now
    reason = refusal_reason(rfp, profile, now)
    if reason is not None:
        return Refusal(task_id=rfp.task_id, node=profile.name, attempt=rfp.attempt,
                       reason=reason, bid_at=now)
    capability = scoring.capability_score(rfp.required_skills, profile.capabilities)
    matched = [s for s in rfp.required_skills if s in profile.capabilities]
    cost = scoring.estimated_cost(profile.price_per_unit, rfp.units)
    return Bid(
        task_id=rfp.task_id,
        node=profile.name,
        attempt=rfp.attempt,
        skills=list(profile.capabilities),
        capability=capability,
        experience=scoring.experience_score(history.outcomes),
        load=scoring.load_score(history.in_flight, profile.capacity),
        confidence=scoring.estimated_success(history.outcomes),
        cost=cost,
        latency_ms=profile.latency_ms,
        trust=scoring.learned_trust(profile.trust, history.successes, history.attempts),
        recent_failures=history.recent_failures,
        in_flight=history.in_flight,
        capacity=profile.capacity,
        is_preferred_node=rfp.preferred_node == profile.name,
        proposal=(
            f"{profile.name} offers {', '.join(matched) or 'general capacity'} "
            f"at {cost:.4f} for {rfp.units:g} unit(s), ~{profile.latency_ms:.0f} ms latency, "
            f"{history.in_flight}/{profile.capacity} busy"
        ),
        metadata={"content_confidence": scoring.confidence_score(rfp.content)},
        bid_at=now,
    )


def gather_history(
    settings: Settings, node: str, task_type: str, now: float | None = None
) -> NodeHistory:
    """Read ``node``'s history from the store: recent episodes, in-flight work, trust inputs."""
    return gather_histories(settings, [node], task_type, now)[node]


# Built once: constructing these statements cost more than running them (bench/latency.py).
_RECENT_FAILURES_OF = (select(Episode.node, func.count())
                       .where(Episode.node.in_(bindparam("nodes", expanding=True)),
                              Episode.task_type == bindparam("task_type"),
                              Episode.success.is_(False),
                              Episode.finished_at >= bindparam("since"))
                       .group_by(Episode.node))
# The nodes' records, kept with their episodes (counting them grew with a node's age).
_TOTALS_OF = (select(Node.name, Node.attempts, Node.successes)
              .where(Node.name.in_(bindparam("nodes", expanding=True))))
_latest_of: dict[int, Select[tuple[str, bool, float]]] = {}


def _latest_of_nodes(count: int) -> Select[tuple[str, bool, float]]:
    """The latest episodes of ``count`` nodes in one statement: one index range scan each
    (``ix_bidding_episodes_node_type``), however long a node's history is. Built once per
    count: building a statement costs more than running it."""
    statement = _latest_of.get(count)
    if statement is None:
        parts = [select(Episode.node, Episode.success, Episode.finished_at)
                 .where(Episode.node == bindparam(f"node_{i}"),
                        Episode.task_type == bindparam("task_type"))
                 .order_by(Episode.finished_at.desc())
                 .limit(bindparam("limit")).subquery(f"latest_{i}")
                 for i in range(count)]
        statement = cast(Select[tuple[str, bool, float]],
                         union_all(*(select(part) for part in parts)))
        _latest_of[count] = statement
    return statement


def gather_histories(
    settings: Settings, nodes: Sequence[str], task_type: str, now: float | None = None
) -> dict[str, NodeHistory]:
    """The histories of ``nodes`` (``gather_history``), read together: four statements in
    all, not four per node (a proxy bidder reads every candidate's for one auction)."""
    if not nodes:
        return {}
    with read_session(settings.database_url) as session:
        return read_histories(session, settings, nodes, task_type, now)


def read_histories(
    session: Session, settings: Settings, nodes: Sequence[str], task_type: str,
    now: float | None = None, in_flight: dict[str, int] | None = None,
) -> dict[str, NodeHistory]:
    """``gather_histories`` in the caller's transaction. ``in_flight``: the nodes' counts, read
    already (the award's, under its lock), which saves counting them again."""
    now = time.time() if now is None else now
    if not nodes:
        return {}
    names = list(dict.fromkeys(nodes))
    params = {f"node_{i}": name for i, name in enumerate(names)}
    conn = core(session)
    latest = conn.execute(_latest_of_nodes(len(names)),
                          {**params, "task_type": task_type,
                           "limit": settings.experience_window}).all()
    failures = {row[0]: row[1] for row in conn.execute(_RECENT_FAILURES_OF, {
        "nodes": names, "task_type": task_type,
        "since": now - settings.recent_failure_seconds})}
    totals = {row.name: (row.attempts, row.successes)
              for row in conn.execute(_TOTALS_OF, {"nodes": names})}
    if in_flight is None:
        in_flight = count_in_flight(session, names)
    outcomes: dict[str, list[tuple[float, bool]]] = {name: [] for name in names}
    for row in latest:
        outcomes[row.node].append((row.finished_at, bool(row.success)))
    out = {}
    for name in names:
        newest_first = sorted(outcomes[name], key=lambda pair: pair[0], reverse=True)
        attempts, successes = totals.get(name, (0, 0))
        out[name] = NodeHistory(
            outcomes=tuple(ok for _, ok in newest_first),
            recent_failures=int(failures.get(name, 0)),
            in_flight=int(in_flight.get(name, 0)),
            attempts=int(attempts),
            successes=int(successes),
        )
    return out


_history: dict[tuple[str, str, str], tuple[float, int | None, NodeHistory]] = {}


def cached_history(settings: Settings, node: str, task_type: str, now: float | None = None,
                   version: int | None = None) -> NodeHistory:
    """``gather_history``, reused while ``version`` is unchanged, for at most
    ``bidding_history_cache_seconds``.

    Four queries per bid were most of a bid's cost (bench/latency.py). ``version`` (from the
    bid board) changes whenever the node finishes an attempt, so a finished attempt counts in
    the very next bid; work awarded meanwhile is re-counted by the award under its lock.
    """
    return cached_histories(settings, [node], task_type, {node: version}, now)[node]


def cached_histories(settings: Settings, nodes: Sequence[str], task_type: str,
                     versions: dict[str, int | None], now: float | None = None
                     ) -> dict[str, NodeHistory]:
    """``cached_history`` of several nodes: the ones not cached (or changed) are read together
    (``gather_histories``); ``versions`` are their history versions on the bid board."""
    ttl = settings.history_cache_seconds
    clock = time.monotonic()
    out: dict[str, NodeHistory] = {}
    stale: list[str] = []
    for node in nodes:
        version = versions.get(node)
        hit = _history.get((settings.database_url, node, task_type))
        # Without a version (the store board, e.g. on RabbitMQ) nothing says when the record
        # changed: read it every time rather than bid on a stale one.
        if (ttl > 0 and version is not None and hit is not None and clock - hit[0] < ttl
                and hit[1] == version):
            out[node] = hit[2]
        else:
            stale.append(node)
    if stale:
        read = gather_histories(settings, stale, task_type, now)
        for node, history in read.items():
            _history[(settings.database_url, node, task_type)] = (clock, versions.get(node),
                                                                  history)
        out.update(read)
    return out


def forget_history() -> None:
    """Drop cached histories (tests, and after this process changed a node's record)."""
    _history.clear()


def place_bid(settings: Settings, rfp: Announcement, profile: NodeProfile,
              version: int | None = None) -> Bid | Refusal:
    """Compute this node's answer to ``rfp`` from its profile and (cached) store history;
    ``version`` is the node's history version on the bid board (see ``cached_history``)."""
    now = time.time()
    if refusal_reason(rfp, profile, now) is None:
        history = cached_history(settings, profile.name, rfp.task_type, now, version)
    else:
        history = NodeHistory()
    return compute_bid(rfp, profile, history, now)
