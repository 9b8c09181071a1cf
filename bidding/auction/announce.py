"""Announcing a task: record it, pick its candidates, plan its auction and run the plan.

A new task is announced by its caller (``announce``); a scheduled start, a retry after its
backoff and a deferred task are announced by a sweeper when they come due (``announce_due``).
``open_auction`` filters the live nodes to the candidates, plans the route once
(``plan.plan_auction``) and runs it (``routes``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence

from celery.result import AsyncResult
from sqlalchemy import bindparam, func, select

from bidding import clock, tracing
from bidding.auction import due_claim
from bidding.auction.award import strategy_of
from bidding.auction.board import get_board
from bidding.auction.candidates import select_candidates
from bidding.auction.expiry import expire
from bidding.auction.loads import recent_loads
from bidding.auction.opening import write_tags
from bidding.auction.plan import Circumstances, Route, plan_auction
from bidding.auction.routes import Auction, run_plan
from bidding.auction.row_writes import CALLER_PATIENCE, new_row, write_new
from bidding.config import Settings
from bidding.context import Context
from bidding.lifecycle import events, journal, parking, states
from bidding.models import Announcement
from bidding.nodes.records import records_of
from bidding.nodes.registry import LiveNode, coming_back, live_nodes
from bidding.store import ensure_schema, read_session, write_session
from bidding.store.outage import outlasting
from bidding.store.schema import AnnouncementRow
from bidding.strategies.protocol import decides_at_once

logger = logging.getLogger(__name__)

#: Routes that do not open an auction: the task waits, or is deferred (Flower hears of it as
#: DEFERRED or ESCALATED, never ANNOUNCED).
_NOT_OPENED = frozenset({Route.WAIT, Route.DEFER})


def announce(
    ctx: Context,
    announcement: Announcement,
    *,
    delay: float = 0.0,
    fresh_id: bool = False,
) -> AsyncResult:
    """Record ``announcement``, ask the candidates to bid (now, or after ``delay`` seconds), and
    return
    the AsyncResult of its execution. ``fresh_id``: the task id was generated for this call
    (not given by the caller), so no other auction can have it. Traced: the task's first span
    (``tracing.announce_span``)."""
    with tracing.announce_span(announcement):
        return _announce(ctx, announcement, delay, fresh_id)


def _announce(ctx: Context, announcement: Announcement, delay: float, fresh_id: bool
              ) -> AsyncResult:
    """``announce``, within its span."""
    if ctx.settings.auto_migrate:
        ensure_schema(ctx.settings.database_url)
    expired = announcement.expired(announcement.announced_at)
    if delay > 0 or expired:

        def schedule() -> bool:
            with write_session(ctx.settings.database_url) as session:
                session.add(
                    new_row(
                        announcement, states.PENDING, [], due_at=announcement.announced_at + delay
                    )
                )
                if announcement.tags:
                    session.flush()
                    write_tags(session, announcement)
                journal.record(
                    session,
                    announcement.task_id,
                    journal.SCHEDULED,
                    attempt=announcement.attempt,
                    at=announcement.announced_at,
                    task_type=announcement.task_type,
                    delay_s=delay,
                )
            return True

        write_new(
            ctx.settings, announcement, f"scheduling {announcement.task_id}", schedule, written=True
        )
        if expired:
            # Expired at the call (expires=0, a past datetime or deadline): recorded, never
            # announced, and ended at once, as a sweeper would end it.
            expire(ctx, announcement, states.PENDING, where="it was called")
    else:
        open_auction(ctx, announcement, new=True, fresh_id=fresh_id)
    return AsyncResult(announcement.task_id, app=ctx.app)


def open_auction(
    ctx: Context,
    announcement: Announcement,
    *,
    new: bool,
    fresh_id: bool = False,
) -> bool:
    """Start the auction of ``announcement`` (a new task, or a due retry, deferral or
    scheduled start): filter the live nodes to its candidates, plan its route once and run
    it. False when a due task was already taken by another sweeper."""
    in_time = not announcement.expired(clock.now())
    # A caller's .delay() outlasts a dropped store connection here too; a sweeper's due task
    # is simply taken again by the next sweep.
    live, candidates, waiting = (
        outlasting(
            ctx.settings.database_url,
            f"finding the candidates of {announcement.task_id}",
            lambda: _look(ctx.settings, announcement, in_time),
            patience=CALLER_PATIENCE,
        )
        if new
        else _look(ctx.settings, announcement, in_time)
    )
    plan = plan_auction(
        announcement,
        live,
        candidates,
        waiting,
        Circumstances(
            new=new,
            fresh_id=fresh_id,
            bid_mode=announcement.bid_mode or ctx.settings.bid_mode,
            decides_at_once=decides_at_once(strategy_of(ctx.settings, announcement)),
            journal=ctx.settings.award_journal,
            board_keeps_answers=get_board(ctx).writes_on_award,
            request_limit=ctx.settings.bid_request_limit,
            in_time=in_time,
        ),
    )
    auction = Auction(ctx.app, ctx.settings, announcement, new, live)
    if plan.route in _NOT_OPENED:
        return run_plan(auction, plan)
    # Flower's ANNOUNCED, before anything can answer or award (its events must reach Flower
    # in the auction's order); if an exception then ends the call, Flower hears it failed.
    events.announced(ctx.app, announcement, len(plan.candidates))
    try:
        return run_plan(auction, plan)
    except Exception as exc:
        events.failed(ctx.app, announcement, exc)
        raise


def _look(
    settings: Settings, announcement: Announcement, in_time: bool
) -> tuple[list[LiveNode], list[str], list[str]]:
    """The live nodes, ``announcement``'s candidates among them (the filter), and (with none) the
    capable nodes it should wait for.

    "No candidate" is never concluded from the cached list (it may predate nodes coming back
    from a broker restart): it is read again first. And with none live, capable nodes that
    stopped being live a moment ago without stopping cleanly (a broker restart, heartbeats
    that did not reach the store, a worker restarting) are coming back: the task waits for
    them rather than failing or deferring (``registry.coming_back``).
    """
    live = live_nodes(settings)
    # Read only when there are more eligible nodes than the cap: they are ranked by their
    # record on this task type, and their kin's.
    typed = functools.partial(records_of, settings, announcement.task_type)
    loads = functools.partial(recent_loads, settings)
    candidates = select_candidates(announcement, live, records=typed, loads=loads)
    if not candidates:
        live = live_nodes(settings, fresh=True)
        candidates = select_candidates(announcement, live, records=typed, loads=loads)
    waiting = (
        coming_back(settings, announcement.required_skills, needs=announcement.resources)
        if not candidates and in_time else []
    )
    return live, candidates, waiting


#: The tasks ``announce_due`` announces once their ``due_at`` comes.
_WAITING_TO_ANNOUNCE = (AnnouncementRow.state.in_(sorted(states.DUE_STATES)), parking.UNPARKED)
_DUE = (
    select(AnnouncementRow.spec, AnnouncementRow.due_at, *parking.SEEN_COLUMNS)
    .where(*_WAITING_TO_ANNOUNCE, AnnouncementRow.due_at <= bindparam("now"))
    # Most urgent first (tasks waiting for a capable node, or for one coming back, may all come
    # due at once: the first announced gets the free slot), then oldest; the task id makes
    # every pass take them in the same order (``lifecycle.parking`` relies on it).
    .order_by(AnnouncementRow.priority.desc(), AnnouncementRow.due_at, AnnouncementRow.task_id)
    .limit(bindparam("limit"))
)


#: When the first waiting task comes due, or came (None: none waits): what an idle sweeper
#: reads instead of running ``announce_due`` (``auction.idle_look``).
NEXT_DUE_AT = (select(func.min(AnnouncementRow.due_at)).where(*_WAITING_TO_ANNOUNCE)
               .scalar_subquery())


#: The same, for some tasks only (``alarm``: the retries one process scheduled).
_DUE_OF = _DUE.where(AnnouncementRow.task_id.in_(bindparam("ids", expanding=True)))


def announce_due(
    ctx: Context, now: float | None = None, limit: int = 100,
    task_ids: Sequence[str] | None = None,
) -> int:
    """Announce every task whose scheduled start, retry backoff or deferral has come (or
    only those of ``task_ids`` among them).

    One task at a time: one that fails (an announcement this version cannot read) must not
    stop the others; it stays the first due, so it is counted, and parked if it keeps
    failing (``lifecycle.parking``). Each is claimed first (``due_claim``): a task another
    announcer is announcing (the retry's alarm, another sweeper) is skipped, so that one
    attempt has one announcement span and one ANNOUNCED event."""
    now = clock.now() if now is None else now
    with read_session(ctx.settings.database_url) as session:
        if task_ids is None:
            due = session.execute(_DUE, {"now": now, "limit": limit}).all()
        else:
            due = session.execute(_DUE_OF, {"now": now, "limit": limit,
                                            "ids": list(task_ids)}).all()
    opened = 0
    tally = parking.Tally("announcer")
    url = ctx.settings.database_url
    for spec, due_at, *read in due:
        seen = parking.Seen(*read)
        claimed: float | None = None
        try:
            announcement = Announcement.model_validate(spec).model_copy(
                update={"announced_at": now}
            )
            claimed = due_claim.claim(url, seen.task_id, seen.attempt, now)
            if claimed is None:
                continue  # another announcer has it
            with tracing.announce_span(announcement):  # a child of the task's first
                if announcement.expired(now):
                    # Never announced again: it ends here (the expiry scan may be a pass
                    # behind).
                    expire(ctx, announcement, seen.state, now)
                elif open_auction(ctx, announcement, new=False):
                    opened += 1
        except Exception as exc:
            if claimed is not None:
                due_claim.release(url, seen.task_id, seen.attempt, claimed, due_at)
            tally.failure(seen, exc)
            if parking.is_outage(exc):
                break  # the store or the broker is down: the next tasks would wait on it too
        else:
            tally.success(seen)
    tally.save(ctx.settings.database_url)
    return opened
