"""Announcing a task: build and validate the announcement, pick candidates, ask them to bid.

Candidates are chosen as the Kubernetes scheduler does: filter (live, at least one required
skill), then score and cap. Above ``candidate_cap`` eligible nodes we keep the best half by a
prior score (skill match and declared trust) and draw the rest at random, so good nodes are
always asked and new or unlucky ones still get a chance to earn a history.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from celery import Celery
from celery.result import AsyncResult
from pydantic import ValidationError
from sqlalchemy import Table, bindparam, insert, select
from sqlalchemy.orm import Session

from bidding import journal, lifecycle, scoring
from bidding.award import close_auction, route_award
from bidding.board import get_board
from bidding.canvas import fail_caller
from bidding.config import Settings
from bidding.consumer import request_bids
from bidding.errors import ConfigurationError, EscalatedError, NoBidsError
from bidding.models import OPTION_KEYS, Announcement, describe_validation
from bidding.proxy import award_by_proxy
from bidding.registry import LiveNode, live_nodes
from bidding.store import ensure_schema, read_session, write_session
from bidding.store.schema import Announcement as AnnouncementRow
from bidding.strategies import decides_at_once, resolve_strategy, strategy_name
from bidding.transition import transition

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger(__name__)


def check_options(options: Mapping[str, Any], where: str) -> None:
    """Refuse unknown ``bidding={...}`` keys, naming them and listing the valid ones."""
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown option(s) {', '.join(unknown)}; "
            f"valid options: {', '.join(OPTION_KEYS)}"
        )


def _strategy_spec(value: Any) -> str:
    """A strategy as a string that a worker can resolve (names and importable classes)."""
    if isinstance(value, str):
        resolve_strategy(value)  # fail here, at the boundary, not later on a worker
        return value
    name = strategy_name(resolve_strategy(value))
    try:
        resolve_strategy(name)
    except ConfigurationError:
        raise ConfigurationError(
            f"strategy: {value!r} cannot be rebuilt on a worker; register it with "
            "bidding.register_strategy(name, factory) in your app module and pass the name"
        ) from None
    return name


def _skill_list(skills: Any) -> list[Any]:
    """A single skill name counts as one skill, not as its letters."""
    return [skills] if isinstance(skills, str) else list(skills)


def arguments_json(task_name: str, args: Sequence[Any] | None,
                   kwargs: Mapping[str, Any] | None) -> str:
    """The JSON of a call's arguments; a clear error, naming the task, if JSON cannot carry
    them (a new call, or ``self.retry(args=...)``)."""
    try:
        return json.dumps([list(args or ()), dict(kwargs or {})])
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"args/kwargs of {task_name}: not JSON serializable ({exc}); "
            "celery-bidding sends JSON only"
        ) from None


def build_announcement(
    task: Task,
    settings: Settings,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    options: Mapping[str, Any],
    task_id: str | None = None,
) -> Announcement:
    """Merge task-level defaults, call options and settings into a validated announcement."""
    check_options(options, "bidding")
    args = list(args or ())
    kwargs = dict(kwargs or {})
    payload = arguments_json(task.name, args, kwargs)
    merged: dict[str, Any] = {
        "task_type": getattr(task, "task_type", None) or task.name.rsplit(".", 1)[-1],
        "required_skills": _skill_list(getattr(task, "required_skills", None) or ()),
        "strategy": settings.strategy,
        "no_bid": settings.no_bid,
        "window": settings.window,
        "min_confidence": settings.min_confidence,
        "min_trust": settings.min_trust,
        "candidate_cap": settings.candidate_cap,
        # Kept with the task: the sweepers that watch it go by the announcer's limit.
        "schedule_to_start_timeout": settings.schedule_to_start_timeout or None,
        "content": payload,
    }
    merged.update({k: v for k, v in options.items() if v is not None})
    merged["strategy"] = _strategy_spec(merged["strategy"])
    merged["required_skills"] = _skill_list(merged.get("required_skills") or ())
    try:
        return Announcement(
            task_id=task_id or str(uuid.uuid4()),
            task_name=task.name,
            args=args,
            kwargs=kwargs,
            **merged,
        )
    except ValidationError as exc:
        raise ConfigurationError(
            f"bidding options of {task.name}: {describe_validation(exc)}"
        ) from None


def prior_score(rfp: Announcement, node: LiveNode) -> float:
    """What the producer can tell about a node before it bids: skill match, and its trust as
    learned from its record (the declared trust moved toward its success rate, as in bids).

    Declared trust alone let a node that claims every skill and high trust hold a place in the
    best half however often it failed (bench/quality.py --caps, 32 nodes: cap 4 got 76.7%
    success with declared trust, 85.6% with learned trust).
    """
    match = scoring.capability_score(rfp.required_skills, node.capabilities)
    trust = scoring.learned_trust(node.trust, node.successes, node.attempts)
    # In bands of 10 points, as the Kubernetes scheduler scores in coarse integers: nodes with
    # about the same record tie, and ties are drawn at random, so the best half rotates among
    # them instead of going to the same few for ever.
    return 0.7 * match + 0.3 * (trust // 10) / 10.0


def select_candidates(
    rfp: Announcement, live: Sequence[LiveNode], rng: random.Random | None = None
) -> list[str]:
    """Live nodes that could bid (filter), capped at ``rfp.candidate_cap`` (best half + random).

    Nodes in ``rfp.exclude_nodes`` (they failed this task or went offline with it) are left out.
    """
    required = set(rfp.required_skills)
    excluded = set(rfp.exclude_nodes)
    eligible = [n for n in live if n.name not in excluded
                and (not required or required & set(n.capabilities))]
    cap = rfp.candidate_cap
    if cap == 0 or len(eligible) <= cap:
        return [n.name for n in eligible]
    rng = rng or random.Random()
    ranked = sorted(eligible, key=lambda n: (-prior_score(rfp, n), rng.random()))
    keep = math.ceil(cap / 2)
    chosen = ranked[:keep] + rng.sample(ranked[keep:], cap - keep)
    return [n.name for n in chosen]


def announce(
    app: Celery,
    settings: Settings,
    rfp: Announcement,
    *,
    delay: float = 0.0,
    fresh_id: bool = False,
) -> AsyncResult:
    """Record ``rfp``, ask the candidates to bid (now, or after ``delay`` seconds), and return
    the AsyncResult of its execution. ``fresh_id``: the task id was generated for this call
    (not given by the caller), so no other auction can have it."""
    if settings.auto_migrate:
        ensure_schema(settings.database_url)
    if delay > 0:
        with write_session(settings.database_url) as session:
            session.add(_row(rfp, lifecycle.PENDING, [], due_at=rfp.announced_at + delay))
            journal.record(session, rfp.task_id, journal.SCHEDULED, attempt=rfp.attempt,
                           at=rfp.announced_at, task_type=rfp.task_type, delay_s=delay)
    else:
        open_auction(app, settings, rfp, new=True, fresh_id=fresh_id)
    return AsyncResult(rfp.task_id, app=app)


def row_values(rfp: Announcement, state: str, candidates: list[str], *,
               due_at: float | None = None) -> dict[str, Any]:
    """The announcements-table columns of ``rfp`` in ``state``."""
    return {
        "task_id": rfp.task_id, "task_name": rfp.task_name, "task_type": rfp.task_type,
        "content": rfp.content, "required_skills": rfp.required_skills,
        "preferred_node": rfp.preferred_node, "priority": rfp.priority,
        "deadline": rfp.deadline, "budget": rfp.budget, "strategy": rfp.strategy,
        "spec": rfp.model_dump(mode="json"), "state": state, "attempt": rfp.attempt,
        "candidates": candidates, "expected_bids": len(candidates),
        "announced_at": rfp.announced_at, "closes_at": rfp.announced_at + rfp.window,
        "due_at": due_at,
    }


def _row(rfp: Announcement, state: str, candidates: list[str], *,
         due_at: float | None = None) -> AnnouncementRow:
    return AnnouncementRow(**row_values(rfp, state, candidates, due_at=due_at))


_INSERT_ANNOUNCEMENT = insert(cast(Table, AnnouncementRow.__table__))


def open_auction(app: Celery, settings: Settings, rfp: Announcement, *, new: bool,
                 fresh_id: bool = False) -> bool:
    """Start the auction of ``rfp`` (a new task, or a due retry, deferral or scheduled start).

    With no candidate the task is deferred (if its fallbacks say so), or the auction closes at
    once with the no-bid outcome. False when a due task was already taken by another sweeper.
    """
    live = live_nodes(settings)
    candidates = select_candidates(rfp, live)
    proxy = (rfp.bid_mode or settings.bid_mode) == "proxy" and bool(candidates)
    if proxy and new and decides_at_once(resolve_strategy(rfp.strategy)):
        # The announcement, its bids and its award in one transaction.
        if _award_by_proxy(app, settings, rfp, live, candidates,
                           opening=lambda session: _record_new(session, rfp, candidates)):
            return True
        proxy = False  # nothing was written: announce as usual, asking the candidates
    defer = (not candidates and rfp.fallbacks.on_capability_unavailable == "defer"
             and (rfp.deadline is None or rfp.deadline > time.time()))
    # A new auction on the Redis board asks for bids before its row is written: the answers go
    # to the board, not the store, and the award waits for the row (close_auction). The row's
    # insert then overlaps the bidding instead of delaying it.
    # Only for an id generated for this call: a caller's own id may belong to an existing task,
    # whose open auction must not receive answers meant for this one.
    early = (not proxy and new and fresh_id and bool(candidates)
             and get_board(settings, app).writes_on_award)
    if early:
        request_bids(settings, app, rfp, candidates)
    deferred: bool | str = False
    with write_session(settings.database_url) as session:
        if defer:
            deferred = _defer(session, rfp, new=new)
            if not deferred:
                return False
        elif new:
            _record_new(session, rfp, candidates)
        elif not transition(
            session, rfp.task_id, lifecycle.BIDDING, kind=journal.ANNOUNCED,
            from_states=lifecycle.DUE_STATES, expect_attempt=rfp.attempt,
            detail={"task_type": rfp.task_type, "candidates": candidates},
            spec=rfp.model_dump(mode="json"), candidates=candidates,
            expected_bids=len(candidates), bids_received=0, due_at=None,
            closes_at=rfp.announced_at + rfp.window, assigned_node=None, awarded_at=None,
        ):
            return False
    if defer:
        if isinstance(deferred, str):
            # After the commit: errbacks may run here, and must not hold the write lock.
            escalate(app, settings, rfp, deferred)
        return True
    if not candidates:
        close_auction(settings, app, rfp.task_id, rfp.attempt, closed_by="no candidates")
    elif proxy:
        if not _award_by_proxy(app, settings, rfp, live, candidates):
            request_bids(settings, app, rfp, candidates)
    elif not early:
        request_bids(settings, app, rfp, candidates)
    return True


def _record_new(session: Session, rfp: Announcement, candidates: list[str]) -> None:
    """Write a new announcement, open for bids, and its ANNOUNCED message."""
    # Core statements: the caller's path is the hottest in a burst.
    session.execute(_INSERT_ANNOUNCEMENT, row_values(rfp, lifecycle.BIDDING, candidates))
    journal.write(session, [journal.message(
        rfp.task_id, journal.ANNOUNCED, attempt=rfp.attempt, at=rfp.announced_at,
        task_type=rfp.task_type, candidates=candidates, required_skills=rfp.required_skills)])


def _award_by_proxy(app: Celery, settings: Settings, rfp: Announcement,
                    live: Sequence[LiveNode], candidates: Sequence[str],
                    opening: Callable[[Session], None] | None = None) -> bool:
    """Bid for the candidates and award now (bidding.proxy), then route the award. False,
    with the error logged, when no award could be committed: the caller then asks the
    candidates, so the auction still runs."""
    by_name = {node.name: node for node in live}
    try:
        award = award_by_proxy(settings, app, rfp, [by_name[name] for name in candidates],
                               opening)
    except Exception:
        logger.exception("proxy bids for %s failed; asking the candidates instead", rfp.task_id)
        return False
    if award is not None:
        route_award(app, settings, rfp, award)
    return True


def _defer(session: Session, rfp: Announcement, *, new: bool) -> bool | str:
    """No live node can do ``rfp``: announce it again later, or escalate after too many tries
    (then the reason is returned: the caller escalates once the transaction has committed)."""
    fb = rfp.fallbacks
    now = time.time()
    if rfp.deferrals >= fb.max_deferrals:
        reason = (f"deferred {rfp.deferrals} times: no live node offers "
                  f"{', '.join(rfp.required_skills) or 'any skill'}")
        if new:  # pragma: no cover - max_deferrals >= 1, so a new task always defers first
            session.add(_row(rfp, lifecycle.DEFERRED, []))
        if not transition(session, rfp.task_id, lifecycle.ESCALATED, kind=journal.ESCALATED,
                          from_states=(lifecycle.DEFERRED,), detail={"reason": reason},
                          error=reason, finished_at=now, due_at=None):
            return False
        return reason
    later = rfp.model_copy(update={"deferrals": rfp.deferrals + 1})
    due = now + fb.defer_seconds
    detail: dict[str, Any] = {
        "reason": "no live node offers " + (", ".join(rfp.required_skills) or "any skill"),
        "retry_in_s": fb.defer_seconds, "deferrals": later.deferrals}
    if new:
        session.add(_row(later, lifecycle.DEFERRED, [], due_at=due))
        journal.record(session, rfp.task_id, journal.DEFERRED, attempt=rfp.attempt, at=now,
                       **detail)
        return True
    return transition(session, rfp.task_id, lifecycle.DEFERRED, kind=journal.DEFERRED,
                      from_states=lifecycle.DUE_STATES, expect_attempt=rfp.attempt, detail=detail,
                      spec=later.model_dump(mode="json"), due_at=due)


def escalate(app: Celery, settings: Settings, rfp: Announcement, reason: str) -> None:
    """Fail the caller's result with :class:`EscalatedError` and notify (task_escalated)."""
    from bidding.signals import notify, task_escalated

    fail_caller(app, rfp, EscalatedError(reason))
    notify(settings, task_escalated, "task_escalated", task_id=rfp.task_id, reason=reason)


