"""An attempt on the winning node: accepted, then completed, retried or failed (AITP 5-7).

Every step is a transition (a compare-and-set on the task's state, attempt and node), so a
redelivered or duplicated execution message is recognised and a task is never finished twice.
``complete`` and ``fail`` write the attempt's ledger entry and episode in the same transaction
as its state, and say what the worker must do next (a ``Verdict``).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final, cast

import jsonschema
from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import (
    Executable,
    Integer,
    Table,
    bindparam,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from bidding import journal, lifecycle
from bidding.award import BUDGET_EPSILON
from bidding.config import Settings
from bidding.errors import CostExceededError, OutputValidationError
from bidding.models import Announcement
from bidding.retry import compute_delay, is_retryable
from bidding.store import read_session, write_session
from bidding.store.schema import Announcement as AnnouncementRow
from bidding.store.schema import Episode, LedgerEntry, Node
from bidding.transition import Step, apply, transition

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


@dataclass
class Verdict:
    """What the worker does after an attempt: nothing, retry after a delay, or raise an error."""

    retry_in: float | None = None
    error: BaseException | None = None


def begin(settings: Settings, task_id: str, attempt: int, node: str,
          price_per_unit: float = 0.0, redelivered: bool = True) -> Running:
    """Move ``task_id`` to EXECUTING on ``node`` (TASK_ACCEPTED), or say why it must not run.

    A message for an attempt its node already runs is run again only if the broker
    ``redelivered`` it (its worker died with it unacknowledged); a second copy of the message
    (a resend whose first publish did arrive) is a DUPLICATE, dropped, while the first runs.
    """
    now = time.time()
    with write_session(settings.database_url) as session:
        # One UPDATE ... RETURNING spec; refused, the task's state, attempt, node and spec.
        outcome = apply(session, task_id,
                        (Step(lifecycle.EXECUTING, journal.TASK_ACCEPTED,
                              values={"started_at": now, "due_at": None}),),
                        expect_attempt=attempt, expect_node=node, at=now, returning=("spec",))
        row = outcome.row
        if row is None:
            return Running(task_id, attempt, node, Start.UNKNOWN, None, price_per_unit)
        if outcome.moved:
            start = Start.FIRST
            spec = row[0]
        else:
            spec = row[3]
            if (redelivered and row[0] == lifecycle.EXECUTING and row[1] == attempt
                    and row[2] == node):
                journal.record(session, task_id, journal.TASK_ACCEPTED, node=node,
                               attempt=attempt, at=now, redelivered=True)
                start = Start.REDELIVERED
            else:
                start = Start.DUPLICATE
        rfp = Announcement.model_validate(spec)  # a bad spec rolls the transition back
    return Running(task_id, attempt, node, start, rfp, price_per_unit, began=time.monotonic())


def _insert_once(session: Session, table: Table, values: dict[str, Any],
                 report: bool = False) -> bool:
    """INSERT a row unless it breaks a unique index (an earlier delivery wrote it already).
    With ``report``, say whether it was inserted (else True)."""
    dialect = session.get_bind().dialect.name
    key = (dialect, table.name, report)
    stmt = _INSERT_ONCE.get(key)
    if stmt is None and dialect in _ON_CONFLICT:
        stmt = _ON_CONFLICT[dialect](table)
        if report:  # RETURNING tells (psycopg reports no rowcount here); it costs a fetch
            stmt = stmt.returning(*table.primary_key.columns)
        _INSERT_ONCE[key] = stmt
    if stmt is not None:
        result = session.execute(stmt, values)
        return result.first() is not None if report else True
    try:  # another database: a savepoint, rolled back on the duplicate
        with session.begin_nested():
            session.execute(insert(table), values)
    except IntegrityError:
        return False
    return True


_NODES: Final = cast(Table, Node.__table__)
# Core, not ORM: an ORM UPDATE first works out which loaded objects to refresh.
_RECORD = (update(_NODES).where(_NODES.c.name == bindparam("node"))
           .values(attempts=_NODES.c.attempts + 1,
                   successes=_NODES.c.successes + bindparam("won", type_=Integer)))


def count_episode(session: Session, node: str, success: bool) -> None:
    """Add one finished attempt to ``node``'s record (call once per new episode row)."""
    session.execute(_RECORD, {"node": node, "won": int(success)})


