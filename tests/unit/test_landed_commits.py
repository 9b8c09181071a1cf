"""An attempt's result or failure written again after its commit landed: the reply was lost
with the connection, and ``store.outage.outlasting`` tries the write again. The second try
returns the verdict that was stored, and the caller gets the stored outcome (SQLite and
PostgreSQL for the verdict; PostgreSQL, whose lost connections are waited out, for the
caller)."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.exceptions import Retry
from sqlalchemy import Engine, event
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

import bidding
from bidding.config import Settings, celery_conf
from bidding.errors import CostExceededError, OutputValidationError
from bidding.execution import attempt as execution
from bidding.execution.dispatch import ATTEMPT_HEADER, NODE_HEADER
from bidding.lifecycle import journal
from bidding.lifecycle import states as lifecycle
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import RetryPolicy
from bidding.store import write_session
from tests.unit.conftest import postgres_database
from tests.unit.test_execution import NODE, PRICE, assigned, log, row

#: The outcomes an attempt can store, each: the task's announcement fields, the body's
#: outcome (a value, or an exception it raises), the state stored, the last message logged.
CASES: dict[str, tuple[dict[str, Any], Any, str, str]] = {
    "success": ({}, {"ok": 1}, lifecycle.SUCCESS, journal.TASK_SUCCEEDED),
    "output_invalid": ({"output_schema": {"type": "object", "required": ["x"]}}, {"y": 1},
                       lifecycle.FAILED, journal.OUTPUT_INVALID),
    "cost_exceeded": ({"budget": 0.1}, {"ok": 1}, lifecycle.FAILED, journal.COST_EXCEEDED),
    "retrying": ({"retry_policy": RetryPolicy(max_retries=2, base_ms=1000)},
                 ValueError("boom"), lifecycle.RETRYING, journal.RETRYING),
    "failed": ({}, ValueError("boom"), lifecycle.FAILED, journal.TASK_FAILED),
    "failed_over_budget": ({"budget": 0.1, "retry_policy": RetryPolicy(max_retries=2)},
                           ValueError("boom"), lifecycle.FAILED, journal.COST_EXCEEDED),
}


def shown(verdict: execution.Verdict) -> tuple[float | None, type | None, str | None]:
    """What a verdict tells the worker (an error by its type and message)."""
    error = verdict.error
    return (verdict.retry_in, None if error is None else type(error),
            None if error is None else str(error))


def record(settings: Settings, run: execution.Running, outcome: Any) -> execution.Verdict:
    """What the node's worker writes after the body: its failure, or its result."""
    if isinstance(outcome, BaseException):
        return execution.fail(settings, run, outcome, random.Random(1))
    return execution.complete(settings, run, outcome)


@pytest.mark.parametrize("case", list(CASES))
def test_an_outcome_recorded_again_after_its_commit_landed_returns_the_stored_verdict(
        settings: Settings, case: str) -> None:
    fields, outcome, state, kind = CASES[case]
    # given an attempt whose outcome was recorded, its commit landed
    announcement = assigned(settings, **fields)
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    first = record(settings, run, outcome)
    logged = log(settings, announcement.task_id)
    assert row(settings, announcement.task_id).state == state and logged[-1][0] == kind
    # when the write is tried again (its reply was lost with the connection)
    again = record(settings, run, outcome)
    # then it says what the first said
    assert shown(again) == shown(first)
    # and the store is as the first left it, its log too
    assert row(settings, announcement.task_id).state == state
    assert log(settings, announcement.task_id) == logged


def test_a_failure_recorded_again_after_its_commit_landed_keeps_the_retry_once_announced(
        settings: Settings) -> None:
    # given an attempt whose failure moved the task to RETRYING, then to its next auction
    announcement = assigned(settings, retry_policy=RetryPolicy(max_retries=2, base_ms=1000))
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    first = execution.fail(settings, run, ValueError("boom"), random.Random(1))
    with write_session(settings.database_url) as session:
        assert transition(session, announcement.task_id, lifecycle.BIDDING, Log(journal.ANNOUNCED),
                          Expect(attempt=2), due_at=None)
    # when the failure's write is tried again
    again = execution.fail(settings, run, ValueError("boom"), random.Random(1))
    # then it still says retry (the task is the next attempt's, not failed)
    assert shown(again) == shown(first) == (1.0, None, None)
    assert (
        row(settings, announcement.task_id).state,
        row(settings, announcement.task_id).attempt,
    ) == (lifecycle.BIDDING, 2)


