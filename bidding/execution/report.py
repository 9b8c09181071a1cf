"""A task's final outcome as its caller must see it: kept in the store, and written to the
result backend again whenever the first write may have failed.

The store is the source of truth: a finished task's row holds its JSON result
(``{"value": ...}``) or its error (``{"exception": {...}}``, Celery's JSON form of an
exception). Celery writes the result backend after the body returns; if that write fails (the
broker, which is often the backend too, is restarting), or the worker dies between the store
and the backend, or a failure no worker sees cannot be stored for the caller, the row gets a
``report_due`` time, and a sweeper (``report_results``) compares the backend with the store
and writes the store's outcome where the backend lacks it. ``.get()`` in any process then
returns the real result or the real error, never a transport error for a task that succeeded.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, cast

from celery import Celery, states
from sqlalchemy import CursorResult, bindparam, func, select, update

from bidding import clock
from bidding.config import Settings
from bidding.context import Context
from bidding.errors import BiddingError
from bidding.execution.canvas import caller_request
from bidding.lifecycle import events
from bidding.lifecycle import states as lifecycle
from bidding.models import Announcement
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow

logger = logging.getLogger(__name__)

#: Seconds a sweeper holds a due report while it writes it (others leave it alone).
REPORT_LEASE = 30.0
#: Seconds before a report whose write failed (the backend still down) is tried again.
REPORT_BACKOFF = 5.0


def value_json(value: Any) -> dict[str, Any]:
    """The stored outcome of a task that returned ``value``."""
    return {"value": value}


def exception_json(exc: BaseException) -> dict[str, Any]:
    """The stored outcome of a task that failed with ``exc``: Celery's JSON form of an
    exception (type, module, arguments), which its result backend turns back into one."""
    return {"exception": {"exc_type": type(exc).__name__, "exc_module": type(exc).__module__,
                          "exc_message": [str(a) for a in exc.args] or [str(exc)]}}


_DUE = (select(AnnouncementRow.task_id, AnnouncementRow.state, AnnouncementRow.result,
               AnnouncementRow.error, AnnouncementRow.spec)
        .where(AnnouncementRow.report_due <= bindparam("now"))
        .order_by(AnnouncementRow.report_due)
        .limit(bindparam("limit")))
#: When the next outcome is due for the result backend (None: none): what an idle sweeper
#: reads instead of running ``report_results`` (``auction.idle_look``).
NEXT_REPORT = select(func.min(AnnouncementRow.report_due)).scalar_subquery()
_LEASE = (update(AnnouncementRow)
          .where(AnnouncementRow.task_id == bindparam("r_task"),
                 AnnouncementRow.report_due <= bindparam("r_now"))
          .values(report_due=bindparam("r_lease")))
_DONE = (update(AnnouncementRow)
         .where(AnnouncementRow.task_id == bindparam("r_task"),
                AnnouncementRow.report_due == bindparam("r_lease"))
         .values(report_due=bindparam("r_next")))


def fail_caller(ctx: Context, announcement: Announcement,
                exc: BaseException) -> None:
    """Store ``exc`` as ``announcement``'s result, and run what its canvas says happens on failure
    (errbacks, the chain after it, its chord), as a worker would; for failures no worker sees
    (no bids, escalated, a lost winner with ``on_agent_offline="fail"``).

    The store keeps the error either way; when the backend cannot be written (the broker that
    is also the backend is restarting), a sweeper writes it once it can.
    """
    # Flower builds its task list from events: without one it would show the task's last
    # phase (or PENDING) for ever.
    events.failed(ctx.app, announcement, exc)
    try:
        ctx.app.backend.mark_as_failure(
            announcement.task_id, exc, request=caller_request(announcement)
        )
    except Exception as error:
        logger.warning(
            "task %s: storing its failure for the caller failed (%s); a sweeper writes it again",
            announcement.task_id,
            error,
        )
        report_later(ctx.settings, announcement.task_id, REPORT_BACKOFF, exception_json(exc))
        return
    with write_session(ctx.settings.database_url) as session:
        session.execute(
            update(AnnouncementRow)
            .where(
                AnnouncementRow.task_id == announcement.task_id, AnnouncementRow.result.is_(None)
            )
            .values(result=exception_json(exc))
        )


_VIEW = select(
    AnnouncementRow.state,
    AnnouncementRow.worker,
    AnnouncementRow.result,
    AnnouncementRow.started_at,
    AnnouncementRow.finished_at,
).where(AnnouncementRow.task_id == bindparam("task_id"))


#: Seconds after which ``restore_view`` sends its event once more. The worker's main process
#: sends the dropped copy's ``task-received`` and ``task-started`` from a buffer it flushes on
#: its event loop, ``task-started`` only once the pool has told it the copy was accepted; on a
#: loaded host they can reach Flower after the pool process's restoring event, and Flower,
#: which shows a task on the worker of the last event it got, then showed the dropped copy's
#: worker for good (seen in the end-to-end test of Flower on a loaded run).
VIEW_RESENT_AFTER = 1.0


def restore_view(ctx: Context, task_id: str) -> None:
    """After a node dropped a stale copy of a task's execution (its worker had already sent
    ``task-received`` and ``task-started`` for it), send the task's real latest event again
    from the worker that ran it, so that Flower, which shows a task on the worker of its last
    event, shows it where it ran (now, and once more ``VIEW_RESENT_AFTER`` seconds later).
    Sent, as Celery's ``Task.send_event`` is, whatever the app's event settings: the copy's
    own events were sent already. Never raises: it only mends a view, and the copy must end
    dropped (Celery's Ignore) whatever the store does; a store that cannot be read now (a
    dropped connection) leaves Flower's view as it was."""
    try:
        with read_session(ctx.settings.database_url) as session:
            row = session.execute(_VIEW, {"task_id": task_id}).one_or_none()
    except Exception as exc:
        # An error raised here would reach the caller as the task's outcome: the chaos soak
        # saw a copy dropped while its store connection was severed fail a task that ran.
        logger.warning("task %s: Flower's view of it not restored (%s: %s)", task_id,
                       type(exc).__name__, exc)
        return
    if row is None or row.worker is None:
        return
    fields: dict[str, Any] = {}
    if row.state == lifecycle.SUCCESS:
        kind = "task-succeeded"
        fields["result"] = repr((row.result or {}).get("value"))
        if row.started_at and row.finished_at:
            fields["runtime"] = row.finished_at - row.started_at
    elif row.state == lifecycle.EXECUTING:
        kind = events.EXECUTING
    elif row.state == lifecycle.FAILED and (row.result or {}).get("exception"):
        stored = row.result["exception"]
        kind = "task-failed"
        message = " ".join(stored.get("exc_message") or [])
        fields.update(exception=f"{stored.get('exc_type')}({message!r})", traceback="")
    else:
        return
    send = functools.partial(events.send, ctx.app, kind, task_id, hostname=row.worker,
                             force=True, **fields)
    send()
    # Once more, after the copy's own events have surely been flushed (VIEW_RESENT_AFTER); a
    # second event of the same state changes nothing else in Flower.
    again = threading.Timer(VIEW_RESENT_AFTER, send)
    again.daemon = True
    again.start()


