"""An attempt on the winning node: accepted, then completed, retried or failed (AITP 5-7).

Every step is a transition (a compare-and-set on the task's state, attempt and node), so a
redelivered or duplicated execution message is recognised and a task is never finished twice.
``complete`` and ``fail`` write the attempt's ledger entry and episode in the same transaction
as its state, and say what the worker must do next (a ``Verdict``). Tried again after a lost
connection whose commit had landed, each returns the verdict it stored (its messages, found by
the attempt's end time, which every try shares), never a refusal's.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import jsonschema
from celery.exceptions import SoftTimeLimitExceeded
from pydantic import ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from bidding import clock
from bidding.config import Settings
from bidding.errors import CostExceededError, OutputValidationError
from bidding.execution import ledger
from bidding.execution.episodes import record_attempt
from bidding.execution.report import exception_json, value_json
from bidding.execution.retry import RetryPlan, error_text, plan_retry, retry_exclusions
from bidding.lifecycle import journal, states
from bidding.lifecycle.transition import Step, apply, apply_alone, transition
from bidding.models import BUDGET_EPSILON, Announcement, non_json_number
from bidding.store import read_session, statement_session, write_session
from bidding.store.engine import is_sqlite
from bidding.store.schema import Announcement as AnnouncementRow
from bidding.store.schema import Message

logger = logging.getLogger(__name__)


class Start(Enum):
    """What ``begin`` found."""

    #: First delivery: the task was ASSIGNED to this node and is now EXECUTING.
    FIRST = "first"
    #: Already EXECUTING on this node (its pool process died with the message unacked): run again.
    REDELIVERED = "redelivered"
    #: Finished, or awarded elsewhere since: do not run it.
    DUPLICATE = "duplicate"
    #: The store has no such announcement (a leftover message, or a store mismatch): the task
    #: drops it without running the body.
    UNKNOWN = "unknown"


@dataclass
class Running:
    """An attempt in progress on this node."""

    task_id: str
    attempt: int
    node: str
    start: Start
    rfp: Announcement | None
    #: This node's price per unit (AITP 7.1: the node charges its own price).
    price_per_unit: float = 0.0
    #: Units the body reported with ``self.report_units``; default: the announced units.
    units: float | None = None
    began: float = 0.0
    #: When the attempt ended: taken by the first try of ``complete`` or ``fail`` and kept by
    #: every later one (``store.outage`` tries again after a lost connection), so that a try
    #: whose first commit landed finds its own messages, as ``begin`` finds its start time.
    ended: float | None = None


@dataclass
class Verdict:
    """What the worker does after an attempt: nothing, retry after a delay, or raise an error."""

    retry_in: float | None = None
    error: BaseException | None = None


def begin(settings: Settings, task_id: str, attempt: int, node: str,
          price_per_unit: float = 0.0, redelivered: bool = True, *,
          worker: str | None = None, boot_id: str | None = None,
          now: float | None = None) -> Running:
    """Move ``task_id`` to EXECUTING on ``node`` (TASK_ACCEPTED), or say why it must not run.

    A message for an attempt its node already runs is run again only if the broker
    ``redelivered`` it (its worker died with it unacknowledged); a second copy of the message
    (a resend whose first publish did arrive) is a DUPLICATE, dropped, while the first runs.
    ``now``: the start time to record; a caller that tries again after a lost connection
    passes the same one, so that a begin whose commit landed before the connection was lost
    is recognised as its own (FIRST), not taken for a second copy.
    """
    now = clock.now() if now is None else now
    # The worker and its incarnation: if that incarnation ends, the attempt is known lost.
    runner = {"worker": worker, "boot_id": boot_id} if worker and boot_id else {}
    accepted = Step(states.EXECUTING, journal.TASK_ACCEPTED,
                    values={"started_at": now, "due_at": None, **runner})
    try:
        if not is_sqlite(settings.database_url):
            # The usual case in one statement and one round trip (the UPDATE and its message);
            # a refused one (a duplicate, a redelivery, a stale attempt) is sorted out below.
            with statement_session(settings.database_url) as session:
                moved = apply_alone(session, task_id, (accepted,), expect_attempt=attempt,
                                    expect_node=node, at=now, returning=("spec",))
            if moved is not None and moved.row is not None:
                return Running(task_id, attempt, node, Start.FIRST,
                               Announcement.model_validate(moved.row[0]), price_per_unit,
                               began=time.monotonic())
        return _begin_in_transaction(settings, task_id, attempt, node, price_per_unit,
                                     redelivered, accepted, runner, now)
    except ValidationError as exc:
        _unreadable(settings, task_id, attempt, node, now, exc)
        raise


def _begin_in_transaction(settings: Settings, task_id: str, attempt: int, node: str,
                          price_per_unit: float, redelivered: bool, accepted: Step,
                          runner: dict[str, Any], now: float) -> Running:
    """``begin`` in a transaction: SQLite's way, and every refused begin's."""
    with write_session(settings.database_url) as session:
        # One UPDATE ... RETURNING spec; refused, the task's state, attempt, node and spec.
        outcome = apply(session, task_id, (accepted,), expect_attempt=attempt,
                        expect_node=node, at=now, returning=("spec", "started_at"))
        row = outcome.row
        if row is None:
            return Running(task_id, attempt, node, Start.UNKNOWN, None, price_per_unit)
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
            elif redelivered and ours:
                journal.record(session, task_id, journal.TASK_ACCEPTED, node=node,
                               attempt=attempt, at=now, redelivered=True)
                if runner:
                    # It runs again here, perhaps on another worker of the node.
                    session.execute(update(AnnouncementRow).where(
                        AnnouncementRow.task_id == task_id, AnnouncementRow.attempt == attempt,
                        AnnouncementRow.state == states.EXECUTING).values(**runner))
                start = Start.REDELIVERED
            else:
                start = Start.DUPLICATE
        rfp = Announcement.model_validate(spec)  # a bad spec rolls the transition back
    return Running(task_id, attempt, node, start, rfp, price_per_unit, began=time.monotonic())


def _unreadable(settings: Settings, task_id: str, attempt: int, node: str, now: float,
                exc: ValidationError) -> None:
    """The attempt on ``node`` is FAILED: its stored announcement does not validate here (a
    newer announcer's, say), so it cannot run here; the caller gets the error. (A begin that
    committed in one statement cannot roll back; before that, a transaction's rollback left
    the task ASSIGNED to a node that could not run it, for the watchdogs to resend to it.)"""
    problems = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
    reason = (f"its announcement cannot be read on node {node} "
              f"({exc.error_count()} problem(s): {'; '.join(problems[:3])})")
    logger.error("task %s: %s", task_id, reason)
    with write_session(settings.database_url) as session:
        transition(session, task_id, states.FAILED, kind=journal.TASK_FAILED,
                   from_states=states.IN_FLIGHT_STATES, expect_attempt=attempt, expect_node=node,
                   at=now, detail={"error": reason}, error=reason, finished_at=now,
                   result=exception_json(exc))


def _charge_and_record(session: Session, run: Running, *, success: bool, now: float,
                       error: str | None) -> float:
    """Write this attempt's ledger entry and its outcome (each once: a redelivered attempt
    keeps the first); returns its cost."""
    assert run.rfp is not None
    units = run.rfp.units if run.units is None else run.units
    charge = ledger.entry(task_id=run.task_id, attempt=run.attempt, node=run.node,
                          units=units, price_per_unit=run.price_per_unit, at=now)
    record_attempt(session, charge, _outcome(run, success=success, now=now,
                                             cost=charge["total"], error=error))
    return float(charge["total"])


def _outcome(run: Running, *, success: bool, now: float, cost: float,
             error: str | None) -> dict[str, Any]:
    """The attempt's episode row."""
    assert run.rfp is not None
    return {"task_id": run.task_id, "attempt": run.attempt, "node": run.node,
            "task_type": run.rfp.task_type, "skills": list(run.rfp.required_skills),
            "success": success, "duration_s": time.monotonic() - run.began, "cost": cost,
            "error": error, "finished_at": now}


