"""The winning node's bookkeeping (begin, complete, fail, hard_timeout) and ``transition``,
on SQLite and PostgreSQL: states, columns, ledger, episodes and the exact message log."""

from __future__ import annotations

import random
import uuid
from typing import Any

import pytest
from sqlalchemy import select

from bidding.config import Settings
from bidding.errors import CostExceededError, OutputValidationError
from bidding.execution import attempt as execution
from bidding.lifecycle import journal
from bidding.lifecycle import states as lifecycle
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import Announcement, RetryPolicy
from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import query_live_nodes
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow, Episode, LedgerEntry, Message, Node, NodeRecord
from tests.stored import add_announcement

NODE = "n1"
PRICE = 0.5


def assigned(settings: Settings, *, node: str = NODE, **fields: Any) -> Announcement:
    """An announcement in state ASSIGNED to ``node`` (as announce and the award leave it)."""
    announcement = Announcement(task_id=str(uuid.uuid4()), task_name="t.noop", task_type="noop",
                       required_skills=["s1", "s2"], **fields)
    return add_announcement(settings.database_url, announcement, lifecycle.ASSIGNED, [node],
                            due_at=announcement.announced_at + 30, assigned_node=node,
                            awarded_at=announcement.announced_at)


def log(settings: Settings, task_id: str) -> list[tuple[str, str | None, int, dict[str, Any]]]:
    with read_session(settings.database_url) as session:
        rows = session.scalars(
            select(Message).where(Message.task_id == task_id).order_by(Message.id)
        ).all()
        return [(m.kind, m.node, m.attempt, m.detail) for m in rows]


def times(settings: Settings, task_id: str) -> list[float]:
    with read_session(settings.database_url) as session:
        return list(
            session.scalars(
                select(Message.at).where(Message.task_id == task_id).order_by(Message.id)
            )
        )


def row(settings: Settings, task_id: str) -> AnnouncementRow:
    with read_session(settings.database_url) as session:
        found = session.get(AnnouncementRow, task_id)
        assert found is not None
        return found


def ledger(settings: Settings, task_id: str) -> list[tuple[int, str, float, float, float]]:
    with read_session(settings.database_url) as session:
        return [
            (e.attempt, e.node, e.units, e.price_per_unit, e.total)
            for e in session.scalars(
                select(LedgerEntry).where(LedgerEntry.task_id == task_id).order_by(LedgerEntry.id)
            )
        ]


def episodes(settings: Settings, task_id: str) -> list[Episode]:
    with read_session(settings.database_url) as session:
        return list(
            session.scalars(select(Episode).where(Episode.task_id == task_id).order_by(Episode.id))
        )


def illegal(
    target: str,
    wanted: str,
    current: str | None,
    *,
    node: str | None = NODE,
    attempt: int | None = 1,
    current_attempt: int | None = 1,
    current_node: str | None = NODE,
    expected_node: str | None = NODE,
) -> tuple[str, str | None, int, dict[str, Any]]:
    # A change from an attempt or node that no longer holds the task is stale, not illegal.
    stale = current is not None and (current_attempt != attempt or current_node != expected_node)
    return (
        journal.STALE_UPDATE if stale else journal.ILLEGAL_TRANSITION,
        node,
        attempt or 1,
        {
            "target": target,
            "wanted": wanted,
            "current": current,
            "current_attempt": current_attempt if current else None,
            "current_node": current_node if current else None,
            "expected_attempt": attempt,
            "expected_node": expected_node,
        },
    )


# --- begin ---------------------------------------------------------------------------------


def test_begin_moves_an_assigned_task_to_executing(settings: Settings) -> None:
    announcement = assigned(settings)
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    assert run.start is execution.Start.FIRST
    assert run.announcement == announcement and run.price_per_unit == PRICE and run.began > 0
    found = row(settings, announcement.task_id)
    assert found.state == lifecycle.EXECUTING and found.due_at is None
    assert log(settings, announcement.task_id) == [(journal.TASK_ACCEPTED, NODE, 1, {})]
    assert found.started_at == times(settings, announcement.task_id)[0]