def report_later(
    settings: Settings, task_id: str, delay: float = 1.0, outcome: dict[str, Any] | None = None
) -> None:
    """Make a sweeper write ``task_id``'s final outcome to the result backend in ``delay``
    seconds (with ``outcome``, store it first, where the row has none)."""
    with write_session(settings.database_url) as session:
        session.execute(
            update(AnnouncementRow)
            .where(AnnouncementRow.task_id == task_id)
            .values(report_due=clock.now() + delay)
        )
        if outcome is not None:
            session.execute(
                update(AnnouncementRow)
                .where(AnnouncementRow.task_id == task_id, AnnouncementRow.result.is_(None))
                .values(result=outcome)
            )


def report_if_final(settings: Settings, task_id: str, delay: float = REPORT_BACKOFF) -> bool:
    """Make a sweeper check ``task_id``'s outcome in the backend in ``delay`` seconds, if the
    store holds a final one (Celery could not write it: its retries ran out). True if so."""
    with write_session(settings.database_url) as session:
        found = cast(
            CursorResult[Any],
            session.execute(
                update(AnnouncementRow)
                .where(
                    AnnouncementRow.task_id == task_id,
                    AnnouncementRow.state.in_(sorted(lifecycle.FINAL_STATES)),
                )
                .values(report_due=clock.now() + delay)
            ),
        ).rowcount
    return found == 1


