"""Paging back through every closed auction with a cursor, and the feed's filters (outcome,
task type, node, time range, contested), on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from bidding.config import Settings
from bidding.lifecycle import journal
from bidding.lifecycle import states as lifecycle
from bidding.models import Announcement
from bidding.observe.auctions import AuctionFeed, recent_auctions
from bidding.observe.history import AuctionFilter
from bidding.store import write_session
from bidding.store.schema import BidRow, Message
from tests.stored import add_announcement

#: (node, will_bid, late) of an auction's answers.
Answer = tuple[str, bool, bool]


def _auction(url: str, *, task_type: str = "extract", at: float = 1000.0,
             winner: str | None = "north", outcome: str = "awarded",
             answers: tuple[Answer, ...] = (("north", True, False),),
             task_id: str | None = None, attempt: int = 1) -> tuple[str, int]:
    """One closed auction (a new task's, or another attempt of ``task_id``): its answers and
    its close at ``at``. Its (task id, attempt)."""
    if task_id is None:
        task_id = str(uuid.uuid4())
        add_announcement(url, Announcement(task_id=task_id, task_name="t.work",
                                           task_type=task_type, announced_at=at - 1),
                         lifecycle.SUCCESS if winner else lifecycle.FAILED, [])
    with write_session(url) as session:
        for node, will_bid, late in answers:
            session.add(BidRow(task_id=task_id, attempt=attempt, node=node, will_bid=will_bid,
                               late=late, score=0.5 if will_bid else None,
                               is_winner=node == winner, bid_at=at - 0.5))
        if winner is None:
            session.add(Message(task_id=task_id, kind=journal.NO_AWARD, attempt=attempt,
                                detail={"error": "No bids received"}, at=at))
        else:
            session.add(Message(task_id=task_id, kind=journal.AWARDED, node=winner,
                                attempt=attempt, at=at,
                                detail={"outcome": outcome, "latency_ms": 3.0, "score": 0.5}))
    return task_id, attempt


def _all_pages(url: str, limit: int, where: AuctionFilter | None = None,
               **kwargs: Any) -> list[AuctionFeed]:
    pages = [recent_auctions(url, limit=limit, where=where, **kwargs)]
    while pages[-1].older is not None:
        pages.append(recent_auctions(url, limit=limit, where=where, before=pages[-1].older,
                                     **kwargs))
    return pages


def _keys(feed: AuctionFeed) -> list[tuple[str, int]]:
    return [(a.task_id, a.attempt) for a in feed.auctions]


def test_paging_back_reaches_every_auction_once_newest_first(settings: Settings) -> None:
    url = settings.database_url
    # given seven closed auctions, one of them a second attempt of a retried task
    made = [_auction(url, at=1000.0 + i) for i in range(6)]
    made.append(_auction(url, at=1010.0, task_id=made[0][0], attempt=2))
    # when the feed is read three at a time, each page asking for what is before the last
    pages = _all_pages(url, limit=3)
    # then three pages hold every auction once, newest first (by close), the last saying so
    assert [len(p.auctions) for p in pages] == [3, 3, 1]
    assert [k for p in pages for k in _keys(p)] == list(reversed(made))
    assert [p.older is None for p in pages] == [False, False, True]
    # and each page's cursor is its newest auction's id, so `after` it gives what is newer
    assert pages[1].cursor == pages[1].auctions[0].id
    newer = recent_auctions(url, limit=10, after=pages[1].cursor)
    assert _keys(newer) == [k for k in _keys(pages[0])]


def test_a_close_recorded_while_paging_back_shifts_no_page(settings: Settings) -> None:
    url = settings.database_url
    # given five closed auctions and the first page of two read
    made = [_auction(url, at=1000.0 + i) for i in range(5)]
    first = recent_auctions(url, limit=2)
    # when two more auctions close before the reader asks for the next page
    _auction(url, at=2000.0)
    _auction(url, at=2001.0)
    second = recent_auctions(url, limit=2, before=first.older)
    # then the next page holds the two auctions right after the first page's, not a repeat
    assert _keys(second) == [made[2], made[1]]


def test_each_filter_keeps_only_the_auctions_that_match(settings: Settings) -> None:
    url = settings.database_url
    # given auctions of two types, awarded, by fallback and without a winner, over time
    plain = _auction(url, at=1000.0, answers=(("north", True, False),))
    contested = _auction(url, at=1001.0, winner="south", answers=(
        ("north", True, False), ("south", True, False), ("east", False, False)))
    late = _auction(url, at=1002.0, answers=(("north", True, False), ("south", True, True)))
    refused = _auction(url, at=1003.0, winner="north", answers=(
        ("north", True, False), ("west", False, False)))
    fallback = _auction(url, at=1004.0, winner="east", outcome="fallback", answers=())
    failed = _auction(url, at=1005.0, winner=None, task_type="render",
                      answers=(("north", False, False),))
    cases: list[tuple[AuctionFilter, list[tuple[str, int]]]] = [
        # the outcome said by the feed: awarded to the best bid, to a fallback, none
        (AuctionFilter(outcome="awarded"), [refused, late, contested, plain]),
        (AuctionFilter(outcome="fallback"), [fallback]),
        (AuctionFilter(outcome="failed"), [failed]),
        (AuctionFilter(task_type="render"), [failed]),
        (AuctionFilter(task_type="nothing-of-that-type"), []),
        # a node that won (east, by fallback, without a bid) or answered (east refused)
        (AuctionFilter(node="east"), [fallback, contested]),
        (AuctionFilter(node="west"), [refused]),
        # closed in [since, until)
        (AuctionFilter(since=1001.0, until=1003.0), [late, contested]),
        (AuctionFilter(since=1004.0), [failed, fallback]),
        # two bids in time: a late bid and a refusal do not count
        (AuctionFilter(contested=True), [contested]),
        # and together
        (AuctionFilter(outcome="awarded", node="north", since=1002.0), [refused, late]),
    ]
    for where, expected in cases:
        # when the feed is read with the filter, one auction a page
        pages = _all_pages(url, limit=1, where=where)
        # then every page back holds the matching auctions only, newest first
        assert [k for p in pages for k in _keys(p)] == expected, where


@pytest.mark.parametrize("hostile", ["x' OR '1'='1", "north; DROP TABLE bidding_messages"])
def test_a_filters_value_is_a_bound_parameter(settings: Settings, hostile: str) -> None:
    url = settings.database_url
    # given an auction
    _auction(url)
    # when the filters hold SQL, then they match nothing and the log is intact
    assert recent_auctions(url, where=AuctionFilter(node=hostile, task_type=hostile)
                           ).auctions == []
    assert len(recent_auctions(url).auctions) == 1
