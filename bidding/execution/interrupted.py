"""An attempt interrupted or reported on: revoked, expired before its body started,
unrunnable on its node, past its hard time limit, retried by its body (``self.retry()``), or
reporting progress."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import update

from bidding import clock
from bidding.config import Settings
from bidding.execution.outcome import episode, to_retrying
from bidding.execution.report import exception_json
from bidding.execution.retry import retry_exclusions
from bidding.execution.running import Running, Start
from bidding.lifecycle import journal, states
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import Announcement
from bidding.store import write_session
from bidding.store.schema import AnnouncementRow

logger = logging.getLogger(__name__)


def revoked(settings: Settings, task_id: str, attempt: int, node: str, reason: str,
            now: float | None = None) -> bool:
    """Celery revoked the task on ``node`` (its message dropped, or its process terminated):
    FAILED with ``reason``. Nothing is charged and no episode counts against the node: the
    caller stopped it. Celery has stored REVOKED for the caller already. False when this
    attempt no longer holds the task (re-awarded, finished)."""
    now = clock.now() if now is None else now
    with write_session(settings.database_url) as session:
        return transition(session, task_id, states.FAILED,
                          Log(journal.TASK_FAILED, at=now,
                              detail={"error": reason, "revoked": True}),
                          Expect(states=states.IN_FLIGHT_STATES, attempt=attempt, node=node),
                          error=reason, finished_at=now, due_at=None)


def expired(settings: Settings, run: Running, error: BaseException,
            now: float | None = None) -> bool:
    """The attempt reached its node after its task's start-by time (its expiry or deadline):
    FAILED, logged EXPIRED with the reason, the body never run. Nothing is charged and no
    episode counts against the node: the caller's limit passed while the task waited, which
    says nothing of how the node works. False when this attempt no longer holds the task."""
    now = clock.now() if now is None else now
    reason = str(error)
    with write_session(settings.database_url) as session:
        return transition(session, run.task_id, states.FAILED,
                          Log(journal.EXPIRED, node=run.node, at=now, detail={"error": reason}),
                          Expect(states=(states.EXECUTING,), attempt=run.attempt, node=run.node),
                          error=reason, finished_at=now, due_at=None,
                          result=exception_json(error))


def unrunnable(settings: Settings, task_id: str, attempt: int, node: str, reason: str,
               exc: BaseException, now: float | None = None) -> Announcement | None:
    """``node``'s worker cannot run the task at all (no task of that name in its app): the
    task is FAILED with ``reason`` (sending it again would only repeat it) and counts against
    the node, which bid on work it cannot do. Returns the task's announcement, for telling
    its caller; None when this attempt no longer holds the task."""
    now = clock.now() if now is None else now
    with write_session(settings.database_url) as session:
        row = session.get(AnnouncementRow, task_id)
        if row is None or row.attempt != attempt or row.assigned_node != node:
            return None
        announcement = Announcement.model_validate(row.spec)
        run = Running(task_id, attempt, node, Start.FIRST, announcement, began=time.monotonic())
        failed = transition(session, task_id, states.FAILED,
                            Log(journal.TASK_FAILED, detail={"error": reason}, at=now),
                            Expect(states=states.IN_FLIGHT_STATES, attempt=attempt, node=node),
                            error=reason, finished_at=now, due_at=None, result=exception_json(exc))
        if failed:
            episode(session, run, success=False, now=now, cost=0.0, error=reason)
    return announcement if failed else None


def hard_timeout(settings: Settings, task_id: str, error: str) -> str | None:
    """The pool process was killed at the hard time limit: the attempt is FAILED.

    Called in the worker's main process (Celery reports hard timeouts there). Celery has already
    stored the failure for the caller, so this is final: no retry is planned, and the store
    agrees with what ``.get()`` saw. Returns the node whose attempt failed, or None when there
    was nothing to fail.
    """
    now = clock.now()
    with write_session(settings.database_url) as session:
        row = session.get(AnnouncementRow, task_id)
        if row is None or row.state != states.EXECUTING or row.assigned_node is None:
            return None
        node = row.assigned_node
        announcement = Announcement.model_validate(row.spec)
        run = Running(task_id, row.attempt, node, Start.FIRST, announcement,
                      began=time.monotonic() - (now - (row.started_at or now)))
        episode(session, run, success=False, now=now, cost=0.0, error=error)
        failed = transition(session, task_id, states.FAILED,
                            Log(journal.TASK_FAILED, at=now,
                                detail={"error": error, "why": "hard time limit"}),
                            Expect(attempt=row.attempt, node=node), error=error, finished_at=now)
    return node if failed else None


def retry_requested(settings: Settings, run: Running, delay: float,
                    args: Sequence[Any] | None = None,
                    kwargs: Mapping[str, Any] | None = None) -> float | None:
    """The body called ``self.retry(countdown=...)``: a new auction after ``delay`` seconds,
    with the ``args``/``kwargs`` it gave (Celery passes the request's own otherwise). When it
    is due, as written; None when the task had moved on."""
    if run.announcement is None:
        return None
    now = clock.now()
    announcement = run.announcement
    update: dict[str, Any] = {
        "attempt": announcement.attempt + 1,
        "failures": announcement.failures + 1,
        "silent_rounds": 0,
        "exclude_nodes": retry_exclusions(announcement, run.node),
        "announced_at": now,
    }
    if args is not None:
        update["args"] = list(args)
    if kwargs is not None:
        update["kwargs"] = dict(kwargs)
    nxt = announcement.model_copy(update=update)
    with write_session(settings.database_url) as session:
        moved = to_retrying(session, run, nxt, now, delay, "the task called self.retry()")
    return now + delay if moved else None


def report_progress(
    settings: Settings, run: Running, current: float, total: float, note: str
) -> dict[str, Any]:
    """Record a PROGRESS_UPDATE (AITP 5.3) and return the progress as stored."""
    percent = round(100.0 * current / total, 1) if total else None
    progress = {
        "current": current,
        "total": total,
        "percent": percent,
        "note": note,
        "node": run.node,
        "attempt": run.attempt,
        "at": clock.now(),
    }
    with write_session(settings.database_url) as session:
        session.execute(
            update(AnnouncementRow)
            .where(
                AnnouncementRow.task_id == run.task_id,
                AnnouncementRow.attempt == run.attempt,
                AnnouncementRow.state == states.EXECUTING,
            )
            .values(progress=progress)
        )
        journal.record(
            session,
            run.task_id,
            journal.PROGRESS_UPDATE,
            node=run.node,
            attempt=run.attempt,
            current=current,
            total=total,
            percent=percent,
            note=note,
        )
    return progress
