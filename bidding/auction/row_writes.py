"""The announcement's row as an auction opens: a new task's insert (outlasting a store restart,
and knowing its own landed commit), a due task's move back to BIDDING, and the DEFERRED row of
a task that waits for nodes or is deferred (or escalated) for want of any."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from bidding import clock
from bidding.auction.opening import row_values, write_tags
from bidding.config import Settings
from bidding.context import Context
from bidding.errors import EscalatedError
from bidding.execution.report import fail_caller
from bidding.lifecycle import events, journal, states
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import Announcement
from bidding.store import read_session
from bidding.store.outage import outlasting
from bidding.store.schema import AnnouncementRow

T = TypeVar("T")

#: Seconds a caller's ``.delay()`` waits for an unreachable store (a PostgreSQL restart)
#: before it raises.
CALLER_PATIENCE = 15.0


def new_row(announcement: Announcement, state: str, candidates: list[str], *,
            due_at: float | None = None) -> AnnouncementRow:
    """A new task's row, in ``state``."""
    return AnnouncementRow(**row_values(announcement, state, candidates, due_at=due_at))


_RECORDED = select(AnnouncementRow.attempt, AnnouncementRow.announced_at).where(
    AnnouncementRow.task_id == bindparam("task_id"))


def write_new(settings: Settings, announcement: Announcement, what: str,
              write: Callable[[], T], written: T) -> T:
    """A caller's first write of its new task (``write`` inserts its row), tried again while
    the store is unreachable for up to ``CALLER_PATIENCE`` seconds. A try whose commit landed
    while its reply was lost with the connection is known by the row's announcement time, and
    not written twice (its insert would fail, and ``.delay()`` raise for a task that runs):
    then ``written`` is what the write would have returned."""
    tries: list[int] = []

    def once() -> T:
        tries.append(1)
        if len(tries) > 1 and _recorded(settings, announcement):
            return written
        return write()

    return outlasting(settings.database_url, what, once, patience=CALLER_PATIENCE)


def _recorded(settings: Settings, announcement: Announcement) -> bool:
    """Whether the new row is in the store already, written by this very call (its
    announcement time): an earlier try committed, and only its reply was lost."""
    with read_session(settings.database_url) as session:
        found = session.execute(_RECORDED, {"task_id": announcement.task_id}).one_or_none()
    return (found is not None and found.attempt == announcement.attempt
            and found.announced_at == announcement.announced_at)


def reopen(session: Session, announcement: Announcement, candidates: list[str]) -> bool:
    """Move a due task (a retry, a deferral, a scheduled start) back to BIDDING for its
    auction; False when another sweeper took it first."""
    return transition(session, announcement.task_id, states.BIDDING,
                      Log(journal.ANNOUNCED, detail={
                          "task_type": announcement.task_type, "candidates": candidates,
                          # Which nodes this attempt was to avoid (they failed the task or
                          # lost it), for explain: the row keeps only the latest attempt's.
                          **({"exclude_nodes": list(announcement.exclude_nodes)}
                             if announcement.exclude_nodes else {})}),
                      Expect(states=states.DUE_STATES, attempt=announcement.attempt),
                      spec=announcement.model_dump(mode="json"), candidates=candidates,
                      expected_bids=len(candidates), bids_received=0, due_at=None,
                      closes_at=announcement.announced_at + announcement.window,
                      assigned_node=None, awarded_at=None)


def await_nodes(session: Session, settings: Settings, announcement: Announcement,
                nodes: list[str], *, new: bool) -> bool:
    """Announce again in a heartbeat interval: no live node can do it now, but ``nodes`` can
    and are coming back. Not a deferral: it neither counts against ``max_deferrals`` nor
    lasts past ``bidding_liveness_grace``."""
    now = clock.now()
    wait = settings.heartbeat_interval
    skills = announcement.wanted
    detail: dict[str, Any] = {
        "reason": (f"no live node offers {skills} right now; waiting for {', '.join(nodes)} "
                   f"(offline for less than {settings.liveness_grace:g}s: reconnecting to "
                   "the broker)"),
        "retry_in_s": wait, "deferrals": announcement.deferrals, "waiting_for": nodes}
    return _to_deferred(session, announcement, None, detail, now, now + wait, new=new)


@dataclass(frozen=True)
class Deferral:
    """What deferring a task did."""

    #: False: another sweeper took the task first, nothing was written.
    moved: bool
    #: The reason, when it was escalated instead (deferred too often): the caller escalates
    #: once the transaction has committed.
    escalated: str | None = None


def defer(session: Session, announcement: Announcement, *, new: bool) -> Deferral:
    """No live node can do the task: announce it again later, or escalate it after too many
    tries."""
    fallbacks = announcement.fallbacks
    skills = announcement.wanted
    now = clock.now()
    if announcement.deferrals >= fallbacks.max_deferrals:
        # Never a new task: it starts with 0 deferrals ("deferrals" is no caller option) and
        # max_deferrals >= 1, so it was deferred before and has a DEFERRED row to leave.
        reason = f"deferred {announcement.deferrals} times: no live node offers {skills}"
        moved = transition(session, announcement.task_id, states.ESCALATED,
                           Log(journal.ESCALATED, detail={"reason": reason}),
                           Expect(states=(states.DEFERRED,)), error=reason, finished_at=now,
                           due_at=None)
        return Deferral(moved, reason if moved else None)
    later = announcement.model_copy(update={"deferrals": announcement.deferrals + 1})
    detail: dict[str, Any] = {"reason": f"no live node offers {skills}",
                              "retry_in_s": fallbacks.defer_seconds,
                              "deferrals": later.deferrals}
    return Deferral(_to_deferred(session, announcement, later, detail, now,
                                 now + fallbacks.defer_seconds, new=new))


def _to_deferred(session: Session, announcement: Announcement, later: Announcement | None,
                 detail: dict[str, Any], now: float, due: float, *, new: bool) -> bool:
    """Enter DEFERRED until ``due``: a new task gets its row and message, a due one moves by
    compare-and-set. ``later``: the spec to announce then (None: unchanged)."""
    if new:
        session.add(new_row(later or announcement, states.DEFERRED, [], due_at=due))
        if announcement.tags:
            session.flush()
            write_tags(session, announcement)
        journal.record(session, announcement.task_id, journal.DEFERRED,
                       attempt=announcement.attempt, at=now, **detail)
        return True
    spec: dict[str, Any] = {} if later is None else {"spec": later.model_dump(mode="json")}
    return transition(session, announcement.task_id, states.DEFERRED,
                      Log(journal.DEFERRED, detail=detail),
                      Expect(states=states.DUE_STATES, attempt=announcement.attempt), due_at=due,
                      **spec)


def escalate(ctx: Context, announcement: Announcement, reason: str) -> None:
    """Fail the caller's result with :class:`EscalatedError` and notify (task_escalated)."""
    from bidding.signals import notify, task_escalated

    events.escalated(ctx.app, announcement, reason)
    fail_caller(ctx, announcement, EscalatedError(reason))
    notify(ctx.settings, task_escalated, "task_escalated", task_id=announcement.task_id,
           reason=reason)
