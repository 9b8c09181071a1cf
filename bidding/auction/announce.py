"""Announcing a task: record it, pick its candidates, and ask them to bid (or bid for them).

A new task is announced by its caller (``announce``); a scheduled start, a retry after its
backoff and a deferred task are announced by a sweeper when they come due (``announce_due``).
With no capable live node the task is deferred or escalated, as its fallbacks say.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery
from celery.result import AsyncResult
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from bidding import clock
from bidding.auction.award import route_award, stored_award, strategy_of
from bidding.auction.board import get_board
from bidding.auction.candidates import select_candidates, split_by_bidder
from bidding.auction.close import close_auction
from bidding.auction.consumer import request_bids
from bidding.auction.opening import record_new, row_values
from bidding.auction.proxy import award_by_proxy, post_proxy_answers
from bidding.auction.request_view import bidder_view
from bidding.auction.writebehind import AppendUnknown, award_behind, settle
from bidding.config import Settings
from bidding.errors import EscalatedError, NoBidsError
from bidding.execution.report import fail_caller
from bidding.lifecycle import events, journal, parking, states
from bidding.lifecycle.transition import transition
from bidding.models import Announcement, Award
from bidding.nodes.registry import LiveNode, coming_back, live_nodes
from bidding.store import ensure_schema, read_session, write_session
from bidding.store.outage import outlasting
from bidding.store.schema import Announcement as AnnouncementRow
from bidding.strategies.protocol import decides_at_once

logger = logging.getLogger(__name__)

#: Seconds a caller's ``.delay()`` waits for an unreachable store (a PostgreSQL restart)
#: before it raises.
CALLER_PATIENCE = 15.0


def announce(
    app: Celery,
    settings: Settings,
    rfp: Announcement,
    *,
    delay: float = 0.0,
    fresh_id: bool = False,
) -> AsyncResult:
    """Record ``rfp``, ask the candidates to bid (now, or after ``delay`` seconds), and return
    the AsyncResult of its execution. ``fresh_id``: the task id was generated for this call
    (not given by the caller), so no other auction can have it."""
    if settings.auto_migrate:
        ensure_schema(settings.database_url)
    if delay > 0:
        def schedule() -> bool:
            with write_session(settings.database_url) as session:
                session.add(_row(rfp, states.PENDING, [], due_at=rfp.announced_at + delay))
                journal.record(session, rfp.task_id, journal.SCHEDULED, attempt=rfp.attempt,
                               at=rfp.announced_at, task_type=rfp.task_type, delay_s=delay)
            return True

        write_new(settings, rfp, f"scheduling {rfp.task_id}", schedule)
    else:
        open_auction(app, settings, rfp, new=True, fresh_id=fresh_id)
    return AsyncResult(rfp.task_id, app=app)


def _row(rfp: Announcement, state: str, candidates: list[str], *,
         due_at: float | None = None) -> AnnouncementRow:
    return AnnouncementRow(**row_values(rfp, state, candidates, due_at=due_at))


def open_auction(app: Celery, settings: Settings, rfp: Announcement, *, new: bool,
                 fresh_id: bool = False) -> bool:
    """Start the auction of ``rfp`` (a new task, or a due retry, deferral or scheduled start).

    Its bid mode says who bids for each candidate (``candidates.split_by_bidder``): when the
    announcer may bid for all of them, it awards at once (``proxy``); else it asks the others
    and, in a mixed auction, posts the bids it made for the rest first.
    With no candidate the task is deferred (if its fallbacks say so), or the auction closes at
    once with the no-bid outcome. False when a due task was already taken by another sweeper.
    """
    in_time = rfp.deadline is None or rfp.deadline > clock.now()
    # A caller's .delay() outlasts a dropped store connection here too; a sweeper's due task
    # is simply taken again by the next sweep.
    live, candidates, waiting = (
        outlasting(settings.database_url, f"finding the candidates of {rfp.task_id}",
                   lambda: _look(settings, rfp, in_time), patience=CALLER_PATIENCE)
        if new else _look(settings, rfp, in_time))
    sent: list[bool] = []

    def opened() -> None:
        # Flower's ANNOUNCED, once, before anything can answer or award (its events must
        # reach Flower in the auction's order).
        if not sent:
            sent.append(True)
            events.announced(app, rfp, len(candidates))

    proxied, asked = split_by_bidder(rfp.bid_mode or settings.bid_mode, live, candidates)
    proxy = bool(candidates) and not asked
    if (proxy and new and fresh_id and settings.award_journal
            and decides_at_once(strategy_of(settings, rfp))):
        # Decided here, its rows written behind (bidding.auction.writebehind).
        opened()
        if _award_behind(app, settings, rfp, live, candidates):
            return True
    if proxy and new and decides_at_once(strategy_of(settings, rfp)):
        # The announcement, its bids and its award in one transaction.
        opened()
        if _award_by_proxy(app, settings, rfp, live, candidates,
                           opening=lambda session: record_new(session, rfp, candidates)):
            return True
        proxy = False  # nothing was written: announce as usual, asking the candidates
    if not proxy and not asked:
        proxied, asked = [], list(candidates)
    defer = (not candidates and not waiting
             and rfp.fallbacks.on_capability_unavailable == "defer" and in_time)
    view = bidder_view(rfp, settings.bid_request_limit) if asked and not proxy else None
    # A new auction on the Redis board asks for bids before its row is written: the answers go
    # to the board, not the store, and the award waits for the row (close_auction). The row's
    # insert then overlaps the bidding instead of delaying it.
    # Only for an id generated for this call: a caller's own id may belong to an existing task,
    # whose open auction must not receive answers meant for this one. And only when the
    # requests carry the whole announcement: else the closer reads it from the row.
    early = (view is not None and view[1] and new and fresh_id
             and get_board(settings, app).writes_on_award)
    if early:
        opened()
        _ask(app, settings, rfp, live, proxied, asked, view)

    def record() -> bool | str:
        with write_session(settings.database_url) as session:
            if waiting:
                return _await_nodes(session, settings, rfp, waiting, new=new)
            if defer:
                return _defer(session, rfp, new=new)
            if new:
                record_new(session, rfp, candidates)
                return True
            return transition(
                session, rfp.task_id, states.BIDDING, kind=journal.ANNOUNCED,
                from_states=states.DUE_STATES, expect_attempt=rfp.attempt,
                detail={"task_type": rfp.task_type, "candidates": candidates},
                spec=rfp.model_dump(mode="json"), candidates=candidates,
                expected_bids=len(candidates), bids_received=0, due_at=None,
                closes_at=rfp.announced_at + rfp.window, assigned_node=None, awarded_at=None)

    # A caller's .delay() waits out a store restart (a few seconds) rather than fail; a
    # sweeper's due task is simply taken again by the next sweep.
    try:
        deferred = (write_new(settings, rfp, f"announcing {rfp.task_id}", record) if new
                    else record())
    except Exception as exc:
        if sent:  # Flower was told it is open: it is not (the caller gets the exception)
            events.failed(app, rfp, exc)
        raise
    if not deferred:
        return False
    if waiting:
        events.deferred(app, rfp, f"waiting for {', '.join(waiting)} (reconnecting)")
        return True
    if defer:
        if isinstance(deferred, str):
            # After the commit: errbacks may run here, and must not hold the write lock.
            escalate(app, settings, rfp, deferred)
        else:
            events.deferred(app, rfp, "no live node offers "
                            + (", ".join(rfp.required_skills) or "any skill"))
        return True
    opened()
    if not candidates:
        close_auction(settings, app, rfp.task_id, rfp.attempt, closed_by="no candidates")
    elif proxy:
        if not _award_by_proxy(app, settings, rfp, live, candidates):
            request_bids(settings, app, rfp, candidates)
    elif not early:
        try:
            _ask(app, settings, rfp, live, proxied, asked, view)
        except Exception as exc:
            _requests_unsent(settings, rfp, exc, new=new)
            if new:
                raise  # .delay() raises: the caller knows the task was not accepted
    return True


_RECORDED = select(AnnouncementRow.attempt, AnnouncementRow.announced_at).where(
    AnnouncementRow.task_id == bindparam("task_id"))


def write_new(settings: Settings, rfp: Announcement, what: str,
              write: Callable[[], bool | str]) -> bool | str:
    """A caller's first write of its new task (``write`` inserts its row), tried again while
    the store is unreachable for up to ``CALLER_PATIENCE`` seconds; a try whose commit landed
    while its reply was lost with the connection is known by the row's announcement time, and
    not written twice (its insert would fail, and ``.delay()`` raise for a task that runs)."""
    tries: list[int] = []

    def once() -> bool | str:
        tries.append(1)
        if len(tries) > 1 and _recorded(settings, rfp):
            return True
        return write()

    return outlasting(settings.database_url, what, once, patience=CALLER_PATIENCE)


def _recorded(settings: Settings, rfp: Announcement) -> bool:
    """Whether ``rfp``'s new row is in the store already, written by this very call (its
    announcement time): an earlier try committed, and only its reply was lost."""
    with read_session(settings.database_url) as session:
        found = session.execute(_RECORDED, {"task_id": rfp.task_id}).one_or_none()
    return (found is not None and found.attempt == rfp.attempt
            and found.announced_at == rfp.announced_at)


def _look(settings: Settings, rfp: Announcement, in_time: bool
          ) -> tuple[list[LiveNode], list[str], list[str]]:
    """The live nodes, ``rfp``'s candidates among them, and (with none) the capable nodes it
    should wait for.

    "No candidate" is never concluded from the cached list (it may predate nodes coming back
    from a broker restart): it is read again first. And with none live, capable nodes that
    stopped being live a moment ago without stopping cleanly (a broker restart, heartbeats
    that did not reach the store, a worker restarting) are coming back: the task waits for
    them rather than failing or deferring (``registry.coming_back``).
    """
    live = live_nodes(settings)
    candidates = select_candidates(rfp, live)
    if not candidates:
        live = live_nodes(settings, fresh=True)
        candidates = select_candidates(rfp, live)
    waiting = (coming_back(settings, rfp.required_skills) if not candidates and in_time
               else [])
    return live, candidates, waiting


def _ask(app: Celery, settings: Settings, rfp: Announcement, live: Sequence[LiveNode],
         proxied: Sequence[str], asked: Sequence[str],
         view: tuple[Announcement, bool] | None) -> None:
    """Ask ``asked`` to bid; in a mixed auction, post the bids made for ``proxied`` first, so
    that the last answer to come in is an asked node's (and its node closes the auction)."""
    expected = len(proxied) + len(asked)
    if proxied:
        by_name = {node.name: node for node in live}
        posted = post_proxy_answers(settings, app, rfp, [by_name[n] for n in proxied],
                                    expected)
        if posted.complete:  # not before the asked ones answer; never left open regardless
            close_auction(settings, app, rfp.task_id, rfp.attempt, closed_by="all bids in",
                          rfp=rfp, candidates=expected)
            return
    request_bids(settings, app, rfp, asked, expected=expected, view=view)


