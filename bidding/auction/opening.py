"""A new announcement's row, its tags and its ANNOUNCED message: written by the caller's
transaction, or later by the write-behind journal (``auction.writebehind``) from the same
values."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, cast

from sqlalchemy import Dialect, Table, insert
from sqlalchemy.orm import Session

from bidding.lifecycle import journal, states
from bidding.models import Announcement
from bidding.store.direct import DirectInsert
from bidding.store.engine import core
from bidding.store.once import insert_once
from bidding.store.schema import AnnouncementRow, Tag


def row_values(announcement: Announcement, state: str, candidates: list[str], *,
               due_at: float | None = None) -> dict[str, Any]:
    """The announcements-table columns of ``announcement`` in ``state``."""
    return {
        "task_id": announcement.task_id,
        "task_name": announcement.task_name,
        "task_type": announcement.task_type,
        "content": announcement.content,
        "required_skills": announcement.required_skills,
        "preferred_node": announcement.preferred_node,
        "priority": announcement.priority,
        "deadline": announcement.deadline,
        # The start-by time (the earlier of deadline and expiry): what the expiry scan reads.
        "expires_at": announcement.start_by,
        "budget": announcement.budget,
        "strategy": announcement.strategy,
        "spec": announcement.model_dump(mode="json"),
        "state": state,
        "attempt": announcement.attempt,
        "candidates": candidates,
        "expected_bids": len(candidates),
        "announced_at": announcement.announced_at,
        "closes_at": announcement.announced_at + announcement.window,
        "due_at": due_at,
        "created_by": announcement.created_by,
        # None when it needs nothing: a node's reservations sum only the rows that hold some.
        "resources": announcement.resources or None,
    }


_TAGS = cast(Table, Tag.__table__)


def write_tags(session: Session, announcement: Announcement) -> None:
    """The task's tags, a row each (once: a journal entry may be written twice). Its row must
    be written first (flushed, for an ORM row): each tag refers to it."""
    for tag in announcement.tags:
        insert_once(session, _TAGS, {"task_id": announcement.task_id, "tag": tag})


_ANNOUNCEMENTS = cast(Table, AnnouncementRow.__table__)
_INSERT_ANNOUNCEMENT = insert(_ANNOUNCEMENTS)


@lru_cache(maxsize=8)
def _direct_new(columns: tuple[str, ...], dialect: Dialect) -> DirectInsert | None:
    """A new announcement's INSERT on the driver's cursor (``store.direct``)."""
    return DirectInsert.of(_ANNOUNCEMENTS, columns, dialect)


def record_new(
    session: Session, announcement: Announcement, candidates: list[str], *, once: bool = False
) -> bool:
    """Write a new announcement, open for bids, and its ANNOUNCED message. ``once``: unless
    its row exists (written by another writer of the same journal entry, committed meanwhile
    or waited for); False when it did."""
    values = row_values(announcement, states.BIDDING, candidates)
    if once:
        if not insert_once(session, _ANNOUNCEMENTS, values, report=True):
            return False
    else:
        # On the driver's cursor: the caller's path is the hottest in a burst.
        conn = core(session)
        direct = _direct_new(tuple(values), conn.dialect)
        if direct is not None:
            direct.run(conn, values)
        else:
            conn.execute(_INSERT_ANNOUNCEMENT, values)
    write_tags(session, announcement)
    journal.write(
        session,
        [
            journal.message(
                announcement.task_id,
                journal.ANNOUNCED,
                attempt=announcement.attempt,
                at=announcement.announced_at,
                task_type=announcement.task_type,
                candidates=candidates,
                required_skills=announcement.required_skills,
            )
        ],
    )
    return True
