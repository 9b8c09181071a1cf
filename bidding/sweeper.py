"""What every node worker's sweeper does, every ``bidding_sweep_interval`` seconds.

1. closes auctions past their window (the deadline closer);
2. announces tasks whose scheduled start, retry backoff or deferral has come;
3. watches winners: a task whose node stopped heartbeating, or that was not started within its
   schedule-to-start timeout, goes to the next-best bidder of the same auction (AITP 6.2
   SELECT_NEXT_BEST), to a new auction, or fails, as its fallbacks say; a task whose execution
   message could not be sent (SEND_FAILED), or, without a schedule-to-start timeout, that its
   live winner has not started by its delivery check, is sent again to the same winner.

All of it is driven by the store, so a lost message or a broker restart cannot leave a task
without a final state; concurrent sweeps of several nodes are made harmless by the transitions'
compare-and-set.
"""

from __future__ import annotations

import logging
import time
from typing import Any, cast

from celery import Celery
from sqlalchemy import ColumnElement, CursorResult, Update, and_, bindparam, or_, select, update

from bidding import journal, lifecycle
from bidding.announce import announce_due
from bidding.award import (
    close_expired,
    delivery_due,
    mark_undelivered,
    send_execution,
    start_by,
)
from bidding.board import history_changed
from bidding.canvas import fail_caller
from bidding.config import Settings
from bidding.errors import NodeLostError
from bidding.execution import record_episode
from bidding.models import Announcement
from bidding.profile import exec_queue
from bidding.registry import dead_after, query_live_nodes
from bidding.store import read_session, write_session
from bidding.store.schema import Announcement as AnnouncementRow
from bidding.store.schema import BidRow, Message, Node
from bidding.transition import transition

logger = logging.getLogger(__name__)


#: Sweeps per ``bidding_sweep_interval`` across the whole federation, on average: each node's
#: interval grows with the number of live nodes, so 64 idle nodes cost what 4 do.
SWEEPS_PER_INTERVAL = 4


def sweep(settings: Settings, app: Celery) -> int:
    """One sweep: close expired auctions, announce due tasks, watch winners.

    Returns the number of nodes alive, which sets the next sweep's interval.
    """
    # Each phase on its own: a failing one (the bid board's Redis unreachable, say) must not
    # stop the others, or retries, deferrals and watchdogs would stop with it.
    for phase in (close_expired, announce_due):
        try:
            phase(settings, app)
        except Exception:
            logger.exception("sweep: %s failed", phase.__name__)
    return check_winners(settings, app)[1]


def sweep_interval(settings: Settings, alive: int) -> float:
    """This node's seconds between sweeps when ``alive`` nodes sweep too."""
    return settings.sweep_interval * max(1.0, alive / SWEEPS_PER_INTERVAL)


_ALIVE = select(Node.name).where(Node.last_heartbeat >= bindparam("cutoff"))
_LOST = (
    select(AnnouncementRow.task_id, AnnouncementRow.attempt, AnnouncementRow.assigned_node,
           AnnouncementRow.state, AnnouncementRow.spec, AnnouncementRow.awarded_at)
    .where(AnnouncementRow.state.in_(sorted(lifecycle.IN_FLIGHT_STATES)),
           or_(AnnouncementRow.assigned_node.not_in(bindparam("alive", expanding=True)),
               and_(AnnouncementRow.state == lifecycle.ASSIGNED,
                    AnnouncementRow.due_at <= bindparam("now"))))
    .limit(bindparam("limit"))
)
#: What says whether an ASSIGNED attempt's message was sent: the last of these in its log
#: (a refused transition or a late bid logs other kinds in between).
_DELIVERY_KINDS = (journal.AWARDED, journal.REAWARDED, journal.SEND_FAILED, journal.RESENT)
_LAST_DELIVERY = (
    select(Message.kind)
    .where(Message.task_id == bindparam("task_id"), Message.attempt == bindparam("attempt"),
           Message.kind.in_(_DELIVERY_KINDS))
    .order_by(Message.id.desc())
    .limit(1)
)


def _still_assigned(due: ColumnElement[bool]) -> Update:
    """An UPDATE of one task while it is ASSIGNED at an attempt to a node, and ``due`` holds."""
    return update(AnnouncementRow).where(
        AnnouncementRow.task_id == bindparam("b_task"),
        AnnouncementRow.state == lifecycle.ASSIGNED,
        AnnouncementRow.attempt == bindparam("b_attempt"),
        AnnouncementRow.assigned_node == bindparam("b_node"), due)