def _requests_unsent(settings: Settings, rfp: Announcement, exc: Exception, *,
                     new: bool) -> None:
    """The bid requests of an auction whose row is committed could not be sent (the broker
    down past Celery's publish retries). A new task ends FAILED with the reason (its caller
    gets the exception from ``.delay()``); a due one (a retry, a deferral) is left to close
    with no bids and its fallbacks, as if no candidate had answered."""
    reason = f"its bid requests could not be sent: {type(exc).__name__}: {exc}"
    logger.error("task %s: %s", rfp.task_id, reason)
    if not new:
        return
    with write_session(settings.database_url) as session:
        transition(session, rfp.task_id, states.FAILED, kind=journal.TASK_FAILED,
                   from_states=(states.BIDDING,), expect_attempt=rfp.attempt,
                   detail={"error": reason}, error=reason, finished_at=clock.now())


def _award_by_proxy(app: Celery, settings: Settings, rfp: Announcement,
                    live: Sequence[LiveNode], candidates: Sequence[str],
                    opening: Callable[[Session], object] | None = None) -> bool:
    """Bid for the candidates and award now (``proxy``), then route the award. False,
    with the error logged, when no award could be committed: the caller then asks the
    candidates, so the auction still runs."""
    by_name = {node.name: node for node in live}
    try:
        award = award_by_proxy(settings, app, rfp, [by_name[name] for name in candidates],
                               opening)
    except Exception:
        logger.exception("proxy bids for %s failed; asking the candidates instead", rfp.task_id)
        return False
    if award is not None:
        route_award(app, settings, rfp, award)
    return True


