"""A new announcement's row and its ANNOUNCED message: written by the caller's transaction,
or later by the write-behind journal (``auction.writebehind``) from the same values."""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import Table, insert
from sqlalchemy.orm import Session

from bidding.lifecycle import journal, states
from bidding.models import Announcement
from bidding.store.once import insert_once
from bidding.store.schema import AnnouncementRow


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
    }


_ANNOUNCEMENTS = cast(Table, AnnouncementRow.__table__)
_INSERT_ANNOUNCEMENT = insert(_ANNOUNCEMENTS)


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
        # Core statements: the caller's path is the hottest in a burst.
        session.execute(_INSERT_ANNOUNCEMENT, values)
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
