"""An attempt on the winning node: accepted, then completed, retried or failed (AITP 5-7).

Every step is a transition (a compare-and-set on the task's state, attempt and node), so a
redelivered or duplicated execution message is recognised and a task is never finished twice.
``complete`` and ``fail`` write the attempt's ledger entry and episode in the same transaction
as its state, and say what the worker must do next (a ``Verdict``). Tried again after a lost
connection whose commit had landed, each returns the verdict it stored (its messages, found by
the attempt's end time, which every try shares), never a refusal's.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import ColumnElement, Table, select, update
from sqlalchemy.orm import InstrumentedAttribute

from bidding import clock
from bidding.config import Settings
from bidding.execution.interrupted import (
    expired,
    hard_timeout,
    report_progress,
    retry_requested,
    revoked,
    unrunnable,
)
from bidding.execution.outcome import complete, fail, stored_verdict
from bidding.execution.report import exception_json
from bidding.execution.room import RoomCheck
from bidding.execution.running import Running, Start, Verdict
from bidding.lifecycle import journal, states
from bidding.lifecycle.transition import Expect, Log, Step, apply, apply_alone, transition
from bidding.models import Announcement
from bidding.store import statement_session, write_session
from bidding.store.engine import is_sqlite
from bidding.store.schema import AnnouncementRow, BidRow

logger = logging.getLogger(__name__)

__all__ = ["Running", "Start", "Starter", "Verdict", "begin", "complete", "expired", "fail",
           "hard_timeout",
           "report_progress", "retry_requested", "revoked", "stored_verdict", "unrunnable"]


def _own_bid(column: ColumnElement[Any] | InstrumentedAttribute[Any],
             label: str) -> ColumnElement[Any]:
    """``column`` of the bid with which the row's node won it (of its attempt and node), read
    with the task's row: an indexed lookup in the begin's own statement, so the award the body
    runs under costs no round trip of its own. The node's own bid, not ``winning_bid_id``: a
    task moved to the next-best bidder runs under that bidder's bid."""
    task = AnnouncementRow.__table__
    assert isinstance(task, Table)
    return (select(column)
            .where(BidRow.task_id == task.c.task_id, BidRow.attempt == task.c.attempt,
                   BidRow.node == task.c.assigned_node, BidRow.will_bid.is_(True),
                   BidRow.late.is_(False))
            .order_by(BidRow.id.desc()).limit(1)
            .correlate(task).scalar_subquery().label(label))


#: The winning bid's proposal and score, read back by every begin (last in its row).
_AWARD: tuple[ColumnElement[Any], ...] = (
    _own_bid(BidRow.payload["proposal"].as_string(), "award_proposal"),
    _own_bid(BidRow.score, "award_score"),
)


@dataclass(frozen=True)
class Starter:
    """Who starts an attempt, and when: the worker (its Celery node name) and its incarnation
    (if that incarnation ends, the attempt is known lost), and the start time to record
    (default now). A caller that tries a begin again after a lost connection passes the same
    time, so that a begin whose commit landed is recognised as its own, not as a second copy."""

    worker: str | None = None
    boot_id: str | None = None
    at: float | None = None


@dataclass(frozen=True)
class _Begin:
    """One begin, as ``begin`` prepared it."""

    settings: Settings
    task_id: str
    attempt: int
    node: str
    price_per_unit: float
    redelivered: bool
    accepted: Step
    runner: dict[str, Any]
    now: float
    room: RoomCheck | None = None


