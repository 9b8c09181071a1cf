"""A task not started by its start-by time (its expiry or deadline) never starts: it is ended
FAILED, logged EXPIRED with the reason, and its caller's ``.get()`` raises ``TaskExpiredError``.

The sweepers' scan (``end_expired``) ends every task still waiting at that time: scheduled
(countdown/eta), in a retry's backoff, deferred or waiting for a node to come back, in an open
auction, or awarded and not yet started (its execution waiting in a busy node's queue). The
node that receives an execution after it is the last line (``BiddingTask._unless_expired``).
None of these counts against a node: the limit is the caller's.
"""

from __future__ import annotations

import logging
from typing import Final

from sqlalchemy import bindparam, case, func, or_, select

from bidding import clock
from bidding.context import Context
from bidding.execution.report import exception_json, fail_caller
from bidding.execution.timing import expired_error, expiry_reason
from bidding.lifecycle import journal, parking, states
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import Announcement
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow

logger = logging.getLogger(__name__)

#: States in which a task has not started and may still expire, and what each is waiting for.
WAITING: Final[dict[str, str]] = {
    states.PENDING: "scheduled (countdown/eta)",
    states.RETRYING: "waiting for its next attempt",
    states.DEFERRED: "deferred, waiting for a capable node",
    states.BIDDING: "its auction was open",
    states.ASSIGNED: "awarded, not yet started by its node",
}

#: The tasks that may expire: those waiting to start (it ends those past a start-by time).
_WAITING_ROWS = (AnnouncementRow.state.in_(sorted(WAITING)), parking.UNPARKED)
_EXPIRED = (
    select(AnnouncementRow.spec, *parking.SEEN_COLUMNS)
    .where(
        *_WAITING_ROWS,
        # The deadline too: rows written before the start-by time was kept in expires_at.
        or_(AnnouncementRow.expires_at <= bindparam("now"),
            AnnouncementRow.deadline <= bindparam("now")),
    )
    .order_by(AnnouncementRow.task_id)
    .limit(bindparam("limit"))
)

#: The sooner of a row's start-by time and deadline, either of which may be NULL (a CASE:
#: SQLite's and PostgreSQL's least() differ on a NULL).
_SOONER = case((or_(AnnouncementRow.expires_at.is_(None),
                    AnnouncementRow.deadline < AnnouncementRow.expires_at),
                AnnouncementRow.deadline), else_=AnnouncementRow.expires_at)
#: When the next waiting task's start-by time or deadline comes (None: none): what an idle
#: sweeper reads instead of running ``end_expired`` (``auction.idle_look``).
NEXT_EXPIRY = select(func.min(_SOONER)).where(*_WAITING_ROWS).scalar_subquery()


def expire(ctx: Context, announcement: Announcement, state: str, now: float | None = None,
           where: str | None = None) -> bool:
    """End ``announcement`` (found in ``state``, not started) FAILED as expired, and tell its
    caller; False when it moved on meanwhile (started, awarded, taken by another sweeper).
    ``where``: what it was waiting for, if not what ``state`` says."""
    now = clock.now() if now is None else now
    reason = expiry_reason(announcement, now, where or WAITING.get(state, state.lower()))
    error = expired_error(announcement, reason)
    with write_session(ctx.settings.database_url) as session:
        moved = transition(
            session,
            announcement.task_id,
            states.FAILED,
            Log(journal.EXPIRED, at=now, detail={"error": reason, "state": state}),
            Expect(states=(state,), attempt=announcement.attempt),
            error=reason,
            finished_at=now,
            due_at=None,
            result=exception_json(error),
        )
    if moved:
        logger.info("task %s: %s", announcement.task_id, reason)
        fail_caller(ctx, announcement, error)
    return moved


def end_expired(ctx: Context, now: float | None = None, limit: int = 100) -> int:
    """End every task that has not started by its start-by time (a sweeper's phase); returns
    how many. One at a time: a task this version cannot read must not stop the others (it is
    counted, and parked if it keeps failing)."""
    now = clock.now() if now is None else now
    with read_session(ctx.settings.database_url) as session:
        found = session.execute(_EXPIRED, {"now": now, "limit": limit}).all()
    ended = 0
    tally = parking.Tally("expiry")
    for spec, *read in found:
        seen = parking.Seen(*read)
        try:
            if expire(ctx, Announcement.model_validate(spec), seen.state, now):
                ended += 1
        except Exception as exc:
            tally.failure(seen, exc)
            if parking.is_outage(exc):
                break
        else:
            tally.success(seen)
    tally.save(ctx.settings.database_url)
    return ended
