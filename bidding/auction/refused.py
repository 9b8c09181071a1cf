"""An award the store will not take: the write-behind journal's entries that cannot be written.

A journaled award is written by a node's writer after ``.delay()`` returned, so a value the
store refuses (a NUL character on PostgreSQL that an older caller let through, a number past
a column's range) or an entry no writer can read (written by a newer version) reaches no
caller as an exception. Such a task ends as a failed call does: FAILED in the store with the
reason (a row as complete as the store takes), and the caller's result failed with
:class:`~bidding.errors.NotRecordedError` (``fail_caller``). Its entry then leaves the journal.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from enum import Enum

from sqlalchemy.exc import DisconnectionError, InterfaceError, OperationalError, StatementError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from bidding import clock
from bidding.auction.opening import record_new
from bidding.config import Settings
from bidding.context import Context
from bidding.errors import NotRecordedError
from bidding.execution.report import REPORT_BACKOFF, exception_json, fail_caller
from bidding.lifecycle import journal, states
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import Announcement
from bidding.store import write_session

logger = logging.getLogger(__name__)


def refuses(exc: BaseException) -> bool:
    """Whether writing failed for what the entry holds (the store refused a value: the same
    write fails every time), rather than because the store cannot be reached or is busy now
    (then it is tried again later). A bug of ours (any other exception) is neither: it is
    raised, and the batch is tried again, as before."""
    if isinstance(exc, (OperationalError, InterfaceError, DisconnectionError, PoolTimeout)):
        return False  # a server restarting, a lost connection, SQLite's lock held too long
    # A DBAPI error (PostgreSQL's DataError, an IntegrityError), a value the driver cannot bind
    # (SQLite's OverflowError, an unencodable string), an entry that does not validate.
    return isinstance(exc, (StatementError, ValueError, TypeError, ArithmeticError))


#: Characters of a reason kept (it goes into the task's error, its caller's and the log).
REASON_CHARS = 300


def reason_of(exc: BaseException) -> str:
    """The first line of ``exc`` (a driver's error repeats the statement and its values)."""
    text = str(exc).strip()
    first = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")
    return first if len(first) <= REASON_CHARS else first[:REASON_CHARS - 4] + " ..."


class Failed(Enum):
    """What ``fail_unrecorded`` did."""

    #: The task is FAILED in the store and its caller's result says why.
    FAILED = "failed"
    #: The task's row was there already (written by a writer that could read it, or failed by
    #: an earlier pass): nothing was done.
    RECORDED = "recorded"


def fail_unrecorded(ctx: Context, announcement: Announcement,
                    candidates: Sequence[str], reason: str) -> Failed:
    """End ``announcement``'s task FAILED with ``reason`` in the store and fail its caller's result.

    The row is the announcement's, in state FAILED with a TASK_FAILED message; if the store
    refuses that too (the refused value is in the announcement), a bare one (the task's id,
    name and type). Its ``report_due`` makes a sweeper write the failure to the result backend
    should this process die before it does. Raises when the store cannot be reached (the
    caller tries again later), not when it refuses even the bare row (logged)."""
    error = NotRecordedError(f"task {announcement.task_id} was not recorded: {reason}")
    for row in (announcement, _bare(announcement)):
        try:
            if not _write_failed(ctx.settings, row, list(candidates), error):
                return Failed.RECORDED
            break
        except Exception as exc:
            if not refuses(exc):
                raise
            logger.warning("task %s: the store refused its FAILED row (%s)", announcement.task_id,
                           reason_of(exc))
    else:
        logger.error("task %s: the store refused even a bare FAILED row; only its caller is "
                     "told (%s)", announcement.task_id, reason)
    logger.error("task %s failed: %s", announcement.task_id, reason)
    try:
        fail_caller(ctx, announcement, error)
    except Exception as exc:  # its row's report_due still reaches the caller
        logger.warning("task %s: failing its caller's result failed (%s)", announcement.task_id,
                       reason_of(exc))
    return Failed.FAILED


def _bare(announcement: Announcement) -> Announcement:
    """The least of ``announcement`` that makes a row: its id, name and type, nothing the caller
    gave."""
    return Announcement(
        task_id=announcement.task_id,
        task_name=announcement.task_name,
        task_type=announcement.task_type,
        announced_at=announcement.announced_at,
    )


def _write_failed(
    settings: Settings, announcement: Announcement, candidates: list[str], error: NotRecordedError
) -> bool:
    """Write ``announcement``'s row in state FAILED with ``error``; False when a row was there."""
    now = clock.now()
    with write_session(settings.database_url) as session:
        if not record_new(session, announcement, candidates, once=True):
            return False
        transition(
            session,
            announcement.task_id,
            states.FAILED,
            Log(journal.TASK_FAILED, detail={"error": str(error)}),
            Expect(states=(states.BIDDING,), attempt=announcement.attempt),
            error=str(error),
            finished_at=now,
            result=exception_json(error),
            report_due=now + REPORT_BACKOFF,
        )
    return True