def report_results(ctx: Context, now: float | None = None, limit: int = 50) -> int:
    """Write to the result backend the final outcomes due for it (a sweeper phase); returns
    how many were written. Each is leased first, so concurrent sweepers write it once."""
    now = clock.now() if now is None else now
    with read_session(ctx.settings.database_url) as session:
        due = session.execute(_DUE, {"now": now, "limit": limit}).all()
    written = 0
    for task_id, state, outcome, error, spec in due:
        lease = now + REPORT_LEASE
        with write_session(ctx.settings.database_url) as session:
            taken = cast(
                CursorResult[Any],
                session.execute(_LEASE, {"r_task": task_id, "r_now": now, "r_lease": lease}),
            ).rowcount
        if taken != 1:
            continue
        follow_up: float | None = None
        try:
            if _report(ctx.app, task_id, state, outcome, error, spec):
                written += 1
        except Exception as exc:  # the backend still down: later
            logger.warning(
                "task %s: writing its result to the backend failed (%s); again in %gs",
                task_id,
                exc,
                REPORT_BACKOFF,
            )
            follow_up = clock.now() + REPORT_BACKOFF
        with write_session(ctx.settings.database_url) as session:
            session.execute(_DONE, {"r_task": task_id, "r_lease": lease, "r_next": follow_up})
    return written


def _report(
    app: Celery,
    task_id: str,
    state: str,
    outcome: dict[str, Any] | None,
    error: str | None,
    spec: dict[str, Any],
) -> bool:
    """Write one task's final outcome where the backend lacks it; False when it had it."""
    if state not in lifecycle.FINAL_STATES:
        return False  # moved on (a reset): nothing final to report
    backend = app.backend
    meta = backend.get_task_meta(task_id)
    have = meta.get("status")
    announcement = Announcement.model_validate(spec)
    request = caller_request(announcement)
    if state == lifecycle.SUCCESS:
        if have == states.SUCCESS:
            return False
        value = (outcome or {}).get("value")
        backend.mark_as_done(task_id, value, request=request)
        logger.info("task %s: its result is in the backend now (it had %s)", task_id, have)
        return True
    if have in (states.FAILURE, states.REVOKED) and (outcome or {}).get("exception") is None:
        return False
    if have == states.FAILURE and _same_error(backend, meta, outcome):
        return False
    exc = _exception(backend, outcome, error)
    backend.mark_as_failure(
        task_id,
        exc,
        request=request,
        call_errbacks=have is None or have not in states.READY_STATES,
    )
    logger.info("task %s: its failure is in the backend now (it had %s)", task_id, have)
    return True


def _same_error(backend: Any, meta: dict[str, Any], outcome: dict[str, Any] | None) -> bool:
    stored = (outcome or {}).get("exception") or {}
    found = meta.get("result")
    return isinstance(found, BaseException) and type(found).__name__ == stored.get("exc_type")


def _exception(backend: Any, outcome: dict[str, Any] | None, error: str | None) -> BaseException:
    """The stored error as an exception (the task's own class where it can be rebuilt)."""
    stored = (outcome or {}).get("exception")
    if stored:
        try:
            exc = backend.exception_to_python(stored)
            if isinstance(exc, BaseException):
                return exc
        except Exception:  # a class that cannot be rebuilt here: its text still reaches them
            logger.debug("cannot rebuild %r", stored, exc_info=True)
        return BiddingError(
            f"{stored.get('exc_type')}: {' '.join(stored.get('exc_message') or [])}"
        )
    return BiddingError(error or "the task failed")
