"""Closing an auction: the answer that completes it, or the deadline sweep, takes the answers
off the bid board, awards once (``award.award_answers``) and routes the award.

The bid board's close is atomic (every closer sees the same answers; a later answer is late)
and the award is a compare-and-set on the announcement's state, so the last bid, the deadline
closer and any duplicate all race safely: exactly one awards.
"""

from __future__ import annotations

import logging
import time

from celery import Celery
from sqlalchemy import bindparam, select

from bidding.auction.award import award_answers, route_award
from bidding.auction.board import get_board
from bidding.config import Settings
from bidding.lifecycle import states
from bidding.models import Announcement, Award
from bidding.store import read_session
from bidding.store.schema import Announcement as AnnouncementRow

logger = logging.getLogger(__name__)


def close_auction(settings: Settings, app: Celery, task_id: str, attempt: int,
                  closed_by: str, *, rfp: Announcement | None = None,
                  candidates: int | None = None) -> Award | None:
    """Award ``task_id``'s auction if it is still open; None when someone else already did.

    The bidder whose answer completed the auction passes the announcement it holds (``rfp``),
    which saves reading it back; the sweepers pass only the id.
    """
    if rfp is None or candidates is None:
        with read_session(settings.database_url) as session:
            row = session.execute(
                select(AnnouncementRow.state, AnnouncementRow.attempt, AnnouncementRow.spec,
                       AnnouncementRow.candidates)
                .where(AnnouncementRow.task_id == task_id)
            ).one_or_none()
        if row is None or row.state != states.BIDDING or row.attempt != attempt:
            return None
        rfp = Announcement.model_validate(row.spec)
        candidates = len(row.candidates)
    board = get_board(settings, app)
    # Kept past the window, so that an awarder that dies before committing leaves the answers
    # for the sweeper that closes the auction at its deadline.
    answers = board.close(task_id, attempt,
                          keep=max(0.0, rfp.announced_at + rfp.window - time.time()) + 60.0)
    award = award_answers(settings, rfp, answers, closed_by=closed_by, candidates=candidates,
                          write=board.writes_on_award)
    if award is not None:
        route_award(app, settings, rfp, award)
    return award


_EXPIRED = (
    select(AnnouncementRow.task_id, AnnouncementRow.attempt)
    .where(AnnouncementRow.state == states.BIDDING,
           AnnouncementRow.closes_at <= bindparam("now"))
    .order_by(AnnouncementRow.closes_at)
    .limit(bindparam("limit"))
)


def close_expired(settings: Settings, app: Celery, now: float | None = None,
                  limit: int = 100) -> int:
    """Close every open auction past its window (the deadline closer); returns how many."""
    now = time.time() if now is None else now
    with read_session(settings.database_url) as session:
        due = session.execute(_EXPIRED, {"now": now, "limit": limit}).all()
    closed = 0
    for task_id, attempt in due:
        try:
            if close_auction(settings, app, task_id, attempt, closed_by="deadline") is not None:
                closed += 1
        except Exception:  # the next sweep tries again; the others still close now
            logger.exception("closing auction %s at its deadline failed", task_id)
    return closed
