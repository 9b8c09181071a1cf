"""Running an auction's plan: one function per route (``plan.Route``).

Every route that opens an auction has told Flower it is ANNOUNCED before it runs
(``open_auction``); each writes the announcement's row at the step its plan says
(``plan.RowStep``), and a route that cannot commit its award runs its plan's fallback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from celery import Celery
from sqlalchemy.orm import Session

from bidding import clock
from bidding.auction.award import route_award, stored_award
from bidding.auction.close import close_auction
from bidding.auction.consumer import request_bids
from bidding.auction.opening import record_new
from bidding.auction.plan import AuctionPlan, Route, RowStep
from bidding.auction.proxy import award_by_proxy, post_proxy_answers
from bidding.auction.row_writes import (
    CALLER_PATIENCE,
    Deferral,
    await_nodes,
    defer,
    escalate,
    reopen,
    write_new,
)
from bidding.auction.writebehind import AppendUnknown, award_behind, settle
from bidding.config import Settings
from bidding.context import Context
from bidding.lifecycle import events, journal, states
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import Announcement, Award
from bidding.nodes.registry import LiveNode
from bidding.store import write_session
from bidding.store.outage import outlasting, retryable

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Auction:
    """One auction being opened: where, what, and the live nodes its plan was made from."""

    app: Celery
    settings: Settings
    announcement: Announcement
    #: A caller's new task (its writes outlast a store restart); else a due one a sweeper
    #: announces again.
    new: bool
    live: Sequence[LiveNode]

    def nodes(self, names: Sequence[str]) -> list[LiveNode]:
        """The live nodes named ``names``, in that order."""
        by_name = {node.name: node for node in self.live}
        return [by_name[name] for name in names]

    def write(self, change: Callable[[Session], T], written: T) -> T:
        """``change`` in a write transaction: a new task's outlasts a store restart and knows
        its own landed commit (``write_new``: then ``written`` is what it returned); a due
        task's is taken again by the next sweep."""
        def once() -> T:
            with write_session(self.settings.database_url) as session:
                return change(session)

        if self.new:
            return write_new(self.settings, self.announcement,
                             f"announcing {self.announcement.task_id}", once, written)
        return once()


def run_plan(auction: Auction, plan: AuctionPlan) -> bool:
    """Run ``plan``'s route; False when a due task was taken by another sweeper first."""
    return ROUTES[plan.route](auction, plan)


def _open_row(auction: Auction, plan: AuctionPlan) -> bool:
    """Write the announcement's row in BIDDING: a new task's insert, or a due task's move
    back (False when another sweeper moved it first)."""
    announcement = auction.announcement
    candidates = list(plan.candidates)

    def change(session: Session) -> bool:
        if auction.new:
            record_new(session, announcement, candidates)
            return True
        return reopen(session, announcement, candidates)

    return auction.write(change, written=True)


def _journal(auction: Auction, plan: AuctionPlan) -> bool:
    """Award at once into the write-behind journal; else (the journal could not take it) as
    the plan's fallback, proxy, says."""
    announcement = auction.announcement
    candidates = auction.nodes(plan.candidates)
    try:
        award = award_behind(Context(auction.settings, auction.app), announcement, candidates)
    except AppendUnknown as exc:
        logger.warning("%s; the store decides", exc)
        return _award_unsure(auction, candidates)
    except Exception as exc:  # Redis restarting, say: the store's path still awards it
        logger.warning("journaling the award of %s failed (%s: %s); writing it to the store "
                       "instead", announcement.task_id, type(exc).__name__, exc)
        award = None
    if award is None:
        assert plan.fallback is not None
        return _proxy(auction, plan.fallback)
    if award.winner is None:
        # Failing the caller also writes the error to the task's row: write it now (rare).
        try:
            settle(Context(auction.settings, auction.app), announcement.task_id)
        except Exception as exc:  # a writer writes the row; the caller still gets its error
            logger.warning("task %s: writing its journaled award failed (%s)",
                           announcement.task_id, exc)
    route_award(Context(auction.settings, auction.app), announcement, award)
    return True


class _WrittenBehind(Exception):
    """The announcement's row is in the store already: a writer wrote the journal's award."""


def _award_unsure(auction: Auction, candidates: Sequence[LiveNode]) -> bool:
    """Award in the store's transaction when the journal may hold an award of the task (its
    append's reply was lost, and Redis could not say), and route whichever award the store
    keeps.

    The announcement is inserted once, as a writer of the journal's entry inserts it: if a
    writer wrote the entry first, nothing of this award is written, and the journal's award,
    read from the store, is routed; if this one is first, the writer skips the entry (and
    drops its reservation), and the journal's award is never sent. One award either way, and
    no exception for a task that runs. The store's outage is waited out as the caller's
    insert waits it out; past that, ``.delay()`` raises, as on the store's path (if the
    journal had taken the award, a writer writes it later and the task runs: only a store
    that answers can tell)."""
    announcement, settings = auction.announcement, auction.settings

    def opening(session: Session) -> None:
        if not record_new(session, announcement, [n.name for n in candidates], once=True):
            raise _WrittenBehind  # rolls this award's transaction back

    def award() -> Award | None:
        try:
            return award_by_proxy(Context(settings, auction.app), announcement, candidates, opening)
        except _WrittenBehind:
            return stored_award(settings, announcement.task_id)

    decided = outlasting(settings.database_url, f"announcing {announcement.task_id}", award,
                         patience=CALLER_PATIENCE)
    if decided is not None:
        route_award(Context(settings, auction.app), announcement, decided)
    return True