def test_on_postgresql_begin_is_one_statement_and_one_round_trip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqlalchemy import event

    from bidding.store.engine import get_engine
    from tests.unit.conftest import postgres_database, psycopg_commands

    with postgres_database() as url:
        settings = Settings(database_url=url, auto_migrate=False)
        announcement = assigned(settings)
        statements: list[str] = []
        event.listen(
            get_engine(url), "before_cursor_execute", lambda *args: statements.append(args[2])
        )
        sent = psycopg_commands(monkeypatch)
        # when the node begins the attempt
        run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
        # then it sent one statement and no BEGIN or COMMIT of its own
        assert len(statements) == 1 and sent == [], (statements, sent)
        # and the task runs, with its message logged, as in a transaction
        assert run.start is execution.Start.FIRST and run.announcement == announcement
        assert row(settings, announcement.task_id).state == lifecycle.EXECUTING
        assert log(settings, announcement.task_id) == [(journal.TASK_ACCEPTED, NODE, 1, {})]


def test_begin_of_a_task_whose_announcement_the_node_cannot_read_fails_it_saying_why(
    settings: Settings,
) -> None:
    from pydantic import ValidationError

    # given a task whose stored announcement has a field this version does not know (a newer
    # announcer's)
    announcement = assigned(settings)
    with write_session(settings.database_url) as session:
        found = session.get(AnnouncementRow, announcement.task_id)
        assert found is not None
        found.spec = {**found.spec, "from_the_future": 1}
    # when the node begins it, then the error is raised (the caller's result gets it)
    with pytest.raises(ValidationError):
        execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    # and the task is FAILED, the store and its log saying why
    failed = row(settings, announcement.task_id)
    assert failed.state == lifecycle.FAILED
    assert failed.error is not None and "cannot be read on node n1" in failed.error
    assert "from_the_future" in failed.error
    assert log(settings, announcement.task_id)[-1][0] == journal.TASK_FAILED


def test_a_begin_tried_again_after_its_commit_landed_runs_the_task(settings: Settings) -> None:
    # given a begin whose commit landed, and whose answer was lost with the connection (the
    # node's worker tries it again, with the same start time)
    announcement = assigned(settings)
    execution.begin(
        settings,
        announcement.task_id,
        1,
        NODE,
        PRICE,
        redelivered=False,
        starter=execution.Starter(at=1000.5),
    )
    # when it is tried again
    run = execution.begin(
        settings,
        announcement.task_id,
        1,
        NODE,
        PRICE,
        redelivered=False,
        starter=execution.Starter(at=1000.5),
    )
    # then the task runs (it is not taken for a second copy of its message, dropped)
    assert run.start is execution.Start.FIRST and run.announcement == announcement
    assert row(settings, announcement.task_id).started_at == 1000.5
    # while a second copy of the message, begun later, is still a duplicate
    later = execution.begin(
        settings,
        announcement.task_id,
        1,
        NODE,
        PRICE,
        redelivered=False,
        starter=execution.Starter(at=1001.0),
    )
    assert later.start is execution.Start.DUPLICATE


def test_begin_again_on_the_same_node_is_a_redelivery(settings: Settings) -> None:
    announcement = assigned(settings)
    execution.begin(settings, announcement.task_id, 1, NODE)
    started = row(settings, announcement.task_id).started_at
    run = execution.begin(settings, announcement.task_id, 1, NODE)
    assert run.start is execution.Start.REDELIVERED and run.announcement == announcement
    assert row(settings, announcement.task_id).started_at == started
    assert log(settings, announcement.task_id)[1:] == [
        illegal(lifecycle.EXECUTING, journal.TASK_ACCEPTED, lifecycle.EXECUTING),
        (journal.TASK_ACCEPTED, NODE, 1, {"redelivered": True}),
    ]


