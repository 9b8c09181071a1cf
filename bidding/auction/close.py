"""Closing an auction: the answer that completes it, or the deadline sweep, takes the answers
off the bid board, awards once (``award.award_answers``) and routes the award.

The bid board's close is atomic (every closer sees the same answers; a later answer is late)
and the award is a compare-and-set on the announcement's state, so the last bid, the deadline
closer and any duplicate all race safely: exactly one awards.
"""

from __future__ import annotations

import logging

from sqlalchemy import bindparam, func, select

from bidding import clock
from bidding.auction.award import award_answers, route_award
from bidding.auction.board import get_board
from bidding.config import Settings
from bidding.context import Context
from bidding.lifecycle import events, journal, parking, states
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import Announcement, Award, Refusal
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow

logger = logging.getLogger(__name__)


def close_auction(ctx: Context, task_id: str, attempt: int,
                  closed_by: str, *, announcement: Announcement | None = None,
                  candidates: int | None = None) -> Award | None:
    """Award ``task_id``'s auction if it is still open; None when someone else already did.

    The bidder whose answer completed the auction passes the announcement it holds, which
    saves reading it back; the sweepers pass only the id.
    """
    if announcement is None or candidates is None:
        with read_session(ctx.settings.database_url) as session:
            row = session.execute(
                select(
                    AnnouncementRow.state,
                    AnnouncementRow.attempt,
                    AnnouncementRow.spec,
                    AnnouncementRow.candidates,
                ).where(AnnouncementRow.task_id == task_id)
            ).one_or_none()
        if row is None or row.state != states.BIDDING or row.attempt != attempt:
            return None
        announcement = Announcement.model_validate(row.spec)
        candidates = len(row.candidates)
    board = get_board(ctx)
    # Kept past the window, so that an awarder that dies before committing leaves the answers
    # for the sweeper that closes the auction at its deadline.
    answers = board.close(
        task_id,
        attempt,
        keep=max(0.0, announcement.announced_at + announcement.window - clock.now()) + 60.0,
    )
    silent = all(isinstance(a, Refusal) and a.failed for a in answers)
    if (
        silent
        and candidates
        and announcement.silent_rounds < ctx.settings.silent_rounds
        and not announcement.expired(clock.now() + announcement.window)
    ):
        # Not one candidate answered, or could bid: a node killed before its heartbeat
        # expired, workers reconnecting to a restarted broker, a store restarting; no
        # verdict on the task. Announce it again.
        if announce_again(ctx.settings, announcement, candidates):
            events.deferred(ctx.app, announcement, "no candidate answered: announced again")
        return None
    award = award_answers(
        ctx.settings,
        announcement,
        answers,
        closed_by=closed_by,
        candidates=candidates,
        write=board.writes_on_award,
    )
    if award is not None:
        route_award(ctx, announcement, award)
    return award


def announce_again(settings: Settings, announcement: Announcement, candidates: int) -> bool:
    """Defer ``announcement``'s silent auction for a heartbeat interval, one more silent round
    counted; False when someone else closed it first.

    The next round is a new attempt (as a re-award is): answers to this round's requests
    that come late are told apart from the next round's, and its bid board starts empty. It
    is no failure: the retry policy counts failures, not attempts.
    """
    now = clock.now()
    again = announcement.model_copy(
        update={
            "silent_rounds": announcement.silent_rounds + 1,
            "attempt": announcement.attempt + 1,
        }
    )
    reason = (
        f"none of {candidates} candidate(s) answered or could bid within "
        f"{announcement.window:g}s (a worker restarting or reconnecting?): announced again, round "
        f"{again.silent_rounds + 1} of {settings.silent_rounds + 1}"
    )
    with write_session(settings.database_url) as session:
        moved = transition(
            session,
            announcement.task_id,
            states.DEFERRED,
            Log(
                journal.DEFERRED,
                detail={
                    "reason": reason,
                    "retry_in_s": settings.heartbeat_interval,
                    "silent_rounds": again.silent_rounds,
                },
            ),
            Expect(states=(states.BIDDING,), attempt=announcement.attempt),
            spec=again.model_dump(mode="json"),
            attempt=again.attempt,
            due_at=now + settings.heartbeat_interval,
        )
    if moved:
        logger.warning("auction %s: %s", announcement.task_id, reason)
    return moved


#: The auctions the deadline closer watches: open ones (it closes those past ``closes_at``).
_OPEN = (AnnouncementRow.state == states.BIDDING, parking.UNPARKED)
_EXPIRED = (
    select(AnnouncementRow.task_id, AnnouncementRow.attempt, AnnouncementRow.scan_failures)
    .where(*_OPEN, AnnouncementRow.closes_at <= bindparam("now"))
    .order_by(AnnouncementRow.closes_at, AnnouncementRow.task_id)
    .limit(bindparam("limit"))
)

#: When the next open auction's window ends (None: none is open): what an idle sweeper reads
#: instead of running ``close_expired`` (``auction.idle_look``).
NEXT_CLOSE = select(func.min(AnnouncementRow.closes_at)).where(*_OPEN).scalar_subquery()


def close_expired(
    ctx: Context, now: float | None = None, limit: int = 100
) -> int:
    """Close every open auction past its window (the deadline closer); returns how many.

    An auction it fails to close stays the oldest past its window: it is counted, and parked
    if it keeps failing (``lifecycle.parking``), so that it cannot hold up the others."""
    now = clock.now() if now is None else now
    with read_session(ctx.settings.database_url) as session:
        due = session.execute(_EXPIRED, {"now": now, "limit": limit}).all()
    closed = 0
    tally = parking.Tally("deadline closer")
    for task_id, attempt, failures in due:
        seen = parking.Seen(task_id, states.BIDDING, attempt, failures)
        try:
            if close_auction(ctx, task_id, attempt, closed_by="deadline") is not None:
                closed += 1
        except Exception as exc:  # the next sweep tries again; the others still close now
            tally.failure(seen, exc)
        else:
            tally.success(seen)
    tally.save(ctx.settings.database_url)
    return closed
