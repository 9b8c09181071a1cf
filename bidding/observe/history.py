"""Which closed auctions a page of the auction feed holds: its filters and its cursor.

An auction is one attempt's, and its close is the AWARDED or NO_AWARD message of the log. The
feed's order is that message's id, newest first: unique, never reused and increasing as
closes are recorded, so a page is "the ``limit`` closes with an id below ``before``" (keyset
pagination on the log's primary key): each page costs the same however far back it is, and a
close recorded while a reader pages back never shifts the pages it has not read yet. Every
filter is a bound parameter of one query; none is an OFFSET.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal

from sqlalchemy import ColumnElement, Select, and_, exists, func, or_, select
from sqlalchemy.orm import Session

from bidding.lifecycle import journal
from bidding.store.schema import AnnouncementRow, BidRow, Message

#: An auction's outcome as the feed says it (``AuctionSummary.outcome``): awarded to the best
#: bid, awarded to a fallback node (no bid qualified), or closed without a winner.
Outcome = Literal["awarded", "fallback", "failed"]
OUTCOMES: Final[tuple[str, ...]] = ("awarded", "fallback", "failed")
#: How many bids in time make an auction contested (refusals and late bids do not count).
CONTESTED: Final = 2


@dataclass(frozen=True)
class AuctionFilter:
    """What the auctions of a page must be; ``None``/``False``: any."""

    #: ``awarded``, ``fallback`` or ``failed`` (see ``Outcome``).
    outcome: Outcome | None = None
    #: The task's type (``bidding_auctions_total``'s ``task_type``).
    task_type: str | None = None
    #: A node that answered the auction (bid or refused) or won it.
    node: str | None = None
    #: Unix times: closed at or after ``since``, and before ``until``.
    since: float | None = None
    until: float | None = None
    #: Only auctions with two or more bids in time.
    contested: bool = False


def _outcome(outcome: Outcome) -> ColumnElement[bool]:
    if outcome == "failed":
        return Message.kind == journal.NO_AWARD
    # An award's detail says "fallback" when no bid qualified; older awards say nothing.
    said = func.coalesce(Message.detail["outcome"].as_string(), "awarded")
    return and_(Message.kind == journal.AWARDED, said == outcome)


def _same_auction() -> ColumnElement[bool]:
    return and_(BidRow.task_id == Message.task_id, BidRow.attempt == Message.attempt)


def conditions(f: AuctionFilter) -> list[ColumnElement[bool]]:
    """The WHERE conditions of ``f``, on the log joined to the announcements (bound
    parameters only)."""
    found: list[ColumnElement[bool]] = []
    if f.outcome is not None:
        found.append(_outcome(f.outcome))
    if f.task_type is not None:
        found.append(AnnouncementRow.task_type == f.task_type)
    if f.node is not None:
        answered = exists(select(BidRow.id).where(_same_auction(), BidRow.node == f.node))
        found.append(or_(and_(Message.kind == journal.AWARDED, Message.node == f.node),
                         answered))
    if f.since is not None:
        found.append(Message.at >= f.since)
    if f.until is not None:
        found.append(Message.at < f.until)
    if f.contested:
        bids = (select(func.count(BidRow.id))
                .where(_same_auction(), BidRow.will_bid.is_(True), BidRow.late.is_(False))
                .scalar_subquery())
        found.append(bids >= CONTESTED)
    return found


def page_query(f: AuctionFilter, limit: int, after: int = 0,
               before: int | None = None) -> Select[Any]:
    """The closes of a page, newest first: ``limit`` of them with an id above ``after`` and
    below ``before``. A close whose announcement was deleted has no auction to show and is
    left out (the join)."""
    query = (select(Message)
             .join(AnnouncementRow, AnnouncementRow.task_id == Message.task_id)
             .where(Message.kind.in_((journal.AWARDED, journal.NO_AWARD)), Message.id > after,
                    *conditions(f)))
    if before is not None:
        query = query.where(Message.id < before)
    return query.order_by(Message.id.desc()).limit(limit)


def closes(session: Session, f: AuctionFilter, limit: int, after: int = 0,
           before: int | None = None) -> tuple[list[Message], int | None]:
    """A page's closes, newest first, and the cursor of the page after it (older: pass it as
    ``before``), None when this page holds the oldest match."""
    rows: list[Message] = list(session.scalars(page_query(f, limit + 1, after, before)))
    if len(rows) > limit:
        return rows[:limit], rows[limit - 1].id
    return rows, None