def _award_behind(app: Celery, settings: Settings, rfp: Announcement,
                  live: Sequence[LiveNode], candidates: Sequence[str]) -> bool:
    """Bid for the candidates and award now into the write-behind journal, then route the
    award. False, with the error logged, when the journal could not take it (Redis down, the
    board not Redis): the caller then writes the award in the store's transaction. When the
    journal may have taken it (an append whose reply was lost, ``AppendUnknown``), the store
    decides (``_award_unsure``)."""
    by_name = {node.name: node for node in live}
    try:
        award = award_behind(settings, app, rfp, [by_name[name] for name in candidates])
    except AppendUnknown as exc:
        logger.warning("%s; the store decides", exc)
        try:
            return _award_unsure(app, settings, rfp, [by_name[name] for name in candidates])
        except Exception as error:  # Flower was told it is open: it is not (.delay() raises)
            events.failed(app, rfp, error)
            raise
    except Exception as exc:  # Redis restarting, say: the store's path still awards it
        logger.warning("journaling the award of %s failed (%s: %s); writing it to the store "
                       "instead", rfp.task_id, type(exc).__name__, exc)
        return False
    if award is None:
        return False
    if award.winner is None:
        # Failing the caller also writes the error to the task's row: write it now (rare).
        try:
            settle(settings, app, rfp.task_id)
        except Exception as exc:  # a writer writes the row; the caller still gets its error
            logger.warning("task %s: writing its journaled award failed (%s)", rfp.task_id, exc)
    route_award(app, settings, rfp, award)
    return True