# --- what the caller gets -------------------------------------------------------------------


def node_app(url: str, profile: Path) -> Celery:
    """The app of node n1 (price 0.5 per unit, its profile at ``profile``), whose task
    ``t.noop`` returns its argument, or raises it."""
    profile.write_text(f'name = "{NODE}"\ncapabilities = ["s1", "s2"]\nprice_per_unit = {PRICE}\n')
    app = Celery("node", set_as_current=False)
    app.conf.update(
        celery_conf("memory://", "cache+memory://"),
        bidding_database_url=url,
        bidding_auto_migrate=False,
        bidding_profile=str(profile),
    )

    @app.task(shared=False, base=bidding.BiddingTask, name="t.noop")
    def noop(outcome: Any) -> Any:
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    return app


@contextmanager
def reply_lost_after_commit(wrapped: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The first commit of ``execution.<wrapped>`` lands, and its reply is lost with the
    connection: the session raises what SQLAlchemy raises for a lost server (as
    ``store.rows.commit_with`` does), which ``outlasting`` waits out. A commit is a session's,
    or that of a write in one statement (a ``WITH`` on a connection that commits each
    statement: ``transition.apply_alone``). Yields the calls made."""
    calls: list[int] = []
    armed: list[bool] = []

    def lost(*_: Any) -> None:
        if armed:
            armed.clear()
            raise OperationalError(
                "COMMIT",
                {},
                ConnectionError("server closed the connection unexpectedly"),
                connection_invalidated=True,
            )

    def statement_committed(conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        driver = conn.connection.driver_connection
        if statement.startswith("WITH") and getattr(driver, "autocommit", False):
            lost()

    original: Callable[..., execution.Verdict] = getattr(execution, wrapped)

    def first_reply_lost(*args: Any, **kwargs: Any) -> execution.Verdict:
        if not calls:
            armed.append(True)
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(execution, wrapped, first_reply_lost)
    event.listen(Session, "after_commit", lost)
    event.listen(Engine, "after_cursor_execute", statement_committed)
    try:
        yield calls
    finally:
        event.remove(Session, "after_commit", lost)
        event.remove(Engine, "after_cursor_execute", statement_committed)


@pytest.mark.parametrize("case", list(CASES))
def test_on_postgresql_the_caller_gets_the_stored_outcome_when_its_reply_was_lost(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, case: str
) -> None:
    fields, outcome, state, kind = CASES[case]
    with postgres_database() as url:
        settings = Settings(database_url=url, auto_migrate=False)
        task = node_app(url, tmp_path / "n1.toml").tasks["t.noop"]
        # given an attempt on its node, whose outcome's commit lands and whose reply is lost
        announcement = assigned(settings, **fields)
        task.push_request(
            id=announcement.task_id,
            called_directly=False,
            delivery_info={},
            headers={ATTEMPT_HEADER: 1, NODE_HEADER: NODE},
            hostname=None,
        )
        wrapped = "fail" if isinstance(outcome, BaseException) else "complete"
        try:
            with reply_lost_after_commit(wrapped, monkeypatch) as calls:
                # when the task runs there
                try:
                    got: Any = task(outcome)
                except BaseException as exc:  # what Celery would store for the caller
                    got = exc
        finally:
            task.pop_request()
        # then the outcome was written twice (the second after the lost reply)
        assert len(calls) == 2
        # and the caller gets the outcome the store holds
        assert row(settings, announcement.task_id).state == state
        if state == lifecycle.SUCCESS:
            assert got == outcome
        elif state == lifecycle.RETRYING:
            assert isinstance(got, Retry) and got.when == 1.0
        elif kind == journal.OUTPUT_INVALID:
            assert isinstance(got, OutputValidationError)
            assert str(got) == row(settings, announcement.task_id).error
        elif kind == journal.COST_EXCEEDED:
            assert isinstance(got, CostExceededError)
            assert str(got) == f"task {announcement.task_id}: spent 0.5000 of budget 0.1000"
        else:  # the body's own exception
            assert got is outcome
        # and the log says it once
        assert log(settings, announcement.task_id)[-1][0] == kind