def _proxy(auction: Auction, plan: AuctionPlan) -> bool:
    """Make every candidate's bid here and award at once (a new task decided by a scoring
    strategy: with its row, in one transaction); if that raises, as the fallback says."""
    announcement = auction.announcement
    if plan.row is RowStep.FIRST and not _open_row(auction, plan):
        return False

    def opening(session: Session) -> None:
        record_new(session, announcement, list(plan.candidates))

    def award() -> Award | None:
        return award_by_proxy(Context(auction.settings, auction.app), announcement,
                              auction.nodes(plan.candidates),
                              opening if plan.row is RowStep.WITH_AWARD else None)

    url = auction.settings.database_url
    try:
        # A new task's award, its row with it, outlasts a dropped connection as its insert
        # would (nothing of a try that failed before its commit is written; one whose commit
        # landed is known by its award's time, ``award._award_landed``).
        award_made = (outlasting(url, f"awarding {announcement.task_id}", award,
                                 patience=CALLER_PATIENCE)
                      if plan.row is RowStep.WITH_AWARD and auction.new else award())
    except Exception as exc:
        if retryable(url, exc):
            logger.warning("proxy bids for %s: the store is unreachable (%s); asking the "
                           "candidates instead", announcement.task_id, type(exc).__name__)
        else:
            logger.exception("proxy bids for %s failed; asking the candidates instead",
                             announcement.task_id)
        assert plan.fallback is not None
        return _ask(auction, plan.fallback)
    if award_made is not None:
        route_award(Context(auction.settings, auction.app), announcement, award_made)
    return True


def _ask(auction: Auction, plan: AuctionPlan) -> bool:
    """Ask the candidates to bid (``Route.ASK``), after posting the bids made for the others
    (``Route.MIXED``); the row first, or after the requests are out."""
    if plan.row is RowStep.AFTER_ASKING:
        _send_requests(auction, plan)
        return _open_row(auction, plan)
    if plan.row is RowStep.FIRST and not _open_row(auction, plan):
        return False
    try:
        _send_requests(auction, plan)
    except Exception as exc:
        _requests_unsent(auction, exc)
        if auction.new:
            raise  # .delay() raises: the caller knows the task was not accepted
    return True


def _send_requests(auction: Auction, plan: AuctionPlan) -> None:
    """Ask ``plan.asked`` to bid; in a mixed auction, post the bids made for
    ``plan.proxied`` first, so that the last answer to come in is an asked node's (and its
    node closes the auction)."""
    announcement, settings, app = auction.announcement, auction.settings, auction.app
    expected = len(plan.proxied) + len(plan.asked)
    if plan.proxied:
        posted = post_proxy_answers(Context(settings, app), announcement,
                                    auction.nodes(plan.proxied), expected)
        if posted.complete:  # not before the asked ones answer; never left open regardless
            close_auction(Context(settings, app), announcement.task_id, announcement.attempt,
                          closed_by="all bids in", announcement=announcement, candidates=expected)
            return
    request_bids(Context(settings, app), announcement, plan.asked, expected=expected)


def _requests_unsent(auction: Auction, exc: Exception) -> None:
    """The bid requests of an auction whose row is committed could not be sent (the broker
    down past Celery's publish retries). A new task ends FAILED with the reason (its caller
    gets the exception from ``.delay()``); a due one (a retry, a deferral) is left to close
    with no bids and its fallbacks, as if no candidate had answered."""
    announcement = auction.announcement
    reason = f"its bid requests could not be sent: {type(exc).__name__}: {exc}"
    logger.error("task %s: %s", announcement.task_id, reason)
    if not auction.new:
        return
    with write_session(auction.settings.database_url) as session:
        transition(session, announcement.task_id, states.FAILED,
                   Log(journal.TASK_FAILED, detail={"error": reason}),
                   Expect(states=(states.BIDDING,), attempt=announcement.attempt), error=reason,
                   finished_at=clock.now())


def _none(auction: Auction, plan: AuctionPlan) -> bool:
    """No candidate: the auction closes at once with the no-bid outcome."""
    if not _open_row(auction, plan):
        return False
    announcement = auction.announcement
    close_auction(
        Context(auction.settings, auction.app),
        announcement.task_id,
        announcement.attempt,
        closed_by="no candidates",
    )
    return True


def _wait(auction: Auction, plan: AuctionPlan) -> bool:
    """No live candidate, but capable nodes are coming back: announced again soon."""
    announcement, settings = auction.announcement, auction.settings
    waiting = list(plan.waiting)
    if not auction.write(
        lambda session: await_nodes(session, settings, announcement, waiting, new=auction.new),
        written=True,
    ):
        return False
    events.deferred(auction.app, announcement, f"waiting for {', '.join(waiting)} (reconnecting)")
    return True


def _defer(auction: Auction, plan: AuctionPlan) -> bool:
    """No candidate: deferred as the task's fallbacks say, or escalated after too many."""
    announcement = auction.announcement
    deferral = auction.write(
        lambda session: defer(session, announcement, new=auction.new), written=Deferral(moved=True)
    )
    if not deferral.moved:
        return False
    if deferral.escalated is not None:
        # After the commit: errbacks may run here, and must not hold the write lock.
        escalate(Context(auction.settings, auction.app), announcement, deferral.escalated)
    else:
        events.deferred(
            auction.app,
            announcement,
            f"no live node offers {announcement.wanted}",
        )
    return True


ROUTES: dict[Route, Callable[[Auction, AuctionPlan], bool]] = {
    Route.JOURNAL: _journal,
    Route.PROXY: _proxy,
    Route.MIXED: _ask,
    Route.ASK: _ask,
    Route.WAIT: _wait,
    Route.DEFER: _defer,
    Route.NONE: _none,
}