class _WrittenBehind(Exception):
    """The announcement's row is in the store already: a writer wrote the journal's award."""


def _award_unsure(app: Celery, settings: Settings, rfp: Announcement,
                  candidates: Sequence[LiveNode]) -> bool:
    """Award ``rfp`` in the store's transaction when the journal may hold an award of it
    (its append's reply was lost, and Redis could not say), and route whichever award the
    store keeps.

    The announcement is inserted once, as a writer of the journal's entry inserts it: if a
    writer wrote the entry first, nothing of this award is written, and the journal's award,
    read from the store, is routed; if this one is first, the writer skips the entry (and
    drops its reservation), and the journal's award is never sent. One award either way, and
    no exception for a task that runs. The store's outage is waited out as the caller's
    insert waits it out; past that, ``.delay()`` raises, as on the store's path (if the
    journal had taken the award, a writer writes it later and the task runs: only a store
    that answers can tell)."""
    def opening(session: Session) -> None:
        if not record_new(session, rfp, [n.name for n in candidates], once=True):
            raise _WrittenBehind  # rolls this award's transaction back

    def award() -> Award | None:
        try:
            return award_by_proxy(settings, app, rfp, candidates, opening)
        except _WrittenBehind:
            return stored_award(settings, rfp.task_id)

    decided = outlasting(settings.database_url, f"announcing {rfp.task_id}", award,
                         patience=CALLER_PATIENCE)
    if decided is not None:
        route_award(app, settings, rfp, decided)
    return True


def _await_nodes(session: Session, settings: Settings, rfp: Announcement, nodes: list[str],
                 *, new: bool) -> bool:
    """Announce ``rfp`` again in a heartbeat interval: no live node can do it now, but
    ``nodes`` can and are reconnecting. Not a deferral: it neither counts against
    ``max_deferrals`` nor lasts past ``bidding_liveness_grace`` after they were last seen."""
    now = clock.now()
    wait = settings.heartbeat_interval
    due = now + wait
    detail: dict[str, Any] = {
        "reason": (f"no live node offers {', '.join(rfp.required_skills) or 'any skill'} "
                   f"right now; waiting for {', '.join(nodes)} (offline for less than "
                   f"{settings.liveness_grace:g}s: reconnecting to the broker)"),
        "retry_in_s": wait, "deferrals": rfp.deferrals, "waiting_for": nodes}
    return _to_deferred(session, rfp, None, detail, now, due, new=new)