_DUE = (
    select(AnnouncementRow.spec)
    .where(AnnouncementRow.state.in_(sorted(lifecycle.DUE_STATES)),
           AnnouncementRow.due_at <= bindparam("now"))
    .order_by(AnnouncementRow.due_at)
    .limit(bindparam("limit"))
)


def announce_due(settings: Settings, app: Celery, now: float | None = None,
                 limit: int = 100) -> int:
    """Announce every task whose scheduled start, retry backoff or deferral has come."""
    now = time.time() if now is None else now
    with read_session(settings.database_url) as session:
        due = session.execute(_DUE, {"now": now, "limit": limit}).scalars().all()
    opened = 0
    for spec in due:
        rfp = Announcement.model_validate(spec).model_copy(update={"announced_at": now})
        if rfp.deadline is not None and now > rfp.deadline:
            _expire(settings, app, rfp)
        elif open_auction(app, settings, rfp, new=False):
            opened += 1
    return opened


def _expire(settings: Settings, app: Celery, rfp: Announcement) -> None:
    """A waiting task whose deadline passed is never started: FAILED."""
    reason = "deadline passed before the task could start"
    with write_session(settings.database_url) as session:
        moved = transition(session, rfp.task_id, lifecycle.FAILED, kind=journal.TASK_FAILED,
                           from_states=lifecycle.DUE_STATES, expect_attempt=rfp.attempt,
                           detail={"error": reason}, error=reason, finished_at=time.time(),
                           due_at=None)
    if moved:
        fail_caller(app, rfp, NoBidsError(reason))
