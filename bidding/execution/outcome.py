"""An attempt's end on its node: completed (SUCCESS, or FAILED by its budget or output schema),
or failed by its body (a retry after the backoff, or FAILED); ``complete`` and ``fail`` write
its ledger entry and episode with its state, and, tried again after a commit whose reply was
lost, return the verdict they stored."""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Mapping
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import select
from sqlalchemy.orm import Session

from bidding import clock
from bidding.config import Settings
from bidding.errors import CostExceededError, OutputValidationError, TaskExpiredError
from bidding.execution import ledger
from bidding.execution.episodes import attempt_writes, record_attempt
from bidding.execution.report import exception_json, value_json
from bidding.execution.retry import RetryPlan, error_text, plan_retry
from bidding.execution.running import Running, Verdict
from bidding.lifecycle import journal, states
from bidding.lifecycle.transition import Expect, Log, Step, apply, apply_alone, transition
from bidding.models import BUDGET_EPSILON, Announcement, non_json_number
from bidding.store import read_session, statement_session, write_session
from bidding.store.engine import is_sqlite
from bidding.store.schema import Message

logger = logging.getLogger(__name__)


def charge_and_record(session: Session, run: Running, *, success: bool, now: float,
                       error: str | None) -> float:
    """Write this attempt's ledger entry and its outcome (each once: a redelivered attempt
    keeps the first); returns its cost."""
    charge, outcome = _attempt_rows(run, success=success, now=now, error=error)
    record_attempt(session, charge, outcome)
    return float(charge["total"])