def _defer(session: Session, rfp: Announcement, *, new: bool) -> bool | str:
    """No live node can do ``rfp``: announce it again later, or escalate after too many tries
    (then the reason is returned: the caller escalates once the transaction has committed)."""
    fb = rfp.fallbacks
    now = clock.now()
    if rfp.deferrals >= fb.max_deferrals:
        # Never a new task: it starts with 0 deferrals ("deferrals" is no caller option) and
        # max_deferrals >= 1, so it was deferred before and has a DEFERRED row to leave.
        reason = (f"deferred {rfp.deferrals} times: no live node offers "
                  f"{', '.join(rfp.required_skills) or 'any skill'}")
        if not transition(session, rfp.task_id, states.ESCALATED, kind=journal.ESCALATED,
                          from_states=(states.DEFERRED,), detail={"reason": reason},
                          error=reason, finished_at=now, due_at=None):
            return False
        return reason
    later = rfp.model_copy(update={"deferrals": rfp.deferrals + 1})
    due = now + fb.defer_seconds
    detail: dict[str, Any] = {
        "reason": "no live node offers " + (", ".join(rfp.required_skills) or "any skill"),
        "retry_in_s": fb.defer_seconds, "deferrals": later.deferrals}
    return _to_deferred(session, rfp, later, detail, now, due, new=new)


def _to_deferred(session: Session, rfp: Announcement, later: Announcement | None,
                 detail: dict[str, Any], now: float, due: float, *, new: bool) -> bool:
    """Enter DEFERRED until ``due``: a new task gets its row and message, a due one moves by
    compare-and-set. ``later``: the spec to announce then (None: ``rfp``'s, unchanged)."""
    if new:
        session.add(_row(later or rfp, states.DEFERRED, [], due_at=due))
        journal.record(session, rfp.task_id, journal.DEFERRED, attempt=rfp.attempt, at=now,
                       **detail)
        return True
    spec: dict[str, Any] = {} if later is None else {"spec": later.model_dump(mode="json")}
    return transition(session, rfp.task_id, states.DEFERRED, kind=journal.DEFERRED,
                      from_states=states.DUE_STATES, expect_attempt=rfp.attempt, detail=detail,
                      due_at=due, **spec)


def escalate(app: Celery, settings: Settings, rfp: Announcement, reason: str) -> None:
    """Fail the caller's result with :class:`EscalatedError` and notify (task_escalated)."""
    from bidding.signals import notify, task_escalated

    events.escalated(app, rfp, reason)
    fail_caller(app, settings, rfp, EscalatedError(reason))
    notify(settings, task_escalated, "task_escalated", task_id=rfp.task_id, reason=reason)


_DUE = (
    select(AnnouncementRow.spec, AnnouncementRow.task_id, AnnouncementRow.state,
           AnnouncementRow.attempt, AnnouncementRow.scan_failures)
    .where(AnnouncementRow.state.in_(sorted(states.DUE_STATES)),
           AnnouncementRow.due_at <= bindparam("now"), parking.UNPARKED)
    .order_by(AnnouncementRow.due_at, AnnouncementRow.task_id)
    .limit(bindparam("limit"))
)


def announce_due(settings: Settings, app: Celery, now: float | None = None,
                 limit: int = 100) -> int:
    """Announce every task whose scheduled start, retry backoff or deferral has come.

    One task at a time: one that fails (an announcement this version cannot read) must not
    stop the others; it stays the first due, so it is counted, and parked if it keeps
    failing (``lifecycle.parking``)."""
    now = clock.now() if now is None else now
    with read_session(settings.database_url) as session:
        due = session.execute(_DUE, {"now": now, "limit": limit}).all()
    opened = 0
    tally = parking.Tally("announcer")
    for spec, *read in due:
        seen = parking.Seen(*read)
        try:
            rfp = Announcement.model_validate(spec).model_copy(update={"announced_at": now})
            if rfp.deadline is not None and now > rfp.deadline:
                _expire(settings, app, rfp)
            elif open_auction(app, settings, rfp, new=False):
                opened += 1
        except Exception as exc:
            tally.failure(seen, exc)
            if parking.is_outage(exc):
                break  # the store or the broker is down: the next tasks would wait on it too
        else:
            tally.success(seen)
    tally.save(settings.database_url)
    return opened


def _expire(settings: Settings, app: Celery, rfp: Announcement) -> None:
    """A waiting task whose deadline passed is never started: FAILED."""
    reason = "deadline passed before the task could start"
    with write_session(settings.database_url) as session:
        moved = transition(session, rfp.task_id, states.FAILED, kind=journal.TASK_FAILED,
                           from_states=states.DUE_STATES, expect_attempt=rfp.attempt,
                           detail={"error": reason}, error=reason, finished_at=clock.now(),
                           due_at=None)
    if moved:
        fail_caller(app, settings, rfp, NoBidsError(reason))
