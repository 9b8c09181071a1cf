"""Seed 002's watch of delegated work, against the store: one pass of due checks, escalation.

Every node worker runs a pass every second or so (``observe.monitor``), as does
``bidding monitor``. A pass reads the delegated tasks (ASSIGNED or EXECUTING) whose check is due,
asks each one's node through its workers' heartbeats (alive? running that task?), lets
``watch.decide`` conclude, and writes the new checking states in one transaction, each as a
compare-and-set on the state it read (and on the task's attempt, node, award and start), so
that of several passes looking at once one does each check and the others write nothing. An
escalation is journalled (WATCH_ESCALATED) in that transaction; after it commits it is logged
and sent as ``bidding.signals.task_escalated`` (and to ``bidding_notify_url``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Final, cast

from celery import Celery
from sqlalchemy import (
    CursorResult,
    Float,
    Table,
    and_,
    bindparam,
    func,
    or_,
    select,
    update,
)

from bidding import clock
from bidding.config import Settings
from bidding.lifecycle import events, journal, parking, states
from bidding.observe.watch import (
    SILENT_BEATS,
    Action,
    CheckPolicy,
    Decision,
    NodeReport,
    WatchState,
    WorkerBeat,
    decide,
    last_news,
    policy_for,
    report,
)
from bidding.signals import notify, task_escalated
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow, Node, Worker

logger = logging.getLogger(__name__)

_TABLE: Final = cast(Table, AnnouncementRow.__table__)
_C = _TABLE.c

#: The columns a pass reads of each delegated task.
_DUE: Final = (
    select(_C.task_id, _C.attempt, _C.assigned_node, _C.worker, _C.awarded_at, _C.started_at,
           _C.progress, _C.check_attempts, _C.next_check_time, _C.check_since,
           _C.escalated_at, _C.escalation, _C.state, _C.scan_failures)
    .where(_C.state.in_(states.IN_FLIGHT_STATES), parking.UNPARKED,
           # Due; or never scheduled (a new delegation, a reset) and delegated long enough
           # that its first check may be due: a task that ends sooner is never written to.
           or_(_C.next_check_time <= bindparam("now"),
               and_(_C.next_check_time.is_(None), _C.awarded_at <= bindparam("unscheduled"))))
    .order_by(func.coalesce(_C.next_check_time, _C.awarded_at))
    .limit(bindparam("limit"))
)


def _same(column: Any, name: str) -> Any:
    # NULL-safe equality: IS on SQLite, IS NOT DISTINCT FROM on PostgreSQL.
    return column.is_not_distinct_from(bindparam(name, type_=Float()))


#: The compare-and-set of one check: the state it read, on the attempt and delegation it read.
_CLAIM: Final = (
    update(_TABLE)
    .where(_C.task_id == bindparam("t_id"), _C.attempt == bindparam("t_attempt"),
           _C.assigned_node == bindparam("t_node"), _C.state.in_(states.IN_FLIGHT_STATES),
           _same(_C.awarded_at, "t_awarded"), _same(_C.started_at, "t_started"),
           _C.check_attempts == bindparam("o_attempts"),
           _same(_C.next_check_time, "o_next"), _same(_C.check_since, "o_since"))
    .values(check_attempts=bindparam("n_attempts"), next_check_time=bindparam("n_next"),
            check_since=bindparam("n_since"), escalated_at=bindparam("n_escalated_at"),
            escalation=bindparam("n_escalation"))
)


@dataclass(frozen=True)
class Check:
    """What one pass concluded about one task, before it is claimed."""

    task_id: str
    attempt: int
    node: str
    awarded_at: float | None
    started_at: float | None
    before: WatchState
    decision: Decision
    report: NodeReport


@dataclass(frozen=True)
class Escalation:
    """A task the watch escalated."""

    task_id: str
    node: str
    attempt: int
    check_attempts: int
    reason: str


@dataclass
class Pass:
    """What a pass did."""

    #: Checks (and schedules) this pass claimed and wrote.
    written: int = 0
    escalated: list[Escalation] = field(default_factory=list)
    #: The shortest first wait of any policy (the global one, the nodes'), for the next pass.
    shortest_wait: float = 30.0
    #: Nodes heartbeating now (the monitors of that many nodes share the work).
    alive: int = 1


def plan(settings: Settings, now: float, limit: int = 500,
         tally: parking.Tally | None = None) -> tuple[list[Check], Pass]:
    """Read the due tasks and what their nodes say; decide each (nothing is written).

    A task it cannot decide is skipped, its failure kept in ``tally`` (``check_due`` counts
    it on the task, which is parked if it keeps failing: it would stay first among the due
    tasks and could hide the others)."""
    tally = tally if tally is not None else parking.Tally("watch")
    silent_after = SILENT_BEATS * settings.heartbeat_interval
    with read_session(settings.database_url) as session:
        nodes = {name: (beat, checking) for name, beat, checking in session.execute(
            select(Node.name, Node.last_heartbeat, Node.checking))}
        policies = {name: _policy(settings, name, checking)
                    for name, (_, checking) in nodes.items()}
        shortest = min([settings.initial_check_wait_time,
                        *(p.initial_check_wait_time for p in policies.values())])
        rows = session.execute(_DUE, {"now": now, "unscheduled": now - shortest,
                                      "limit": limit}).all()
        beats: list[WorkerBeat] = []
        if rows:
            beats = [WorkerBeat(h, n, b, frozenset(r or ())) for h, n, b, r in session.execute(
                select(Worker.hostname, Worker.node, Worker.last_heartbeat, Worker.running)
                .where(Worker.status != "ended"))]
    alive = sum(1 for beat, _ in nodes.values() if now - beat <= settings.heartbeat_ttl)
    result = Pass(shortest_wait=shortest, alive=max(1, alive))
    checks = []
    default = policy_for(settings)
    for row in rows:
        seen = parking.Seen(row.task_id, row.state, row.attempt, row.scan_failures)
        try:
            check = _decide(row, now, policies.get(row.assigned_node, default), beats,
                            silent_after, nodes.get(row.assigned_node, (None, None))[0])
        except Exception as exc:  # one task's data must not stop the watch of every other
            tally.failure(seen, exc)
            continue
        tally.success(seen)
        if check.decision.action is not Action.WAIT:
            checks.append(check)
    return checks, result


#: The unreadable [checking] policies this process has logged: (store, node, policy).
_unreadable: set[tuple[str, str, str]] = set()


def _policy(settings: Settings, node: str, checking: Any) -> CheckPolicy:
    """``node``'s policy from its row; the global one (logged once) when its row holds one
    this version cannot read: one node's row must not stop the watch of every task."""
    try:
        return policy_for(settings, checking)
    except (TypeError, ValueError, AttributeError) as exc:
        key = (settings.database_url, node, repr(checking))
        if key not in _unreadable:
            _unreadable.add(key)
            logger.warning("node %s: its [checking] policy cannot be read (%s: %s); its tasks "
                           "are checked on the global one", node, type(exc).__name__, exc)
        return policy_for(settings)