def _episode(session: Session, run: Running, *, success: bool, now: float,
             cost: float, error: str | None) -> None:
    """Record the attempt's outcome (once: a redelivered attempt keeps the first)."""
    record_attempt(session, None, _outcome(run, success=success, now=now, cost=cost,
                                           error=error))


def complete(settings: Settings, run: Running, result: Any) -> Verdict:
    """The body returned: COMPLETED, then SUCCESS, or FAILED when the budget or schema says so.

    The two transitions are one UPDATE (``transition.apply``), logged as two messages. Tried
    again on the same ``run`` after its commit landed, it returns the verdict stored then.
    """
    if run.rfp is None:
        return Verdict()
    now, again = _end_time(run)
    if again and (landed := _landed(settings, run, now)) is not None:
        return landed
    rfp = run.rfp
    budget = rfp.budget
    invalid = _schema_error(rfp.output_schema, result)  # pure: outside the write lock
    if invalid is None and not _is_json(result):
        # Celery could not send it either (JSON only): fail it here, saying why, rather than
        # store a success the caller never gets.
        invalid = (f"result is not JSON serializable ({type(result).__name__}); "
                   "celery-bidding sends JSON only")
    if invalid is None:
        # Python's json writes NaN anyway; the store (PostgreSQL refuses it) and every
        # reader after Celery's own (null elsewhere) would not agree on the value.
        invalid = non_json_number(result, "result")
    over: tuple[float, float] | None = None
    with write_session(settings.database_url) as session:
        cost = _charge_and_record(session, run, success=invalid is None, now=now,
                                  error=invalid)
        # The ledger's sum matters only against a budget (the entry itself is always written).
        spent = ledger.spent(session, run.task_id) if budget is not None else 0.0
        done = Step(states.COMPLETED, journal.TASK_COMPLETED, detail={"cost": cost},
                    values={"finished_at": now})
        if budget is not None and spent > budget + BUDGET_EPSILON:
            reason = f"spent {spent:.4f} of budget {budget:.4f}"
            over = (budget, spent)
            error: BaseException = CostExceededError(f"task {run.task_id}: {reason}")
            verdict = Verdict(error=error)
            then = Step(states.FAILED, journal.COST_EXCEEDED, run.node,
                        {"budget": budget, "spent": spent},
                        {"error": reason, "result": exception_json(error)})
        elif invalid is not None:
            error = OutputValidationError(invalid)
            verdict = Verdict(error=error)
            then = Step(states.FAILED, journal.OUTPUT_INVALID, run.node, {"error": invalid},
                        {"error": invalid, "result": exception_json(error)})
        else:
            # The result is kept with the task: the store is what the caller's result is
            # written from again if the backend's first write fails (execution.report).
            then = Step(states.SUCCESS, journal.TASK_SUCCEEDED, run.node,
                        values={"result": value_json(result)})
            verdict = Verdict()
        if not apply(session, run.task_id, (done, then), expect_attempt=run.attempt,
                     expect_node=run.node, at=now).moved:
            return Verdict()
    if over is not None:
        _notify_cost(settings, run, *over)
    return verdict