_STATE = select(AnnouncementRow.state).where(AnnouncementRow.task_id == bindparam("task_id"))
#: A resender's lease on an undelivered task: it is not due again while the send is under way.
_LEASE = _still_assigned(AnnouncementRow.due_at <= bindparam("b_now")).values(
    due_at=bindparam("b_lease"))
#: After the send: the schedule-to-start clock, unless the node or another sweeper moved on.
_RELEASE = _still_assigned(AnnouncementRow.due_at == bindparam("b_lease")).values(
    due_at=bindparam("b_due"))


def check_winners(settings: Settings, app: Celery, now: float | None = None,
                  limit: int = 100) -> tuple[int, int]:
    """Re-place tasks whose winner is dead or late to start.

    Returns how many were moved, and how many nodes are alive.
    """
    now = time.time() if now is None else now
    cutoff = dead_after(settings, now)
    with read_session(settings.database_url) as session:
        alive = set(session.scalars(_ALIVE, {"cutoff": cutoff}))
        rows = session.execute(
            _LOST, {"alive": sorted(alive), "now": now, "limit": limit}).all()
        # A live winner's task that is due while ASSIGNED: its send failed, or it is late to
        # start (or, without a schedule-to-start timeout, its delivery is checked).
        send_failed = {task_id for task_id, attempt, node, state, *_ in rows
                       if node in alive and state == lifecycle.ASSIGNED
                       and session.scalar(_LAST_DELIVERY, {"task_id": task_id,
                                                           "attempt": attempt})
                       == journal.SEND_FAILED}
    if not rows:
        return 0, len(alive)
    live = {n.name for n in query_live_nodes(settings, now)}
    moved = 0
    for task_id, attempt, node, state, spec, awarded_at in rows:
        rfp = Announcement.model_validate(spec)
        dead = node not in alive
        if not dead and state == lifecycle.ASSIGNED and (
                task_id in send_failed or start_by(settings, rfp, now) is None):
            # The node is not to blame: send it again. Without a start deadline the task was
            # due for a delivery check: its message may have been lost (the process that
            # awarded it died before sending); a second copy is dropped by the node.
            why = ("its send failed" if task_id in send_failed else
                   f"not started {now - (awarded_at or now):.0f}s after its award; "
                   "sent again in case its message was lost")
            if resend(settings, app, rfp, attempt, node, now, why, awarded_at or now):
                moved += 1
            continue
        reason = (f"node {node} stopped heartbeating" if dead
                  else f"node {node} did not start the task in time")
        if replace_winner(settings, app, rfp, attempt, node, state, live, reason, now,
                          due_by=None if dead else now):
            moved += 1
            history_changed(settings, app, node)  # the lost attempt counts against it
    return moved, len(alive)


#: Seconds before a sweeper tries again to send an execution whose resend failed too.
RESEND_BACKOFF = 5.0


def resend(settings: Settings, app: Celery, rfp: Announcement, attempt: int, node: str,
           now: float, why: str = "its send failed", awarded_at: float | None = None) -> bool:
    """Send again to the same winner an execution that may not have reached ``node``: its
    send failed (``award.mark_undelivered``), or it was not started by its delivery check.
    The node did nothing wrong, so it keeps the task and no failure counts against it.

    The sweeper first takes a lease (the task is due again in ``RESEND_BACKOFF`` seconds), so no
    other sweeper sends it meanwhile, then sends outside any transaction, then logs RESENT and
    sets the next look (``award.delivery_due``: a schedule-to-start deadline, or a delivery
    check that waits as long as the task has). A send that fails is logged SEND_FAILED, due
    after the backoff. A sweeper that dies after sending and before logging leaves the task
    due when the lease runs out, and it is sent again; a node holding two copies runs one
    (``execution.begin``)."""
    lease = now + RESEND_BACKOFF
    with write_session(settings.database_url) as session:
        taken = cast(CursorResult[Any], session.execute(_LEASE, {
            "b_task": rfp.task_id, "b_attempt": attempt, "b_node": node, "b_now": now,
            "b_lease": lease}))
        if taken.rowcount != 1:
            return False  # another sweeper has it, or it moved on
    try:
        send_execution(app, rfp, node, settings)
    except Exception as exc:
        mark_undelivered(settings, rfp, node, exc, retry_in=RESEND_BACKOFF, lease=lease)
        return False
    sent = time.time()
    with write_session(settings.database_url) as session:
        # Logged after the send (the node may have started it already); the schedule-to-start
        # clock starts now, unless the node took the task or another sweeper took the lease.
        waited = sent - (awarded_at if awarded_at is not None else sent)
        released = cast(CursorResult[Any], session.execute(_RELEASE, {
            "b_task": rfp.task_id, "b_attempt": attempt, "b_node": node, "b_lease": lease,
            "b_due": delivery_due(settings, rfp, sent, waited)})).rowcount == 1
        # Not if another sweeper took the task over meanwhile (this send outlasted the lease):
        # RESENT after its SEND_FAILED would make the task look delivered.
        if released or session.scalar(_STATE, {"task_id": rfp.task_id}) != lifecycle.ASSIGNED:
            journal.record(session, rfp.task_id, journal.RESENT, node=node, attempt=attempt,
                           at=sent, queue=exec_queue(node), why=why)
    logger.info("task %s: sent again to %s (%s)", rfp.task_id, exec_queue(node), why)
    return True