def record_episode(session: Session, values: dict[str, Any]) -> None:
    """Store an attempt's episode once (a redelivery, or a sweep racing the node, keeps the
    first) and count a new one in its node's record."""
    if _insert_once(session, _EPISODES, values, report=True):
        count_episode(session, values["node"], bool(values["success"]))


def _on_conflict_sqlite(table: Table) -> Any:
    return sqlite_insert(table).on_conflict_do_nothing()


def _on_conflict_postgresql(table: Table) -> Any:
    return postgresql_insert(table).on_conflict_do_nothing()


_ON_CONFLICT: Final[dict[str, Callable[[Table], Any]]] = {
    "sqlite": _on_conflict_sqlite, "postgresql": _on_conflict_postgresql}
_INSERT_ONCE: dict[tuple[str, str, bool], Executable] = {}
_LEDGER: Final = cast(Table, LedgerEntry.__table__)
_EPISODES: Final = cast(Table, Episode.__table__)
_SPENT: Final = select(func.coalesce(func.sum(_LEDGER.c.total), 0.0)).where(
    _LEDGER.c.task_id == bindparam("task_id"))


def _charge(session: Session, run: Running, now: float) -> float:
    """Write this attempt's ledger entry (once); returns its cost."""
    assert run.rfp is not None
    units = run.rfp.units if run.units is None else run.units
    total = run.price_per_unit * units
    _insert_once(session, _LEDGER, {
        "task_id": run.task_id, "attempt": run.attempt, "node": run.node, "units": units,
        "price_per_unit": run.price_per_unit, "total": total, "at": now})
    return total


def _spent(session: Session, task_id: str) -> float:
    """The task's total cost so far (every attempt's ledger entry)."""
    return float(session.scalar(_SPENT, {"task_id": task_id}) or 0.0)


def _episode(session: Session, run: Running, *, success: bool, now: float,
             cost: float, error: str | None) -> None:
    """Record the attempt's outcome (once: a redelivered attempt keeps the first)."""
    assert run.rfp is not None
    record_episode(session, {
        "task_id": run.task_id, "attempt": run.attempt, "node": run.node,
        "task_type": run.rfp.task_type, "skills": list(run.rfp.required_skills),
        "success": success, "duration_s": time.monotonic() - run.began, "cost": cost,
        "error": error, "finished_at": now})