def begin(settings: Settings, task_id: str, attempt: int, node: str,
          price_per_unit: float = 0.0, redelivered: bool = True, *,
          starter: Starter = Starter(), room: RoomCheck | None = None) -> Running:
    """Move ``task_id`` to EXECUTING on ``node`` (TASK_ACCEPTED), or say why it must not run.

    A message for an attempt its node already runs is run again only if the broker
    ``redelivered`` it (its worker died with it unacknowledged); a second copy of the message
    (a resend whose first publish did arrive) is a DUPLICATE, dropped, while the first runs.
    ``room``: an attempt that needs resources starts only if this check passes first, in the
    same transaction (``execution.room``); else nothing is written and it is WAITING.
    """
    now = clock.now() if starter.at is None else starter.at
    # The worker and its incarnation: if that incarnation ends, the attempt is known lost.
    runner = ({"worker": starter.worker, "boot_id": starter.boot_id}
              if starter.worker and starter.boot_id else {})
    accepted = Step(states.EXECUTING, Log(journal.TASK_ACCEPTED),
                    values={"started_at": now, "due_at": None, **runner})
    held = Expect(attempt=attempt, node=node)
    try:
        if room is None and not is_sqlite(settings.database_url):
            # The usual case in one statement and one round trip (the UPDATE and its message);
            # a refused one (a duplicate, a redelivery, a stale attempt) is sorted out below.
            with statement_session(settings.database_url) as session:
                moved = apply_alone(session, task_id, (accepted,), held, at=now,
                                    returning=("spec", *_AWARD))
            if moved is not None and moved.row is not None:
                return Running(task_id, attempt, node, Start.FIRST,
                               Announcement.model_validate(moved.row[0]), price_per_unit,
                               began=time.monotonic(), proposal=moved.row[-2] or "",
                               score=moved.row[-1])
        return _begin_in_transaction(_Begin(settings, task_id, attempt, node, price_per_unit,
                                            redelivered, accepted, runner, now, room))
    except ValidationError as exc:
        _unreadable(settings, task_id, attempt, node, now, exc)
        raise


def _begin_in_transaction(b: _Begin) -> Running:
    """``begin`` in a transaction: SQLite's way, and every refused begin's."""
    task_id, attempt, node, now = b.task_id, b.attempt, b.node, b.now
    with write_session(b.settings.database_url) as session:
        if b.room is not None and not b.room(session):
            return Running(task_id, attempt, node, Start.WAITING, None, b.price_per_unit)
        # One UPDATE ... RETURNING spec; refused, the task's state, attempt, node and spec.
        outcome = apply(session, task_id, (b.accepted,), Expect(attempt=attempt, node=node),
                        at=now, returning=("spec", "started_at", *_AWARD))
        row = outcome.row
        if row is None:
            return Running(task_id, attempt, node, Start.UNKNOWN, None, b.price_per_unit)
        if outcome.moved:
            start = Start.FIRST
            spec = row[0]
        else:
            spec = row[3]
            ours = row[0] == states.EXECUTING and row[1] == attempt and row[2] == node
            if ours and row[4] == now:
                # This very begin, tried again: its commit landed before the connection was
                # lost (the refusal it just logged says so). It runs now, once.
                start = Start.FIRST
            elif b.redelivered and ours:
                journal.record(session, task_id, journal.TASK_ACCEPTED, node=node,
                               attempt=attempt, at=now, redelivered=True)
                if b.runner:
                    # It runs again here, perhaps on another worker of the node.
                    session.execute(update(AnnouncementRow).where(
                        AnnouncementRow.task_id == task_id, AnnouncementRow.attempt == attempt,
                        AnnouncementRow.state == states.EXECUTING).values(**b.runner))
                start = Start.REDELIVERED
            else:
                start = Start.DUPLICATE
        announcement = Announcement.model_validate(spec)  # a bad spec rolls the transition back
    return Running(task_id, attempt, node, start, announcement, b.price_per_unit,
                   began=time.monotonic(), proposal=row[-2] or "", score=row[-1])


def _unreadable(
    settings: Settings, task_id: str, attempt: int, node: str, now: float, exc: ValidationError
) -> None:
    """The attempt on ``node`` is FAILED: its stored announcement does not validate here (a
    newer announcer's, say), so it cannot run here; the caller gets the error. (A begin that
    committed in one statement cannot roll back; before that, a transaction's rollback left
    the task ASSIGNED to a node that could not run it, for the watchdogs to resend to it.)"""
    problems = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    reason = (
        f"its announcement cannot be read on node {node} "
        f"({exc.error_count()} problem(s): {'; '.join(problems[:3])})"
    )
    logger.error("task %s: %s", task_id, reason)
    with write_session(settings.database_url) as session:
        transition(
            session,
            task_id,
            states.FAILED,
            Log(journal.TASK_FAILED, detail={"error": reason}, at=now),
            Expect(states=states.IN_FLIGHT_STATES, attempt=attempt, node=node),
            error=reason,
            finished_at=now,
            result=exception_json(exc),
        )