def _attempt_rows(run: Running, *, success: bool, now: float,
                  error: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """This attempt's ledger entry and episode rows."""
    assert run.announcement is not None
    units = run.announcement.units if run.units is None else run.units
    charge = ledger.entry(task_id=run.task_id, attempt=run.attempt, node=run.node,
                          units=units, price_per_unit=run.price_per_unit, at=now)
    return charge, _outcome(run, success=success, now=now, cost=charge["total"], error=error)


def _outcome(run: Running, *, success: bool, now: float, cost: float,
             error: str | None) -> dict[str, Any]:
    """The attempt's episode row."""
    assert run.announcement is not None
    return {
        "task_id": run.task_id,
        "attempt": run.attempt,
        "node": run.node,
        "task_type": run.announcement.task_type,
        "skills": list(run.announcement.required_skills),
        "success": success,
        "duration_s": time.monotonic() - run.began,
        "cost": cost,
        "error": error,
        "finished_at": now,
    }


def episode(
    session: Session, run: Running, *, success: bool, now: float, cost: float, error: str | None
) -> None:
    """Record the attempt's outcome (once: a redelivered attempt keeps the first)."""
    record_attempt(session, None, _outcome(run, success=success, now=now, cost=cost, error=error))


def complete(settings: Settings, run: Running, result: Any) -> Verdict:
    """The body returned: COMPLETED, then SUCCESS, or FAILED when the budget or schema says so.

    The two transitions are one UPDATE (``transition.apply``), logged as two messages; on
    PostgreSQL, without a budget to read, one statement with the ledger's entry, the episode
    and the node's records (``transition.apply_alone``). Tried again on the same ``run`` after
    its commit landed, it returns the verdict stored then.
    """
    if run.announcement is None:
        return Verdict()
    now, again = _end_time(run)
    if again and (landed := _landed(settings, run, now)) is not None:
        return landed
    announcement = run.announcement
    budget = announcement.budget
    invalid = _schema_error(announcement.output_schema, result)  # pure: outside the write lock
    if invalid is None and not _is_json(result):
        # Celery could not send it either (JSON only): fail it here, saying why, rather than
        # store a success the caller never gets.
        invalid = (
            f"result is not JSON serializable ({type(result).__name__}); "
            "celery-bidding sends JSON only"
        )
    if invalid is None:
        # Python's json writes NaN anyway; the store (PostgreSQL refuses it) and every
        # reader after Celery's own (null elsewhere) would not agree on the value.
        invalid = non_json_number(result, "result")
    charge, outcome = _attempt_rows(run, success=invalid is None, now=now, error=invalid)
    cost = float(charge["total"])
    done = Step(
        states.COMPLETED,
        Log(journal.TASK_COMPLETED, detail={"cost": cost}),
        values={"finished_at": now},
    )
    held = Expect(attempt=run.attempt, node=run.node)
    if budget is None and not is_sqlite(settings.database_url):
        # The usual end in one statement and one round trip: the entry, the episode and the
        # node's records with the two transitions and their messages (four round trips in a
        # transaction). Refused (moved on meanwhile), the transaction below finds why.
        then, verdict = _ending(result, invalid, run.node)
        with statement_session(settings.database_url) as session:
            moved = apply_alone(session, run.task_id, (done, then), held, at=now,
                                also=(attempt_writes(charge, outcome),))
        if moved is not None:
            return verdict
    over: tuple[float, float] | None = None
    with write_session(settings.database_url) as session:
        record_attempt(session, charge, outcome)
        # The ledger's sum matters only against a budget (the entry itself is always written).
        spent = ledger.spent(session, run.task_id) if budget is not None else 0.0
        if budget is not None and spent > budget + BUDGET_EPSILON:
            reason = f"spent {spent:.4f} of budget {budget:.4f}"
            over = (budget, spent)
            error: BaseException = CostExceededError(f"task {run.task_id}: {reason}")
            verdict = Verdict(error=error)
            then = Step(
                states.FAILED,
                Log(journal.COST_EXCEEDED, run.node, {"budget": budget, "spent": spent}),
                {"error": reason, "result": exception_json(error)},
            )
        else:
            then, verdict = _ending(result, invalid, run.node)
        if not apply(session, run.task_id, (done, then), held, at=now).moved:
            return Verdict()
    if over is not None:
        notify_cost(settings, run, *over)
    return verdict


def _ending(result: Any, invalid: str | None, node: str) -> tuple[Step, Verdict]:
    """The step after COMPLETED within its budget: SUCCESS with the result, or FAILED when
    the output is ``invalid``; and the verdict the worker acts on."""
    if invalid is not None:
        error = OutputValidationError(invalid)
        return Step(
            states.FAILED,
            Log(journal.OUTPUT_INVALID, node, {"error": invalid}),
            {"error": invalid, "result": exception_json(error)},
        ), Verdict(error=error)
    # The result is kept with the task: the store is what the caller's result is written
    # from again if the backend's first write fails (execution.report).
    return Step(
        states.SUCCESS,
        Log(journal.TASK_SUCCEEDED, node),
        values={"result": value_json(result)},
    ), Verdict()


#: The messages that end an attempt on its node, the last one of its end saying its verdict
#: (``fail`` logs TASK_FAILED, then RETRYING when it retries; ``complete`` TASK_COMPLETED,
#: then one of the others).
_ENDINGS: tuple[str, ...] = (
    journal.TASK_SUCCEEDED,
    journal.OUTPUT_INVALID,
    journal.COST_EXCEEDED,
    journal.TASK_FAILED,
    journal.RETRYING,
)


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
            .where(
                Message.task_id == run.task_id,
                Message.node == run.node,
                Message.at == now,
                Message.kind.in_(_ENDINGS),
            )
            .order_by(Message.id.desc())
            .limit(1)
        ).first()
        if found is None:
            return None
        verdict = stored_verdict(run.task_id, found.kind, found.detail)
        spent = ledger.spent(session, run.task_id) if found.kind == journal.COST_EXCEEDED else 0.0
    logger.info(
        "task %s: its outcome was stored before the connection was lost (%s)",
        run.task_id,
        found.kind,
    )
    if found.kind == journal.COST_EXCEEDED and run.announcement is not None:
        # The first try lost its connection at the commit, before it could notify.
        notify_cost(settings, run, run.announcement.budget or 0.0, spent)
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
        why = detail.get("why") or (
            f"spent {float(detail['spent']):.4f} of budget {float(detail['budget']):.4f}"
        )
        return Verdict(error=CostExceededError(f"task {task_id}: {why}"))
    if kind == journal.TASK_FAILED and str(detail.get("why") or "").startswith("expired:"):
        return Verdict(error=TaskExpiredError(
            f"task {task_id}: {detail['why']} (failed: {detail.get('error')})"))
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
    import jsonschema  # here: only a task with an output schema needs it (10 MB of a worker)

    try:
        jsonschema.validate(result, schema)
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        return f"output does not match the task's output schema at {where}: {exc.message}"
    return None