def test_a_second_copy_of_a_running_attempts_message_is_a_duplicate(settings: Settings) -> None:
    # given an attempt running on its node
    announcement = assigned(settings)
    execution.begin(settings, announcement.task_id, 1, NODE)
    # when a second copy of its message arrives, not redelivered by the broker (a resend whose
    # first publish did arrive)
    run = execution.begin(settings, announcement.task_id, 1, NODE, redelivered=False)
    # then it must not run: the first copy is running
    assert run.start is execution.Start.DUPLICATE
    assert journal.TASK_ACCEPTED not in [m[0] for m in log(settings, announcement.task_id)[1:]]


@pytest.mark.parametrize(("attempt", "node"), [(1, "n2"), (2, NODE)])
def test_begin_elsewhere_or_for_another_attempt_is_a_duplicate(
    settings: Settings, attempt: int, node: str
) -> None:
    announcement = assigned(settings)
    run = execution.begin(settings, announcement.task_id, attempt, node)
    assert run.start is execution.Start.DUPLICATE and run.announcement == announcement
    assert row(settings, announcement.task_id).state == lifecycle.ASSIGNED
    assert log(settings, announcement.task_id) == [
        illegal(
            lifecycle.EXECUTING,
            journal.TASK_ACCEPTED,
            lifecycle.ASSIGNED,
            node=node,
            attempt=attempt,
            expected_node=node,
        )
    ]


def test_begin_of_a_finished_task_is_a_duplicate(settings: Settings) -> None:
    announcement = assigned(settings)
    execution.complete(settings, execution.begin(settings, announcement.task_id, 1, NODE), None)
    run = execution.begin(settings, announcement.task_id, 1, NODE)
    assert run.start is execution.Start.DUPLICATE
    assert log(settings, announcement.task_id)[-1] == illegal(
        lifecycle.EXECUTING, journal.TASK_ACCEPTED, lifecycle.SUCCESS
    )


def test_begin_of_an_unknown_task(settings: Settings) -> None:
    run = execution.begin(settings, "nope", 1, NODE, PRICE)
    assert run.start is execution.Start.UNKNOWN and run.announcement is None
    assert log(settings, "nope") == [illegal(lifecycle.EXECUTING, journal.TASK_ACCEPTED, None)]
    assert execution.complete(settings, run, None) == execution.Verdict()


# --- complete ------------------------------------------------------------------------------


def test_complete_charges_records_and_succeeds(settings: Settings) -> None:
    announcement = assigned(settings)
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    assert execution.complete(settings, run, {"ok": 1}) == execution.Verdict()
    found = row(settings, announcement.task_id)
    assert found.state == lifecycle.SUCCESS and found.error is None
    assert log(settings, announcement.task_id)[1:] == [
        (journal.TASK_COMPLETED, NODE, 1, {"cost": 0.5}),
        (journal.TASK_SUCCEEDED, NODE, 1, {}),
    ]
    at = times(settings, announcement.task_id)
    assert at[1] == at[2] == found.finished_at
    assert ledger(settings, announcement.task_id) == [(1, NODE, 1.0, 0.5, 0.5)]
    [ep] = episodes(settings, announcement.task_id)
    assert (ep.attempt, ep.node, ep.task_type, ep.skills, ep.success, ep.cost, ep.error) == (
        1,
        NODE,
        "noop",
        ["s1", "s2"],
        True,
        0.5,
        None,
    )
    assert ep.finished_at == found.finished_at and ep.duration_s >= 0


