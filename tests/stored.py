"""Rows the tests put in the store as the library itself writes them."""

from __future__ import annotations

from typing import Any

from bidding.auction.opening import row_values
from bidding.models import Announcement
from bidding.store import write_session
from bidding.store.schema import AnnouncementRow


def add_announcement(database_url: str, announcement: Announcement, state: str,
                     candidates: list[str], **columns: Any) -> Announcement:
    """Store ``announcement`` in ``state`` with ``candidates`` (the columns the announcer
    writes, ``auction.opening.row_values``), ``columns`` overriding any of them (the award's
    ``assigned_node``, a ``due_at``, a ``spec`` this version cannot read...)."""
    with write_session(database_url) as session:
        session.add(AnnouncementRow(**{**row_values(announcement, state, candidates),
                                       **columns}))
    return announcement