def fail(
    settings: Settings, run: Running, exc: BaseException, rng: random.Random | None = None
) -> Verdict:
    """The body raised: retry (a new auction after the backoff), extend the timeout, or FAILED.

    Tried again on the same ``run`` after its commit landed, it returns the verdict stored then
    (a retry stays a retry, though the task may be in its next auction by now).
    """
    if run.announcement is None:
        return Verdict()
    now, again = _end_time(run)
    if again and (landed := _landed(settings, run, now)) is not None:
        return landed
    announcement = run.announcement
    error = error_text(exc)
    over: tuple[float, float] | None = None
    with write_session(settings.database_url) as session:
        charge_and_record(session, run, success=False, now=now, error=error)
        plan = plan_retry(
            announcement, run.node, exc, now, rng, timed_out=isinstance(exc, SoftTimeLimitExceeded)
        )
        # The sum of the ledger matters against a budget and for the next attempt's spec.
        spent = (
            ledger.spent(session, run.task_id)
            if announcement.budget is not None or plan.next is not None
            else 0.0
        )
        if announcement.budget is not None and spent > announcement.budget + BUDGET_EPSILON:
            over = (announcement.budget, spent)
            plan = RetryPlan(None, None, f"spent {spent:.4f} of budget {announcement.budget:.4f}")
        if plan.next is not None and plan.delay is not None:
            journal.record(
                session,
                run.task_id,
                journal.TASK_FAILED,
                node=run.node,
                attempt=run.attempt,
                at=now,
                error=error,
                will_retry=True,
            )
            nxt = plan.next.model_copy(update={"spent": spent})
            moved = to_retrying(session, run, nxt, now, plan.delay, plan.why, error=error)
            return (Verdict(retry_in=plan.delay, retry_at=now + plan.delay) if moved
                    else Verdict())
        kind = journal.COST_EXCEEDED if over else journal.TASK_FAILED
        final: BaseException = (
            CostExceededError(f"task {run.task_id}: {plan.why}") if over
            # No retry can start before the task's expiry: the caller hears it expired.
            else TaskExpiredError(f"task {run.task_id}: {plan.why} (attempt {run.attempt} "
                                  f"failed: {error})") if plan.expired
            else exc
        )
        transition(
            session,
            run.task_id,
            states.FAILED,
            Log(kind, detail={"error": error, "why": plan.why}, at=now),
            Expect(attempt=run.attempt, node=run.node),
            error=f"{error} ({plan.why})" if plan.why else error,
            finished_at=now,
            result=exception_json(final),
        )
    if over is not None:
        notify_cost(settings, run, *over)
        return Verdict(error=CostExceededError(f"task {run.task_id}: {plan.why}"))
    if final is not exc:
        return Verdict(error=final)
    return Verdict()


def notify_cost(settings: Settings, run: Running, budget: float, spent: float) -> None:
    """Notify that ``run`` went over its task's budget (the cost_exceeded signal)."""
    from bidding.signals import cost_exceeded, notify

    notify(
        settings,
        cost_exceeded,
        "cost_exceeded",
        task_id=run.task_id,
        budget=budget,
        spent=spent,
        node=run.node,
        attempt=run.attempt,
    )


def to_retrying(
    session: Session,
    run: Running,
    nxt: Announcement,
    now: float,
    delay: float,
    why: str,
    error: str | None = None,
) -> bool:
    """EXECUTING -> RETRYING: the next attempt's spec, announced again at ``now + delay``."""
    detail: dict[str, Any] = {"delay_s": round(delay, 3), "why": why, "next_attempt": nxt.attempt}
    if error is not None:
        detail["error"] = error
    return transition(
        session,
        run.task_id,
        states.RETRYING,
        Log(journal.RETRYING, detail=detail, at=now),
        Expect(attempt=run.attempt, node=run.node),
        attempt=nxt.attempt,
        spec=nxt.model_dump(mode="json"),
        due_at=now + delay,
        assigned_node=None,
        error=error,
    )