def test_on_postgresql_complete_is_one_statement_and_one_round_trip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqlalchemy import event

    from bidding.store.engine import get_engine
    from tests.unit.conftest import postgres_database, psycopg_commands

    with postgres_database() as url:
        # given a registered node running an attempt
        settings = Settings(database_url=url, auto_migrate=False)
        heartbeat(settings, NodeProfile(name=NODE, capabilities=["s1"], capacity=2))
        announcement = assigned(settings)
        run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
        statements: list[str] = []
        event.listen(
            get_engine(url), "before_cursor_execute", lambda *args: statements.append(args[2])
        )
        sent = psycopg_commands(monkeypatch)
        # when the node completes the attempt (no budget: nothing to read first)
        assert execution.complete(settings, run, {"ok": 1}) == execution.Verdict()
        # then it sent one statement and no BEGIN or COMMIT of its own
        assert len(statements) == 1 and sent == [], (statements, sent)
        # and everything a transaction wrote is there: the state, both messages, the
        # ledger's entry, the episode and the node's records
        assert row(settings, announcement.task_id).state == lifecycle.SUCCESS
        assert log(settings, announcement.task_id)[1:] == [
            (journal.TASK_COMPLETED, NODE, 1, {"cost": 0.5}),
            (journal.TASK_SUCCEEDED, NODE, 1, {}),
        ]
        assert ledger(settings, announcement.task_id) == [(1, NODE, 1.0, 0.5, 0.5)]
        [ep] = episodes(settings, announcement.task_id)
        assert (ep.success, ep.skills, ep.cost) == (True, ["s1", "s2"], 0.5)
        with read_session(url) as session:
            record = session.get(Node, NODE)
            typed = session.get(NodeRecord, (NODE, "noop"))
        assert record is not None and (record.attempts, record.successes) == (1, 1)
        assert typed is not None and (typed.attempts, typed.successes) == (1, 1)


