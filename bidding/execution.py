"""Bookkeeping of an attempt on the winning node: accepted, then completed or failed.

Both ends are compare-and-sets on the announcement, so a redelivered or duplicated execution
message is recognised: a task already finished is not run again.
"""

from __future__ import annotations

import logging
import time
from enum import Enum
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.exc import IntegrityError

from bidding import journal, lifecycle
from bidding.config import Settings
from bidding.store import write_session
from bidding.store.schema import Announcement as AnnouncementRow
from bidding.store.schema import BidRow, Episode

logger = logging.getLogger(__name__)


class Start(Enum):
    """What ``begin`` found."""

    #: First delivery: the task was ASSIGNED and is now EXECUTING.
    FIRST = "first"
    #: The task was already EXECUTING (its worker died with the message unacked): run again.
    REDELIVERED = "redelivered"
    #: The task already finished: do not run it again.
    DUPLICATE = "duplicate"
    #: The store has no such announcement (a store mismatch): run, but record nothing.
    UNKNOWN = "unknown"


def begin(settings: Settings, task_id: str, attempt: int, node: str) -> Start:
    """Move ``task_id`` to EXECUTING on ``node`` and log TASK_ACCEPTED, or say why not."""
    now = time.time()
    with write_session(settings.database_url) as session:
        moved = cast(CursorResult[Any], session.execute(
            update(AnnouncementRow)
            .where(AnnouncementRow.task_id == task_id, AnnouncementRow.attempt == attempt,
                   AnnouncementRow.state == lifecycle.ASSIGNED)
            .values(state=lifecycle.EXECUTING, started_at=now)
        )).rowcount
        if moved == 1:
            journal.record(session, task_id, journal.TASK_ACCEPTED, node=node,
                           attempt=attempt, at=now)
            return Start.FIRST
        state = session.scalar(
            select(AnnouncementRow.state).where(AnnouncementRow.task_id == task_id)
        )
        if state is None:
            return Start.UNKNOWN
        if state == lifecycle.EXECUTING:
            journal.record(session, task_id, journal.TASK_ACCEPTED, node=node,
                           attempt=attempt, at=now, redelivered=True)
            return Start.REDELIVERED
        journal.record(session, task_id, journal.ILLEGAL_TRANSITION, node=node,
                       attempt=attempt, at=now, current=state, target=lifecycle.EXECUTING,
                       note="duplicate execution message ignored")
        return Start.DUPLICATE


def finish(settings: Settings, task_id: str, attempt: int, node: str, *, success: bool,
           duration_s: float, error: str | None = None) -> None:
    """Record the attempt's outcome: the final state, its episode and TASK_COMPLETED/FAILED."""
    now = time.time()
    target = lifecycle.SUCCESS if success else lifecycle.FAILED
    try:
        with write_session(settings.database_url) as session:
            row = session.get(AnnouncementRow, task_id)
            if row is None:
                return
            cost = session.scalar(
                select(BidRow.cost).where(BidRow.id == row.winning_bid_id)
            ) if row.winning_bid_id is not None else None
            session.execute(
                update(AnnouncementRow)
                .where(AnnouncementRow.task_id == task_id,
                       AnnouncementRow.state.in_(lifecycle.sources(target)))
                .values(state=target, finished_at=now, error=error)
            )
            session.add(Episode(task_id=task_id, attempt=attempt, node=node,
                                task_type=row.task_type, skills=list(row.required_skills),
                                success=success, duration_s=duration_s, cost=cost or 0.0,
                                error=error, finished_at=now))
            journal.record(session, task_id,
                           journal.TASK_COMPLETED if success else journal.TASK_FAILED,
                           node=node, attempt=attempt, at=now,
                           duration_ms=round(duration_s * 1000, 3), error=error)
    except IntegrityError:
        # The episode of this (task, attempt) exists: a duplicate run, already recorded.
        logger.warning("attempt %s of %s already recorded; duplicate ignored", attempt, task_id)