def complete(settings: Settings, run: Running, result: Any) -> Verdict:
    """The body returned: COMPLETED, then SUCCESS, or FAILED when the budget or schema says so.

    The two transitions are one UPDATE (``transition.apply``), logged as two messages.
    """
    if run.rfp is None:
        return Verdict()
    rfp = run.rfp
    budget = rfp.budget
    now = time.time()
    invalid = _schema_error(rfp.output_schema, result)  # pure: outside the write lock
    over: tuple[float, float] | None = None
    with write_session(settings.database_url) as session:
        cost = _charge(session, run, now)
        _episode(session, run, success=invalid is None, now=now, cost=cost, error=invalid)
        # The ledger's sum matters only against a budget (the entry itself is always written).
        spent = _spent(session, run.task_id) if budget is not None else 0.0
        done = Step(lifecycle.COMPLETED, journal.TASK_COMPLETED, detail={"cost": cost},
                    values={"finished_at": now})
        if budget is not None and spent > budget + BUDGET_EPSILON:
            reason = f"spent {spent:.4f} of budget {budget:.4f}"
            then = Step(lifecycle.FAILED, journal.COST_EXCEEDED, run.node,
                        {"budget": budget, "spent": spent}, {"error": reason})
            over = (budget, spent)
            verdict = Verdict(error=CostExceededError(f"task {run.task_id}: {reason}"))
        elif invalid is not None:
            then = Step(lifecycle.FAILED, journal.OUTPUT_INVALID, run.node, {"error": invalid},
                        {"error": invalid})
            verdict = Verdict(error=OutputValidationError(invalid))
        else:
            then = Step(lifecycle.SUCCESS, journal.TASK_SUCCEEDED, run.node)
            verdict = Verdict()
        if not apply(session, run.task_id, (done, then), expect_attempt=run.attempt,
                     expect_node=run.node, at=now).moved:
            return Verdict()
    if over is not None:
        _notify_cost(settings, run, *over)
    return verdict


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
    """The body raised: retry (a new auction after the backoff), extend the timeout, or FAILED."""
    if run.rfp is None:
        return Verdict()
    rfp = run.rfp
    now = time.time()
    error = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    over: tuple[float, float] | None = None
    with write_session(settings.database_url) as session:
        cost = _charge(session, run, now)
        _episode(session, run, success=False, now=now, cost=cost, error=error)
        plan = plan_retry(rfp, run.node, exc, now, rng)
        # The sum of the ledger matters against a budget and for the next attempt's spec.
        spent = (_spent(session, run.task_id)
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
        transition(session, run.task_id, lifecycle.FAILED, kind=kind,
                   expect_attempt=run.attempt, expect_node=run.node, at=now,
                   detail={"error": error, "why": plan.why},
                   error=f"{error} ({plan.why})" if plan.why else error, finished_at=now)
    if over is not None:
        _notify_cost(settings, run, *over)
        return Verdict(error=CostExceededError(f"task {run.task_id}: {plan.why}"))
    return Verdict()


@dataclass(frozen=True)
class RetryPlan:
    """The next attempt of a failed task, when to announce it, and why (or why not)."""

    next: Announcement | None
    delay: float | None
    why: str


def plan_retry(rfp: Announcement, node: str, exc: BaseException, now: float,
               rng: random.Random | None = None) -> RetryPlan:
    """Decide what follows a failed attempt (pure): AITP 6.1 retries and 6.2 on_timeout."""
    failures = rfp.failures + 1
    base = {"attempt": rfp.attempt + 1, "failures": failures,
            "exclude_nodes": retry_exclusions(rfp, node), "announced_at": now}
    if rfp.deadline is not None and now >= rfp.deadline:
        return RetryPlan(None, None, "deadline passed")
    if isinstance(exc, SoftTimeLimitExceeded):
        fb = rfp.fallbacks
        if fb.on_timeout == "fail":
            return RetryPlan(None, None, "timed out (on_timeout=fail)")
        if fb.on_timeout == "extend":
            extended = fb.extended_timeout_seconds
            if rfp.timeout_seconds is not None and rfp.timeout_seconds >= extended:
                return RetryPlan(None, None, "timed out again with the extended timeout")
            # A timeout is not the node's fault alone: any node may take the longer attempt.
            nxt = rfp.model_copy(update={**base, "exclude_nodes": rfp.exclude_nodes,
                                         "timeout_seconds": fb.extended_timeout_seconds})
            return RetryPlan(nxt, 0.0, f"timed out; retrying with {fb.extended_timeout_seconds:g}s")
    policy = rfp.retry_policy
    if policy is None or policy.max_retries == 0:
        return RetryPlan(None, None, "")
    if not is_retryable(policy, exc):
        return RetryPlan(None, None, f"{type(exc).__name__} is not retryable")
    if failures > policy.max_retries:
        return RetryPlan(None, None, f"no retries left ({policy.max_retries} used)")
    delay = compute_delay(policy, failures, rng)
    return RetryPlan(rfp.model_copy(update=base), delay,
                     f"retry {failures} of {policy.max_retries}")


def revoked(settings: Settings, task_id: str, attempt: int, node: str, reason: str,
            now: float | None = None) -> bool:
    """Celery revoked the task on ``node`` (its message dropped, or its process terminated):
    FAILED with ``reason``. Nothing is charged and no episode counts against the node: the
    caller stopped it. Celery has stored REVOKED for the caller already. False when this
    attempt no longer holds the task (re-awarded, finished)."""
    now = time.time() if now is None else now
    with write_session(settings.database_url) as session:
        return transition(session, task_id, lifecycle.FAILED, kind=journal.TASK_FAILED,
                          from_states=lifecycle.IN_FLIGHT_STATES, expect_attempt=attempt,
                          expect_node=node, at=now, detail={"error": reason, "revoked": True},
                          error=reason, finished_at=now, due_at=None)


def hard_timeout(settings: Settings, task_id: str, error: str) -> str | None:
    """The pool process was killed at the hard time limit: the attempt is FAILED.

    Called in the worker's main process (Celery reports hard timeouts there). Celery has already
    stored the failure for the caller, so this is final: no retry is planned, and the store
    agrees with what ``.get()`` saw. Returns the node whose attempt failed, or None when there
    was nothing to fail.
    """
    now = time.time()
    with write_session(settings.database_url) as session:
        row = session.get(AnnouncementRow, task_id)
        if row is None or row.state != lifecycle.EXECUTING or row.assigned_node is None:
            return None
        node = row.assigned_node
        rfp = Announcement.model_validate(row.spec)
        run = Running(task_id, row.attempt, node, Start.FIRST, rfp,
                      began=time.monotonic() - (now - (row.started_at or now)))
        _episode(session, run, success=False, now=now, cost=0.0, error=error)
        failed = transition(session, task_id, lifecycle.FAILED, kind=journal.TASK_FAILED,
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
    now = time.time()
    rfp = run.rfp
    update: dict[str, Any] = {"attempt": rfp.attempt + 1, "failures": rfp.failures + 1,
                              "exclude_nodes": retry_exclusions(rfp, run.node),
                              "announced_at": now}
    if args is not None:
        update["args"] = list(args)
    if kwargs is not None:
        update["kwargs"] = dict(kwargs)
    nxt = rfp.model_copy(update=update)
    with write_session(settings.database_url) as session:
        return _to_retrying(session, run, nxt, now, delay, "the task called self.retry()")


def retry_exclusions(rfp: Announcement, node: str) -> list[str]:
    """The nodes a retry must avoid: those already excluded, plus ``node`` unless the task
    may retry on the same node."""
    exclude = list(rfp.exclude_nodes)
    if not rfp.retry_same_node and node not in exclude:
        exclude.append(node)
    return exclude


def _to_retrying(session: Session, run: Running, nxt: Announcement, now: float, delay: float,
                 why: str, error: str | None = None) -> bool:
    """EXECUTING -> RETRYING: the next attempt's spec, announced again at ``now + delay``."""
    detail: dict[str, Any] = {"delay_s": round(delay, 3), "why": why,
                              "next_attempt": nxt.attempt}
    if error is not None:
        detail["error"] = error
    return transition(
        session, run.task_id, lifecycle.RETRYING, kind=journal.RETRYING,
        expect_attempt=run.attempt, expect_node=run.node, at=now, detail=detail,
        attempt=nxt.attempt, spec=nxt.model_dump(mode="json"), due_at=now + delay,
        assigned_node=None, error=error,
    )


def report_progress(settings: Settings, run: Running, current: float, total: float,
                    note: str) -> dict[str, Any]:
    """Record a PROGRESS_UPDATE (AITP 5.3) and return the progress as stored."""
    percent = round(100.0 * current / total, 1) if total else None
    progress = {"current": current, "total": total, "percent": percent, "note": note,
                "node": run.node, "attempt": run.attempt, "at": time.time()}
    with write_session(settings.database_url) as session:
        session.execute(
            update(AnnouncementRow)
            .where(AnnouncementRow.task_id == run.task_id,
                   AnnouncementRow.attempt == run.attempt,
                   AnnouncementRow.state == lifecycle.EXECUTING)
            .values(progress=progress)
        )
        journal.record(session, run.task_id, journal.PROGRESS_UPDATE, node=run.node,
                       attempt=run.attempt, current=current, total=total, percent=percent,
                       note=note)
    return progress


def read_spec(settings: Settings, task_id: str) -> Announcement | None:
    """The current announcement of ``task_id``, or None."""
    with read_session(settings.database_url) as session:
        spec = session.scalar(select(AnnouncementRow.spec)
                              .where(AnnouncementRow.task_id == task_id))
    return None if spec is None else Announcement.model_validate(spec)