#: The messages that end an attempt on its node, the last one of its end saying its verdict
#: (``fail`` logs TASK_FAILED, then RETRYING when it retries; ``complete`` TASK_COMPLETED,
#: then one of the others).
_ENDINGS: tuple[str, ...] = (journal.TASK_SUCCEEDED, journal.OUTPUT_INVALID,
                             journal.COST_EXCEEDED, journal.TASK_FAILED, journal.RETRYING)


def _end_time(run: Running) -> tuple[float, bool]:
    """The attempt's end time, and whether an earlier try of ``complete`` or ``fail`` took it
    (this try follows a lost connection, whose commit may have landed)."""
    if run.ended is not None:
        return run.ended, True
    run.ended = clock.now()
    return run.ended, False


def _landed(settings: Settings, run: Running, now: float) -> Verdict | None:
    """The verdict this attempt's end stored at ``now``, if its commit landed (its messages,
    logged by this node at that time, say so); None when it did not."""
    with read_session(settings.database_url) as session:
        found = session.execute(
            select(Message.kind, Message.detail)
            .where(Message.task_id == run.task_id, Message.node == run.node,
                   Message.at == now, Message.kind.in_(_ENDINGS))
            .order_by(Message.id.desc()).limit(1)).first()
        if found is None:
            return None
        verdict = stored_verdict(run.task_id, found.kind, found.detail)
        spent = (ledger.spent(session, run.task_id)
                 if found.kind == journal.COST_EXCEEDED else 0.0)
    logger.info("task %s: its outcome was stored before the connection was lost (%s)",
                run.task_id, found.kind)
    if found.kind == journal.COST_EXCEEDED and run.rfp is not None:
        # The first try lost its connection at the commit, before it could notify.
        _notify_cost(settings, run, run.rfp.budget or 0.0, spent)
    return verdict