def _decide(row: Any, now: float, policy: CheckPolicy, beats: list[WorkerBeat],
            silent_after: float, node_beat: float | None) -> Check:
    before = WatchState(row.check_attempts, row.next_check_time, row.check_since,
                        row.escalated_at, row.escalation)
    news = last_news(row.awarded_at, row.started_at, row.progress, row.attempt)
    said = report(row.task_id, row.assigned_node, row.worker, beats, now, silent_after,
                  node_beat)
    return Check(row.task_id, row.attempt, row.assigned_node, row.awarded_at, row.started_at,
                 before, decide(now, before, policy, news, said), said)


def claim(settings: Settings, checks: list[Check], now: float) -> list[Check]:
    """Write each check's new state if the task is still as it was read (one transaction);
    returns those written. An escalation is journalled with its state."""
    written = []
    with write_session(settings.database_url) as session:
        # In one order for every monitor: two passes locking rows in crossed orders would
        # deadlock on PostgreSQL and lose a pass.
        for check in sorted(checks, key=lambda c: c.task_id):
            new = check.decision.state
            moved = cast(CursorResult[Any], session.execute(_CLAIM, {
                "t_id": check.task_id, "t_attempt": check.attempt, "t_node": check.node,
                "t_awarded": check.awarded_at, "t_started": check.started_at,
                "o_attempts": check.before.check_attempts,
                "o_next": check.before.next_check_time, "o_since": check.before.since,
                "n_attempts": new.check_attempts, "n_next": new.next_check_time,
                "n_since": new.since, "n_escalated_at": new.escalated_at,
                "n_escalation": new.escalation})).rowcount
            if moved != 1:
                continue  # another pass checked it first, or the task moved on
            written.append(check)
            if check.decision.action is Action.ESCALATE:
                journal.record(session, check.task_id, journal.WATCH_ESCALATED, node=check.node,
                               attempt=check.attempt, at=now, reason=new.escalation,
                               check_attempts=new.check_attempts,
                               liveness=check.report.liveness.value)
    return written


def check_due(settings: Settings, now: float | None = None, limit: int = 500,
              app: Celery | None = None) -> Pass:
    """One pass: check every delegated task that is due, escalate those past their last check
    (with ``app``, an escalation is also a ``task-escalated`` event, Flower's ESCALATED)."""
    now = clock.now() if now is None else now
    tally = parking.Tally("watch")
    checks, result = plan(settings, now, limit, tally)
    tally.save(settings.database_url)
    if not checks:
        return result
    for check in claim(settings, checks, now):
        result.written += 1
        if check.decision.action is Action.ESCALATE:
            escalation = Escalation(check.task_id, check.node, check.attempt,
                                    check.decision.state.check_attempts,
                                    check.decision.state.escalation or "")
            result.escalated.append(escalation)
            escalated(settings, escalation)
            if app is not None:
                events.send(app, events.ESCALATED, escalation.task_id, reason=escalation.reason,
                            node=escalation.node, attempt=escalation.attempt)
    return result


def escalated(settings: Settings, escalation: Escalation) -> None:
    """Tell a human: a log line, the ``task_escalated`` signal and the webhook."""
    logger.warning("task %s escalated: %s (attempt %d on node %s; it keeps running; "
                   "`bidding reset %s` puts it back under watch)", escalation.task_id,
                   escalation.reason, escalation.attempt, escalation.node, escalation.task_id)
    notify(settings, task_escalated, "task_escalated", task_id=escalation.task_id,
           reason=escalation.reason, watch=True, node=escalation.node,
           attempt=escalation.attempt, check_attempts=escalation.check_attempts)
