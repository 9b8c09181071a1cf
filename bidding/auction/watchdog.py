"""Watching winners: a task whose winner is lost, late to start, or never got its message.

A task whose node stopped heartbeating, or that was not started within its schedule-to-start
timeout, goes to the next-best bidder of the same auction (AITP 6.2 SELECT_NEXT_BEST), to a new
auction, or fails, as its fallbacks say (``reaward.replace_winner``). A task whose execution message
could not be sent (SEND_FAILED), or, without a schedule-to-start timeout, that its live winner
has not started by its delivery check, is sent again to the same winner (``resend``).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import (
    ColumnElement,
    CursorResult,
    Update,
    and_,
    bindparam,
    func,
    or_,
    select,
    update,
)

from bidding import clock
from bidding.auction.history import history_changed
from bidding.auction.reaward import LostWinner, replace_winner
from bidding.config import Settings
from bidding.context import Context
from bidding.execution.dispatch import delivery_due, mark_undelivered, send_execution, start_by
from bidding.lifecycle import journal, parking, states
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import Announcement
from bidding.nodes.incarnation import Ended, end_stale, live_slots
from bidding.nodes.profile import exec_queue
from bidding.nodes.registry import dead_after, query_live_nodes
from bidding.store import read_session, write_session
from bidding.store.outage import outlasting
from bidding.store.schema import AnnouncementRow, Episode, Message, Node, Worker

logger = logging.getLogger(__name__)


_ALIVE = select(Node.name).where(Node.last_heartbeat >= bindparam("cutoff"))
#: The attempt's worker incarnation is still the one heartbeating under its name.
_RUNNER_ALIVE = (
    select(Worker.hostname)
    .where(Worker.hostname == AnnouncementRow.worker, Worker.boot_id == AnnouncementRow.boot_id,
           Worker.last_heartbeat >= bindparam("cutoff"))
    .exists()
)
_LOST = (
    select(AnnouncementRow.task_id, AnnouncementRow.attempt, AnnouncementRow.assigned_node,
           AnnouncementRow.state, AnnouncementRow.spec, AnnouncementRow.awarded_at,
           AnnouncementRow.worker, AnnouncementRow.boot_id, AnnouncementRow.scan_failures)
    .where(AnnouncementRow.state.in_(sorted(states.IN_FLIGHT_STATES)), parking.UNPARKED,
           or_(AnnouncementRow.assigned_node.not_in(bindparam("alive", expanding=True)),
               and_(AnnouncementRow.state == states.ASSIGNED,
                    AnnouncementRow.due_at <= bindparam("now")),
               # running on a worker that restarted, or died while its node lives on
               and_(AnnouncementRow.state == states.EXECUTING,
                    AnnouncementRow.worker.is_not(None), ~_RUNNER_ALIVE)))
    # Oldest award first, so that every pass takes the same tasks in the same order: a task
    # it fails on is parked after a few passes (``lifecycle.parking``), and the ones behind
    # come up (with no order, the same failing tasks could fill the batch for good).
    .order_by(AnnouncementRow.awarded_at, AnnouncementRow.task_id)
    .limit(bindparam("limit"))
)
#: What says whether an ASSIGNED attempt's message was sent: the last of these in its log
#: (a refused transition or a late bid logs other kinds in between). After SEND_FAILED or
#: WORKER_LOST (a worker of the node ended, perhaps holding the message) it is sent again.
_DELIVERY_KINDS = (journal.AWARDED, journal.REAWARDED, journal.SEND_FAILED, journal.RESENT,
                   journal.WORKER_LOST)
_RESEND_AFTER = {journal.SEND_FAILED: "its send failed",
                 journal.WORKER_LOST: "a worker of its node ended, perhaps holding its message"}
_LAST_DELIVERY = (
    select(Message.kind)
    .where(Message.task_id == bindparam("task_id"), Message.attempt == bindparam("attempt"),
           Message.kind.in_(_DELIVERY_KINDS))
    .order_by(Message.id.desc())
    .limit(1)
)
_EXECUTING_ON = (
    select(func.count()).select_from(AnnouncementRow)
    .where(AnnouncementRow.assigned_node == bindparam("node"),
           AnnouncementRow.state == states.EXECUTING)
)
_LAST_FINISH = (select(func.max(Episode.finished_at))
                .where(Episode.node == bindparam("node")))
_WORKER_BOOTS = (select(Worker.hostname, Worker.boot_id)
                 .where(Worker.hostname.in_(bindparam("hosts", expanding=True))))


def _still_assigned(due: ColumnElement[bool]) -> Update:
    """An UPDATE of one task while it is ASSIGNED at an attempt to a node, and ``due`` holds."""
    return update(AnnouncementRow).where(
        AnnouncementRow.task_id == bindparam("b_task"),
        AnnouncementRow.state == states.ASSIGNED,
        AnnouncementRow.attempt == bindparam("b_attempt"),
        AnnouncementRow.assigned_node == bindparam("b_node"), due)


_STATE = select(AnnouncementRow.state).where(AnnouncementRow.task_id == bindparam("task_id"))
#: A resender's lease on an undelivered task: it is not due again while the send is under way.
_LEASE = _still_assigned(AnnouncementRow.due_at <= bindparam("b_now")).values(
    due_at=bindparam("b_lease"))
#: After the send: the schedule-to-start clock, unless the node or another sweeper moved on.
_RELEASE = _still_assigned(AnnouncementRow.due_at == bindparam("b_lease")).values(
    due_at=bindparam("b_due"))
#: A winner busy with as many attempts as it has pool processes: its start clock starts again.
_REARM = _still_assigned(AnnouncementRow.due_at <= bindparam("b_now")).values(
    due_at=bindparam("b_due"))


@dataclass(frozen=True)
class _Seen:
    """What one watchdog pass read: who is alive, and why each due ASSIGNED task is due."""

    alive: set[str]
    live: set[str]
    #: task id -> the kind of its last delivery message (ASSIGNED tasks of live nodes).
    delivery: dict[str, str | None]
    #: worker name -> its current boot id (workers of EXECUTING attempts found lost).
    boots: dict[str, str]
    now: float


def check_winners(ctx: Context, now: float | None = None,
                  limit: int = 100) -> tuple[int, int]:
    """Re-place tasks whose winner is lost (its node dead, its worker restarted or dead) or
    late to start, and send again those whose message may not have reached their winner.

    Returns how many were moved, and how many nodes are alive.
    """
    now = clock.now() if now is None else now
    cutoff = dead_after(ctx.settings, now)
    for ended in end_stale(ctx.settings, cutoff):
        try:
            incarnation_ended(ctx.settings, ended, now)
        except Exception:
            logger.exception("watchdog: handling the end of worker %s failed", ended.hostname)
    with read_session(ctx.settings.database_url) as session:
        alive = set(session.scalars(_ALIVE, {"cutoff": cutoff}))
        rows = session.execute(
            _LOST, {"alive": sorted(alive), "now": now, "limit": limit, "cutoff": cutoff}).all()
        delivery = {row.task_id: session.scalar(_LAST_DELIVERY, {"task_id": row.task_id,
                                                                 "attempt": row.attempt})
                    for row in rows
                    if row.assigned_node in alive and row.state == states.ASSIGNED}
        hosts = sorted({row.worker for row in rows if row.worker is not None})
        boots = dict(session.execute(_WORKER_BOOTS, {"hosts": hosts}).tuples().all()) \
            if hosts else {}
    if not rows:
        return 0, len(alive)
    seen = _Seen(alive, {n.name for n in query_live_nodes(ctx.settings, now)}, delivery, boots,
                 now)
    moved = 0
    tally = parking.Tally("watchdog")
    for row in rows:
        # One task at a time: a failure (a spec that does not load, the store or the broker
        # failing midway) must not stop the others of this sweep. It is counted on the task
        # (parked if it keeps failing) and logged once, not a traceback every pass.
        scanned = parking.Seen(row.task_id, row.state, row.attempt, row.scan_failures)
        try:
            moved += _check_winner(ctx, row, seen)
        except Exception as exc:
            tally.failure(scanned, exc)
        else:
            tally.success(scanned)
    tally.save(ctx.settings.database_url)
    return moved, len(alive)


def _check_winner(ctx: Context, row: Any, seen: _Seen) -> int:
    """Re-place or resend one task found lost, late or undelivered; 1 when it moved."""
    task_id, attempt, node, state, spec, awarded_at, worker, boot = row[:8]
    now = seen.now
    announcement = Announcement.model_validate(spec)
    dead = node not in seen.alive
    if not dead and state == states.ASSIGNED:
        last = seen.delivery.get(task_id)
        limit = start_by(ctx.settings, announcement, now)
        if last in _RESEND_AFTER or limit is None:
            # The node is not to blame: send it again. Without a start deadline the task was
            # due for a delivery check: its message may have been lost (the process that
            # awarded it died before sending); a second copy is dropped by the node.
            why = _RESEND_AFTER.get(last or "") or (
                f"not started {now - (awarded_at or now):.0f}s after its award; "
                "sent again in case its message was lost")
            return int(resend(ctx, Winner(announcement, attempt, node), now, why,
                              awarded_at or now))
        clock = _start_clock(ctx.settings, node, now)
        wait = limit - now  # the schedule-to-start timeout
        if clock is not None and clock + wait > now:
            # Every pool process of the winner ran another attempt until ``clock``: the task
            # waited in its queue through no fault of the node. Its time to start is measured
            # from when the node could have started it.
            with write_session(ctx.settings.database_url) as session:
                session.execute(_REARM, {"b_task": task_id, "b_attempt": attempt,
                                         "b_node": node, "b_now": now,
                                         "b_due": clock + wait})
            return 0
    if dead:
        reason = f"node {node} stopped heartbeating"
    elif state == states.EXECUTING and worker is not None:
        reason = (f"worker {worker} of node {node} restarted: the attempt it was running is "
                  "lost" if seen.boots.get(worker, boot) != boot else
                  f"worker {worker} of node {node} stopped heartbeating")
    else:
        reason = f"node {node} did not start the task in time"
    lost = LostWinner(announcement, attempt, node, state, reason,
                      due_by=now if state == states.ASSIGNED and not dead else None)
    if not replace_winner(ctx, lost, seen.live, now):
        return 0
    history_changed(ctx, node)  # the lost attempt counts against it
    return 1


def _start_clock(settings: Settings, node: str, now: float) -> float | None:
    """Since when ``node`` could have started a task waiting in its queue: ``now`` while every
    pool process of its live workers runs an attempt (its declared capacity stands in where a
    worker did not report its pool), else when its latest attempt ended (a process freed),
    None if it never ran one."""
    with read_session(settings.database_url) as session:
        running = int(session.scalar(_EXECUTING_ON, {"node": node}) or 0)
        slots = live_slots(session, [node], dead_after(settings, now)).get(node)
        if slots is None:
            slots = session.scalar(select(Node.capacity).where(Node.name == node)) or 1
        if running >= slots:
            return now
        freed = session.scalar(_LAST_FINISH, {"node": node})
    return float(freed) if freed is not None else None


#: Seconds before the end of a worker's last heartbeat in which the attempts it finished are
#: checked against the result backend (it may have died between the store and the backend).
FINISHED_BEFORE_END = 60.0


#: Seconds ``incarnation_ended`` outlasts a dropped store connection by default (the
#: watchdog's sweep phase waits that long at most; a restarted worker's own thread longer).
ENDED_PATIENCE = 30.0


def incarnation_ended(settings: Settings, ended: Ended, now: float | None = None,
                      patience: float = ENDED_PATIENCE) -> None:
    """A worker's incarnation ended (a new one took its name, or it stopped heartbeating).

    Its running attempts are lost: ``check_winners`` finds them (their boot id is not their
    worker's any more, or their worker is silent) and re-places them. Here: the ASSIGNED
    attempts of its node awarded before it ended are sent again to the node (the dead
    incarnation may hold their messages, unacknowledged, until the broker's visibility
    timeout; the node runs one copy), and the attempts it finished in its last minute have
    their final state written to the result backend again if it is missing there (it may have
    died between the store and the backend).

    Its caller has claimed the end already (the worker's row is ended, or a new incarnation
    took it), so no later pass handles it again: a dropped store connection is outlasted for
    ``patience`` seconds (a chaos soak lost one caller's result when a restarted worker's
    handling met a sever mid-transaction). Its writes are compare-and-sets, safe to repeat.
    """
    now = clock.now() if now is None else now
    logger.warning("worker %s of node %s %s; its running attempts are lost", ended.hostname,
                   ended.node, ended.why)
    outlasting(settings.database_url, f"handling the end of worker {ended.hostname}",
               functools.partial(_hand_on, settings, ended, now), patience=patience)


def _hand_on(settings: Settings, ended: Ended, now: float) -> None:
    """``incarnation_ended``'s writes, in one transaction."""
    with write_session(settings.database_url) as session:
        assigned = session.execute(
            select(AnnouncementRow.task_id, AnnouncementRow.attempt)
            .where(AnnouncementRow.assigned_node == ended.node,
                   AnnouncementRow.state == states.ASSIGNED,
                   AnnouncementRow.awarded_at <= now)).all()
        for task_id, attempt in assigned:
            transition(session, task_id, states.ASSIGNED,
                       Log(journal.WORKER_LOST, at=now,
                           detail={"worker": ended.hostname, "why": ended.why}),
                       Expect(states=(states.ASSIGNED,), attempt=attempt, node=ended.node),
                       due_at=now)
        session.execute(
            update(AnnouncementRow)
            .where(AnnouncementRow.worker == ended.hostname,
                   AnnouncementRow.boot_id == ended.boot_id,
                   AnnouncementRow.state.in_(sorted(states.FINAL_STATES)),
                   AnnouncementRow.finished_at >= ended.last_heartbeat - FINISHED_BEFORE_END,
                   AnnouncementRow.report_due.is_(None))
            .values(report_due=now))


#: Seconds before a sweeper tries again to send an execution whose resend failed too.
RESEND_BACKOFF = 5.0


@dataclass(frozen=True)
class Winner:
    """The node an attempt of a task was awarded to."""

    announcement: Announcement
    attempt: int
    node: str


def resend(ctx: Context, winner: Winner, now: float,
           why: str = "its send failed", awarded_at: float | None = None) -> bool:
    """Send again to the same ``winner`` an execution that may not have reached it: its
    send failed (``award.mark_undelivered``), or it was not started by its delivery check.
    The node did nothing wrong, so it keeps the task and no failure counts against it.

    The sweeper first takes a lease (the task is due again in ``RESEND_BACKOFF`` seconds), so no
    other sweeper sends it meanwhile, then sends outside any transaction, then logs RESENT and
    sets the next look (``award.delivery_due``: a schedule-to-start deadline, or a delivery
    check that waits as long as the task has). A send that fails is logged SEND_FAILED, due
    after the backoff. A sweeper that dies after sending and before logging leaves the task
    due when the lease runs out, and it is sent again; a node holding two copies runs one
    (``execution.begin``)."""
    announcement, attempt, node = winner.announcement, winner.attempt, winner.node
    lease = now + RESEND_BACKOFF
    with write_session(ctx.settings.database_url) as session:
        taken = cast(CursorResult[Any], session.execute(_LEASE, {
            "b_task": announcement.task_id, "b_attempt": attempt, "b_node": node, "b_now": now,
            "b_lease": lease}))
        if taken.rowcount != 1:
            return False  # another sweeper has it, or it moved on
    try:
        send_execution(ctx.app, announcement, node, ctx.settings)
    except Exception as exc:
        mark_undelivered(
            ctx.settings, announcement, node, exc, retry_in=RESEND_BACKOFF, lease=lease
        )
        return False
    sent = clock.now()
    with write_session(ctx.settings.database_url) as session:
        # Logged after the send (the node may have started it already); the schedule-to-start
        # clock starts now, unless the node took the task or another sweeper took the lease.
        waited = sent - (awarded_at if awarded_at is not None else sent)
        released = (
            cast(
                CursorResult[Any],
                session.execute(
                    _RELEASE,
                    {
                        "b_task": announcement.task_id,
                        "b_attempt": attempt,
                        "b_node": node,
                        "b_lease": lease,
                        "b_due": delivery_due(ctx.settings, announcement, sent, waited),
                    },
                ),
            ).rowcount
            == 1
        )
        # Not if another sweeper took the task over meanwhile (this send outlasted the lease):
        # RESENT after its SEND_FAILED would make the task look delivered.
        if (
            released
            or session.scalar(_STATE, {"task_id": announcement.task_id}) != states.ASSIGNED
        ):
            journal.record(
                session,
                announcement.task_id,
                journal.RESENT,
                node=node,
                attempt=attempt,
                at=sent,
                queue=exec_queue(node),
                why=why,
            )
    logger.info("task %s: sent again to %s (%s)", announcement.task_id, exec_queue(node), why)
    return True