def test_on_postgresql_complete_takes_its_nodes_row_before_its_tasks_as_an_award_does() -> None:
    import threading
    import time

    from sqlalchemy import create_engine, text

    from bidding.store.engine import normalize_url
    from tests.unit.conftest import postgres_database

    with postgres_database() as url:
        # given a registered node running an attempt
        settings = Settings(database_url=url, auto_migrate=False)
        heartbeat(settings, NodeProfile(name=NODE, capabilities=["s1"], capacity=2))
        announcement = assigned(settings)
        run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
        # and an award's transaction elsewhere that holds the node's row (it locks its nodes'
        # rows first, then the task's)
        other = create_engine(normalize_url(url))
        with other.connect() as award:
            award.execute(text("SELECT name FROM bidding_nodes WHERE name = :n FOR UPDATE"),
                          {"n": NODE})
            # when the node completes its attempt meanwhile
            done: list[execution.Verdict] = []
            ending = threading.Thread(target=lambda: done.append(
                execution.complete(settings, run, {"ok": 1})))
            ending.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # until the completion waits on a lock
                waiting = award.execute(text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'")).scalar_one()
                if waiting:
                    break
                time.sleep(0.01)
            # then it waits for the node's row without having locked the task's: the award
            # can still lock the task (with the task's first, the two would deadlock)
            locked = award.execute(text(
                "SELECT state FROM bidding_announcements WHERE task_id = :t FOR UPDATE NOWAIT"),
                {"t": announcement.task_id}).scalar_one()
            assert locked == lifecycle.EXECUTING
            award.commit()
        other.dispose()
        ending.join(10)
        # and once the award is done, the attempt ends as usual
        assert done == [execution.Verdict()]
        assert row(settings, announcement.task_id).state == lifecycle.SUCCESS


def test_complete_charges_the_reported_units(settings: Settings) -> None:
    announcement = assigned(settings, units=2.0)
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    run.units = 3.0
    execution.complete(settings, run, None)
    assert ledger(settings, announcement.task_id) == [(1, NODE, 3.0, 0.5, 1.5)]
    assert log(settings, announcement.task_id)[1] == (
        journal.TASK_COMPLETED,
        NODE,
        1,
        {"cost": 1.5},
    )


def test_complete_twice_changes_nothing_but_the_log(settings: Settings) -> None:
    # given an attempt completed by one delivery of its message
    announcement = assigned(settings)
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    execution.complete(settings, run, None)
    # when another delivery of it completes it too (its own run; a try of the same run again
    # is test_landed_commits')
    again = execution.Running(
        announcement.task_id, 1, NODE, execution.Start.REDELIVERED, run.announcement, PRICE
    )
    assert execution.complete(settings, again, None) == execution.Verdict()
    # then nothing changed but the log, which says it was refused
    assert row(settings, announcement.task_id).state == lifecycle.SUCCESS
    assert (
        len(ledger(settings, announcement.task_id))
        == len(episodes(settings, announcement.task_id))
        == 1
    )
    assert log(settings, announcement.task_id)[3:] == [
        illegal(lifecycle.COMPLETED, journal.TASK_COMPLETED, lifecycle.SUCCESS)
    ]


def test_complete_after_a_reaward_is_refused_but_charged(settings: Settings) -> None:
    announcement = assigned(settings)
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    with write_session(settings.database_url) as session:
        assert transition(
            session,
            announcement.task_id,
            lifecycle.ASSIGNED,
            Log(journal.REAWARDED, node="n2"),
            Expect(attempt=1),
            assigned_node="n2",
        )
    assert execution.complete(settings, run, None) == execution.Verdict()
    assert row(settings, announcement.task_id).state == lifecycle.ASSIGNED
    assert ledger(settings, announcement.task_id) == [(1, NODE, 1.0, 0.5, 0.5)]
    assert len(episodes(settings, announcement.task_id)) == 1
    assert log(settings, announcement.task_id)[1:] == [
        (journal.REAWARDED, "n2", 1, {}),
        illegal(
            lifecycle.COMPLETED, journal.TASK_COMPLETED, lifecycle.ASSIGNED, current_node="n2"
        ),
    ]


def test_complete_within_budget_succeeds(settings: Settings) -> None:
    announcement = assigned(settings, budget=0.5)
    execution.complete(
        settings, execution.begin(settings, announcement.task_id, 1, NODE, PRICE), None
    )
    assert row(settings, announcement.task_id).state == lifecycle.SUCCESS


def test_complete_over_budget_fails(settings: Settings) -> None:
    announcement = assigned(settings, budget=0.1)
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    verdict = execution.complete(settings, run, None)
    assert isinstance(verdict.error, CostExceededError) and verdict.retry_in is None
    found = row(settings, announcement.task_id)
    assert found.state == lifecycle.FAILED
    assert found.error == "spent 0.5000 of budget 0.1000"
    assert found.finished_at == times(settings, announcement.task_id)[-1]
    assert log(settings, announcement.task_id)[1:] == [
        (journal.TASK_COMPLETED, NODE, 1, {"cost": 0.5}),
        (journal.COST_EXCEEDED, NODE, 1, {"budget": 0.1, "spent": 0.5}),
    ]
    assert episodes(settings, announcement.task_id)[0].success is True


def test_complete_with_invalid_output_fails(settings: Settings) -> None:
    announcement = assigned(settings, output_schema={"type": "object", "required": ["x"]})
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    verdict = execution.complete(settings, run, {"y": 1})
    assert isinstance(verdict.error, OutputValidationError)
    found = row(settings, announcement.task_id)
    assert found.state == lifecycle.FAILED and found.error == str(verdict.error)
    assert log(settings, announcement.task_id)[1:] == [
        (journal.TASK_COMPLETED, NODE, 1, {"cost": 0.5}),
        (journal.OUTPUT_INVALID, NODE, 1, {"error": str(verdict.error)}),
    ]
    [ep] = episodes(settings, announcement.task_id)
    assert ep.success is False and ep.error == str(verdict.error)


def test_a_result_holding_nan_fails_the_task_saying_where(settings: Settings) -> None:
    # given a running task whose body returns NaN inside its result (not JSON: SQLite stored
    # it, PostgreSQL refused the write and left the task EXECUTING)
    announcement = assigned(settings)
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    # when its outcome is recorded
    verdict = execution.complete(settings, run, {"scores": [1.0, float("nan")]})
    # then the task failed, saying where the NaN is
    assert isinstance(verdict.error, OutputValidationError)
    assert "result['scores'][1]: NaN is not JSON" in str(verdict.error)
    found = row(settings, announcement.task_id)
    assert found.state == lifecycle.FAILED and found.error == str(verdict.error)


def test_complete_with_valid_output_succeeds(settings: Settings) -> None:
    announcement = assigned(settings, output_schema={"type": "object", "required": ["x"]})
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    assert execution.complete(settings, run, {"x": 1}) == execution.Verdict()
    assert row(settings, announcement.task_id).state == lifecycle.SUCCESS


# --- fail, hard_timeout --------------------------------------------------------------------


def test_fail_without_retries_fails(settings: Settings) -> None:
    announcement = assigned(settings)
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    assert execution.fail(settings, run, ValueError("boom")) == execution.Verdict()
    found = row(settings, announcement.task_id)
    assert found.state == lifecycle.FAILED and found.error == "ValueError: boom"
    assert found.finished_at is not None
    assert log(settings, announcement.task_id)[1:] == [
        (journal.TASK_FAILED, NODE, 1, {"error": "ValueError: boom", "why": ""})
    ]
    assert ledger(settings, announcement.task_id) == [(1, NODE, 1.0, 0.5, 0.5)]
    [ep] = episodes(settings, announcement.task_id)
    assert ep.success is False and ep.error == "ValueError: boom"


def test_fail_with_retries_left_retries(settings: Settings) -> None:
    announcement = assigned(settings, retry_policy=RetryPolicy(max_retries=2, base_ms=1000))
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    verdict = execution.fail(settings, run, ValueError("boom"), random.Random(1))
    assert verdict.retry_in == 1.0 and verdict.error is None
    found = row(settings, announcement.task_id)
    assert (found.state, found.attempt, found.assigned_node, found.error) == (
        lifecycle.RETRYING,
        2,
        None,
        "ValueError: boom",
    )
    nxt = Announcement.model_validate(found.spec)
    assert (nxt.attempt, nxt.failures, nxt.spent, nxt.exclude_nodes) == (2, 1, 0.5, [NODE])
    assert found.due_at == times(settings, announcement.task_id)[-1] + 1.0
    assert log(settings, announcement.task_id)[1:] == [
        (journal.TASK_FAILED, NODE, 1, {"error": "ValueError: boom", "will_retry": True}),
        (
            journal.RETRYING,
            NODE,
            2,
            {
                "delay_s": 1.0,
                "why": "retry 1 of 2",
                "next_attempt": 2,
                "error": "ValueError: boom",
            },
        ),
    ]


def test_fail_over_budget_fails_with_cost_exceeded(settings: Settings) -> None:
    announcement = assigned(settings, budget=0.1, retry_policy=RetryPolicy(max_retries=2))
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    verdict = execution.fail(settings, run, ValueError("boom"))
    assert isinstance(verdict.error, CostExceededError)
    assert row(settings, announcement.task_id).state == lifecycle.FAILED
    assert log(settings, announcement.task_id)[-1] == (
        journal.COST_EXCEEDED,
        NODE,
        1,
        {"error": "ValueError: boom", "why": "spent 0.5000 of budget 0.1000"},
    )


def test_retry_requested_moves_to_retrying(settings: Settings) -> None:
    announcement = assigned(settings)
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    assert execution.retry_requested(settings, run, 2.0)
    found = row(settings, announcement.task_id)
    assert (found.state, found.attempt, found.error) == (lifecycle.RETRYING, 2, None)
    assert log(settings, announcement.task_id)[-1] == (
        journal.RETRYING,
        NODE,
        2,
        {"delay_s": 2.0, "why": "the task called self.retry()", "next_attempt": 2},
    )


def test_hard_timeout_fails_an_executing_task(settings: Settings) -> None:
    announcement = assigned(settings)
    execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    assert execution.hard_timeout(settings, announcement.task_id, "TimeLimitExceeded")
    assert row(settings, announcement.task_id).state == lifecycle.FAILED
    assert log(settings, announcement.task_id)[-1] == (
        journal.TASK_FAILED,
        NODE,
        1,
        {"error": "TimeLimitExceeded", "why": "hard time limit"},
    )
    assert not execution.hard_timeout(settings, announcement.task_id, "TimeLimitExceeded")
    assert episodes(settings, announcement.task_id)[0].success is False


def test_a_nodes_record_counts_each_attempt_once(settings: Settings) -> None:
    # given a registered node
    heartbeat(settings, NodeProfile(name=NODE, capabilities=["s1"], capacity=2))
    # when it completes one attempt twice (a redelivery), fails another, and times out a third
    ok = assigned(settings)
    run = execution.begin(settings, ok.task_id, 1, NODE, PRICE)
    execution.complete(settings, run, None)
    execution.complete(settings, run, None)
    bad = assigned(settings)
    execution.fail(
        settings, execution.begin(settings, bad.task_id, 1, NODE, PRICE), ValueError("no")
    )
    slow = assigned(settings)
    execution.begin(settings, slow.task_id, 1, NODE, PRICE)
    execution.hard_timeout(settings, slow.task_id, "TimeLimitExceeded")
    # then the registry lists it with 3 attempts, 1 of them a success
    [node] = query_live_nodes(settings)
    assert (node.name, node.attempts, node.successes) == (NODE, 3, 1)


def test_progress_is_recorded(settings: Settings) -> None:
    announcement = assigned(settings)
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    info = execution.report_progress(settings, run, 1, 4, "quarter")
    assert row(settings, announcement.task_id).progress == info and info["percent"] == 25.0
    assert log(settings, announcement.task_id)[-1] == (
        journal.PROGRESS_UPDATE,
        NODE,
        1,
        {"current": 1, "total": 4, "percent": 25.0, "note": "quarter"},
    )


# --- transition and journal ----------------------------------------------------------------


def test_transition_refuses_sources_it_does_not_allow(settings: Settings) -> None:
    with write_session(settings.database_url) as session, pytest.raises(ValueError):
        transition(
            session,
            "x",
            lifecycle.SUCCESS,
            Log(journal.TASK_SUCCEEDED),
            Expect(states=(lifecycle.EXECUTING,)),
        )


def test_transition_sets_json_values_and_updates_loaded_rows(settings: Settings) -> None:
    announcement = assigned(settings)
    with write_session(settings.database_url) as session:
        loaded = session.get(AnnouncementRow, announcement.task_id)
        assert loaded is not None
        assert transition(
            session,
            announcement.task_id,
            lifecycle.RETRYING,
            Log(journal.RETRYING, detail={"a": [1]}, at=5.0),
            Expect(attempt=1, node=NODE),
            attempt=2,
            spec={"k": [1, "x"]},
            assigned_node=None,
        )
        assert (loaded.state, loaded.attempt, loaded.spec) == (
            lifecycle.RETRYING,
            2,
            {"k": [1, "x"]},
        )
    found = row(settings, announcement.task_id)
    assert (found.state, found.attempt, found.spec, found.assigned_node) == (
        lifecycle.RETRYING,
        2,
        {"k": [1, "x"]},
        None,
    )
    assert log(settings, announcement.task_id) == [(journal.RETRYING, NODE, 2, {"a": [1]})]
    assert times(settings, announcement.task_id) == [5.0]


def test_transition_sees_rows_added_in_the_same_session(settings: Settings) -> None:
    with write_session(settings.database_url) as session:
        session.add(
            AnnouncementRow(
                task_id="t1",
                task_name="t",
                task_type="t",
                strategy="w",
                spec={},
                state=lifecycle.DEFERRED,
                announced_at=1.0,
                closes_at=2.0,
            )
        )
        assert transition(
            session,
            "t1",
            lifecycle.ESCALATED,
            Log(journal.ESCALATED),
            Expect(states=(lifecycle.DEFERRED,)),
            error="why",
        )
    assert row(settings, "t1").state == lifecycle.ESCALATED
    assert log(settings, "t1") == [(journal.ESCALATED, None, 1, {})]


def test_journal_record_defaults(settings: Settings) -> None:
    with write_session(settings.database_url) as session:
        journal.record(session, "t2", journal.SCHEDULED, delay_s=1.5)
        journal.record(session, "t2", journal.BID, node="n", attempt=3, at=7.0)
    assert log(settings, "t2") == [
        (journal.SCHEDULED, None, 1, {"delay_s": 1.5}),
        (journal.BID, "n", 3, {}),
    ]
    assert times(settings, "t2")[0] > 1e9 and times(settings, "t2")[1] == 7.0