def stored_verdict(task_id: str, kind: str, detail: Mapping[str, Any]) -> Verdict:
    """The verdict an attempt's end returned, from its last message (``kind``, ``detail``): a
    retry after the delay it logged (to the millisecond), the error of a failed output or an
    overrun, or nothing (a success, or a failure whose own exception the worker raises)."""
    if kind == journal.RETRYING:
        return Verdict(retry_in=float(detail["delay_s"]))
    if kind == journal.OUTPUT_INVALID:
        return Verdict(error=OutputValidationError(str(detail["error"])))
    if kind == journal.COST_EXCEEDED:
        # ``fail`` logs why; ``complete`` the budget and what was spent.
        why = detail.get("why") or (f"spent {float(detail['spent']):.4f} of budget "
                                    f"{float(detail['budget']):.4f}")
        return Verdict(error=CostExceededError(f"task {task_id}: {why}"))
    return Verdict()


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _schema_error(schema: dict[str, Any] | None, result: Any) -> str | None:
    if not schema:
        return None
    try:
        jsonschema.validate(result, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return f"output does not match the task's output schema at {where}: {exc.message}"
    return None


def fail(settings: Settings, run: Running, exc: BaseException,
         rng: random.Random | None = None) -> Verdict:
    """The body raised: retry (a new auction after the backoff), extend the timeout, or FAILED.

    Tried again on the same ``run`` after its commit landed, it returns the verdict stored then
    (a retry stays a retry, though the task may be in its next auction by now).
    """
    if run.rfp is None:
        return Verdict()
    now, again = _end_time(run)
    if again and (landed := _landed(settings, run, now)) is not None:
        return landed
    rfp = run.rfp
    error = error_text(exc)
    over: tuple[float, float] | None = None
    with write_session(settings.database_url) as session:
        _charge_and_record(session, run, success=False, now=now, error=error)
        plan = plan_retry(rfp, run.node, exc, now, rng,
                          timed_out=isinstance(exc, SoftTimeLimitExceeded))
        # The sum of the ledger matters against a budget and for the next attempt's spec.
        spent = (ledger.spent(session, run.task_id)
                 if rfp.budget is not None or plan.next is not None else 0.0)
        if rfp.budget is not None and spent > rfp.budget + BUDGET_EPSILON:
            over = (rfp.budget, spent)
            plan = RetryPlan(None, None, f"spent {spent:.4f} of budget {rfp.budget:.4f}")
        if plan.next is not None and plan.delay is not None:
            journal.record(session, run.task_id, journal.TASK_FAILED, node=run.node,
                           attempt=run.attempt, at=now, error=error, will_retry=True)
            nxt = plan.next.model_copy(update={"spent": spent})
            moved = _to_retrying(session, run, nxt, now, plan.delay, plan.why, error=error)
            return Verdict(retry_in=plan.delay) if moved else Verdict()
        kind = journal.COST_EXCEEDED if over else journal.TASK_FAILED
        final = CostExceededError(f"task {run.task_id}: {plan.why}") if over else exc
        transition(session, run.task_id, states.FAILED, kind=kind,
                   expect_attempt=run.attempt, expect_node=run.node, at=now,
                   detail={"error": error, "why": plan.why},
                   error=f"{error} ({plan.why})" if plan.why else error, finished_at=now,
                   result=exception_json(final))
    if over is not None:
        _notify_cost(settings, run, *over)
        return Verdict(error=CostExceededError(f"task {run.task_id}: {plan.why}"))
    return Verdict()


def revoked(settings: Settings, task_id: str, attempt: int, node: str, reason: str,
            now: float | None = None) -> bool:
    """Celery revoked the task on ``node`` (its message dropped, or its process terminated):
    FAILED with ``reason``. Nothing is charged and no episode counts against the node: the
    caller stopped it. Celery has stored REVOKED for the caller already. False when this
    attempt no longer holds the task (re-awarded, finished)."""
    now = clock.now() if now is None else now
    with write_session(settings.database_url) as session:
        return transition(session, task_id, states.FAILED, kind=journal.TASK_FAILED,
                          from_states=states.IN_FLIGHT_STATES, expect_attempt=attempt,
                          expect_node=node, at=now, detail={"error": reason, "revoked": True},
                          error=reason, finished_at=now, due_at=None)


def unrunnable(settings: Settings, task_id: str, attempt: int, node: str, reason: str,
               exc: BaseException, now: float | None = None) -> Announcement | None:
    """``node``'s worker cannot run the task at all (no task of that name in its app): the
    task is FAILED with ``reason`` (sending it again would only repeat it) and counts against
    the node, which bid on work it cannot do. Returns the task's announcement, for telling
    its caller; None when this attempt no longer holds the task."""
    now = clock.now() if now is None else now
    with write_session(settings.database_url) as session:
        row = session.get(AnnouncementRow, task_id)
        if row is None or row.attempt != attempt or row.assigned_node != node:
            return None
        rfp = Announcement.model_validate(row.spec)
        run = Running(task_id, attempt, node, Start.FIRST, rfp, began=time.monotonic())
        failed = transition(session, task_id, states.FAILED, kind=journal.TASK_FAILED,
                            from_states=states.IN_FLIGHT_STATES, expect_attempt=attempt,
                            expect_node=node, at=now, detail={"error": reason},
                            error=reason, finished_at=now, due_at=None,
                            result=exception_json(exc))
        if failed:
            _episode(session, run, success=False, now=now, cost=0.0, error=reason)
    return rfp if failed else None


def hard_timeout(settings: Settings, task_id: str, error: str) -> str | None:
    """The pool process was killed at the hard time limit: the attempt is FAILED.

    Called in the worker's main process (Celery reports hard timeouts there). Celery has already
    stored the failure for the caller, so this is final: no retry is planned, and the store
    agrees with what ``.get()`` saw. Returns the node whose attempt failed, or None when there
    was nothing to fail.
    """
    now = clock.now()
    with write_session(settings.database_url) as session:
        row = session.get(AnnouncementRow, task_id)
        if row is None or row.state != states.EXECUTING or row.assigned_node is None:
            return None
        node = row.assigned_node
        rfp = Announcement.model_validate(row.spec)
        run = Running(task_id, row.attempt, node, Start.FIRST, rfp,
                      began=time.monotonic() - (now - (row.started_at or now)))
        _episode(session, run, success=False, now=now, cost=0.0, error=error)
        failed = transition(session, task_id, states.FAILED, kind=journal.TASK_FAILED,
                            expect_attempt=row.attempt, expect_node=node, at=now,
                            detail={"error": error, "why": "hard time limit"}, error=error,
                            finished_at=now)
    return node if failed else None


def _notify_cost(settings: Settings, run: Running, budget: float, spent: float) -> None:
    from bidding.signals import cost_exceeded, notify

    notify(settings, cost_exceeded, "cost_exceeded", task_id=run.task_id, budget=budget,
           spent=spent, node=run.node, attempt=run.attempt)


def retry_requested(settings: Settings, run: Running, delay: float,
                    args: Sequence[Any] | None = None,
                    kwargs: Mapping[str, Any] | None = None) -> bool:
    """The body called ``self.retry(countdown=...)``: a new auction after ``delay`` seconds,
    with the ``args``/``kwargs`` it gave (Celery passes the request's own otherwise)."""
    if run.rfp is None:
        return False
    now = clock.now()
    rfp = run.rfp
    update: dict[str, Any] = {"attempt": rfp.attempt + 1, "failures": rfp.failures + 1,
                              "silent_rounds": 0,
                              "exclude_nodes": retry_exclusions(rfp, run.node),
                              "announced_at": now}
    if args is not None:
        update["args"] = list(args)
    if kwargs is not None:
        update["kwargs"] = dict(kwargs)
    nxt = rfp.model_copy(update=update)
    with write_session(settings.database_url) as session:
        return _to_retrying(session, run, nxt, now, delay, "the task called self.retry()")


def _to_retrying(session: Session, run: Running, nxt: Announcement, now: float, delay: float,
                 why: str, error: str | None = None) -> bool:
    """EXECUTING -> RETRYING: the next attempt's spec, announced again at ``now + delay``."""
    detail: dict[str, Any] = {"delay_s": round(delay, 3), "why": why,
                              "next_attempt": nxt.attempt}
    if error is not None:
        detail["error"] = error
    return transition(
        session, run.task_id, states.RETRYING, kind=journal.RETRYING,
        expect_attempt=run.attempt, expect_node=run.node, at=now, detail=detail,
        attempt=nxt.attempt, spec=nxt.model_dump(mode="json"), due_at=now + delay,
        assigned_node=None, error=error,
    )


def report_progress(settings: Settings, run: Running, current: float, total: float,
                    note: str) -> dict[str, Any]:
    """Record a PROGRESS_UPDATE (AITP 5.3) and return the progress as stored."""
    percent = round(100.0 * current / total, 1) if total else None
    progress = {"current": current, "total": total, "percent": percent, "note": note,
                "node": run.node, "attempt": run.attempt, "at": clock.now()}
    with write_session(settings.database_url) as session:
        session.execute(
            update(AnnouncementRow)
            .where(AnnouncementRow.task_id == run.task_id,
                   AnnouncementRow.attempt == run.attempt,
                   AnnouncementRow.state == states.EXECUTING)
            .values(progress=progress)
        )
        journal.record(session, run.task_id, journal.PROGRESS_UPDATE, node=run.node,
                       attempt=run.attempt, current=current, total=total, percent=percent,
                       note=note)
    return progress