def replace_winner(settings: Settings, app: Celery, rfp: Announcement, attempt: int, node: str,
                   state: str, live: set[str], reason: str, now: float,
                   due_by: float | None = None) -> bool:
    """Apply the task's on_agent_offline fallback to a lost winner. ``due_by``: only if the
    task is still due by then (a winner late to start; another sweeper may have resent it)."""
    policy = rfp.fallbacks.on_agent_offline
    exclude = [*rfp.exclude_nodes, node] if node not in rfp.exclude_nodes else rfp.exclude_nodes
    moved_to: str | None = None
    conditions: dict[str, Any] = {"from_states": (state,), "expect_attempt": attempt,
                                  "expect_node": node, "due_by": due_by, "at": now}
    with write_session(settings.database_url) as session:
        if policy == "next_best":
            moved_to = _next_best(session, rfp.task_id, attempt, set(exclude), live)
        if moved_to is not None:
            nxt = rfp.model_copy(update={"exclude_nodes": exclude})
            ok = transition(
                session, rfp.task_id, lifecycle.ASSIGNED, kind=journal.REAWARDED,
                message_node=moved_to, detail={"from": node, "to": moved_to, "reason": reason},
                assigned_node=moved_to, spec=nxt.model_dump(mode="json"), awarded_at=now,
                started_at=None, due_at=delivery_due(settings, nxt, now), **conditions,
            )
            if ok:
                _lost_episode(session, rfp, attempt, node, reason, now)
                send_execution(app, nxt, moved_to, settings)
            return ok
        if policy == "fail":
            ok = transition(session, rfp.task_id, lifecycle.FAILED, kind=journal.TASK_FAILED,
                            detail={"error": reason}, error=reason, finished_at=now,
                            due_at=None, **conditions)
        else:
            nxt = rfp.model_copy(update={"attempt": attempt + 1, "exclude_nodes": exclude,
                                         "announced_at": now})
            ok = transition(
                session, rfp.task_id, lifecycle.RETRYING, kind=journal.RETRYING,
                detail={"why": reason + "; no other bidder left, new auction",
                        "next_attempt": attempt + 1, "delay_s": 0},
                attempt=attempt + 1, spec=nxt.model_dump(mode="json"), due_at=now,
                assigned_node=None, **conditions,
            )
        if ok:
            _lost_episode(session, rfp, attempt, node, reason, now)
    if ok and policy == "fail":
        # After the commit: errbacks may run here, and must not hold the write lock.
        fail_caller(app, rfp, NodeLostError(reason))
    return ok


def _next_best(session: Any, task_id: str, attempt: int, exclude: set[str],
               live: set[str]) -> str | None:
    """The best-scored eligible bid of the same auction from a live node not excluded."""
    rows = session.execute(
        select(BidRow.node, BidRow.score, BidRow.breakdown)
        .where(BidRow.task_id == task_id, BidRow.attempt == attempt,
               BidRow.will_bid.is_(True), BidRow.late.is_(False))
    ).all()
    ranked = sorted(
        (r for r in rows if r.node not in exclude and r.node in live
         and (r.breakdown or {}).get("eligible", True)),
        key=lambda r: -(r.score if r.score is not None else -1.0),
    )
    return ranked[0].node if ranked else None


def _lost_episode(session: Any, rfp: Announcement, attempt: int, node: str, reason: str,
                  now: float) -> None:
    """The lost winner failed this attempt: it counts against its experience and trust (once:
    it may have run and failed, or another sweep got there first)."""
    record_episode(session, {
        "task_id": rfp.task_id, "attempt": attempt, "node": node, "task_type": rfp.task_type,
        "skills": list(rfp.required_skills), "success": False, "duration_s": 0.0, "cost": 0.0,
        "error": reason, "finished_at": now})
