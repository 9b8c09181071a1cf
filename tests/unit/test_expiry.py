"""A task's expiry: ``expires`` read at the call (as Celery takes it), one start-by time with
the deadline, the sweepers' end of expired waiting tasks, and the node's last check (which
blames no node). Stores on SQLite and PostgreSQL; a Celery app with an in-memory backend."""

from __future__ import annotations

import math
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select

from bidding import clock
from bidding.auction import expiry
from bidding.config import Settings
from bidding.context import Context
from bidding.errors import ConfigurationError, DeadlinePassedError, TaskExpiredError
from bidding.execution import attempt as execution
from bidding.execution.timing import expiry_time, past_deadline
from bidding.lifecycle import states
from bidding.models import OPTION_KEYS, Announcement
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow, Episode, LedgerEntry
from tests.stored import add_announcement
from tests.unit.test_announce import build
from tests.unit.test_execution import assigned, log

NOW = 1_800_000_000.0


# --- expires, as the call gives it ---------------------------------------------------------


def test_expires_takes_seconds_a_datetime_or_an_iso_string_as_celery_does() -> None:
    # given the store's time of a call, and the caller's own clock 5 s behind it
    wall = NOW - 5.0
    # then seconds count from the call; a datetime is the caller's time, turned into a delay
    assert expiry_time(2, NOW) == NOW + 2.0
    assert expiry_time(0.5, NOW) == NOW + 0.5
    aware = datetime.fromtimestamp(wall + 3.0, UTC)
    assert expiry_time(aware, NOW, wall) == pytest.approx(NOW + 3.0)
    # a naive datetime is UTC (Celery's default), an ISO string is read as that datetime
    naive = aware.replace(tzinfo=None)
    assert expiry_time(naive, NOW, wall) == pytest.approx(NOW + 3.0)
    assert expiry_time(aware.isoformat().replace("+00:00", "Z"), NOW, wall) == pytest.approx(
        NOW + 3.0)
    other_zone = aware.astimezone(datetime.now().astimezone().tzinfo)
    assert expiry_time(other_zone.isoformat(), NOW, wall) == pytest.approx(NOW + 3.0)
    # and a datetime in the past expires the task at once (it is not refused)
    assert expiry_time(aware - timedelta(seconds=10), NOW, wall) == pytest.approx(NOW - 7.0)
    assert expiry_time(None, NOW) is None


@pytest.mark.parametrize(("value", "says"), [
    (-1, "which is negative"),
    (math.nan, "which is not a time"),
    (math.inf, "which is not a time"),
    ("tomorrow", "which is not ISO-8601"),
    (True, "got True"),
    ([1], "got a list"),
    ({"seconds": 1}, "got a dict"),
])
def test_a_bad_expires_is_refused_at_the_call_naming_it(value: Any, says: str) -> None:
    # when a call gives a bad expires, as a bidding option
    with pytest.raises(ConfigurationError) as err:
        build(options={"expires": value})
    # then the error names the task, the option and what is wrong
    assert str(err.value).startswith("bidding options of demo.tasks.extract: expires: expected")
    assert says in str(err.value)


def test_expires_is_an_option_and_kept_as_an_absolute_time_of_the_call() -> None:
    assert "expires" in OPTION_KEYS
    # when a call expires in 30 s
    before = clock.now()
    announcement = build(options={"expires": 30})
    # then its expiry is 30 s after the call's time, and it is its start-by time
    assert announcement.expires_at == pytest.approx(announcement.announced_at + 30)
    assert before <= announcement.announced_at <= clock.now()
    assert announcement.start_by == announcement.expires_at
    # and it survives the store's JSON, as a retry's spec is read back
    again = Announcement.model_validate(announcement.model_dump(mode="json"))
    assert again.expires_at == announcement.expires_at


def test_deadline_and_expiry_are_one_limit_the_earlier_wins() -> None:
    # given a task with a deadline and an expiry
    early_expiry = Announcement(task_id="a", task_name="t", task_type="t",
                                deadline=NOW + 10, expires_at=NOW + 5)
    early_deadline = early_expiry.model_copy(update={"deadline": NOW + 1})
    # then the earlier is the task's start-by time, and it has expired from then on
    assert early_expiry.start_by == NOW + 5 and early_deadline.start_by == NOW + 1
    assert not early_expiry.expired(NOW + 4.9) and early_expiry.expired(NOW + 5)
    assert Announcement(task_id="b", task_name="t", task_type="t").start_by is None


def test_the_expired_error_is_still_a_deadline_passed_error() -> None:
    # code that caught the deadline's error catches an expiry too: one meaning
    assert issubclass(TaskExpiredError, DeadlinePassedError)


# --- the sweepers end expired waiting tasks ------------------------------------------------


@pytest.fixture
def app() -> Celery:
    return Celery("t", broker="memory://", backend="cache+memory://", set_as_current=False)


def waiting(settings: Settings, state: str, **fields: Any) -> Announcement:
    """A task in ``state`` that has not started (due later, when it waits for a time)."""
    announcement = Announcement(task_id=str(uuid.uuid4()), task_name="t.noop", task_type="noop",
                                **fields)
    extra: dict[str, Any] = {}
    if state in states.DUE_STATES:
        extra["due_at"] = clock.now() + 60
    if state == states.ASSIGNED:
        extra.update(assigned_node="north", awarded_at=announcement.announced_at)
    return add_announcement(settings.database_url, announcement, state, ["north"], **extra)


def row(settings: Settings, task_id: str) -> AnnouncementRow:
    with read_session(settings.database_url) as session:
        found = session.get(AnnouncementRow, task_id)
        assert found is not None
        session.expunge(found)
        return found


@pytest.mark.parametrize("state", [states.PENDING, states.RETRYING, states.DEFERRED,
                                   states.BIDDING, states.ASSIGNED])
def test_a_waiting_task_whose_expiry_passed_is_ended_and_its_caller_told(
    settings: Settings, app: Celery, state: str,
) -> None:
    # given a task waiting in ``state`` (due in a minute) that expired a moment ago, and one
    # that expires in a minute
    now = clock.now()
    gone = waiting(settings, state, expires_at=now - 0.1)
    later = waiting(settings, state, expires_at=now + 60)
    # when the sweepers' expiry scan runs
    ended = expiry.end_expired(Context(settings, app), now)
    # then the expired one is FAILED, never announced again, logged EXPIRED with the reason
    assert ended == 1
    stored = row(settings, gone.task_id)
    assert stored.state == states.FAILED and stored.due_at is None
    assert stored.error is not None and stored.error.startswith("expired: not started by its "
                                                                "expiry")
    assert expiry.WAITING[state] in stored.error
    kinds = [kind for kind, *_ in log(settings, gone.task_id)]
    assert kinds[-1] == "EXPIRED"
    # and its caller's .get() raises an error that says it expired
    with pytest.raises(TaskExpiredError, match="expired: not started by its expiry"):
        app.AsyncResult(gone.task_id).get(timeout=1, propagate=True)
    # while the other one still waits
    assert row(settings, later.task_id).state == state


def test_a_waiting_task_past_its_deadline_is_ended_the_same_way(
    settings: Settings, app: Celery,
) -> None:
    # given a deferred task whose deadline (not an expiry) passed
    gone = waiting(settings, states.DEFERRED, deadline=clock.now() - 1)
    # when the scan runs, then it ends expired, naming the deadline
    assert expiry.end_expired(Context(settings, app)) == 1
    assert row(settings, gone.task_id).error.startswith("expired: not started by its deadline")


def test_a_started_task_never_expires(settings: Settings, app: Celery) -> None:
    # given a task that started before its expiry, still running after it
    task = assigned(settings, expires_at=clock.now() + 0.05)
    execution.begin(settings, task.task_id, 1, "n1")
    time.sleep(0.1)
    # when the scan runs, then it keeps running
    assert expiry.end_expired(Context(settings, app)) == 0
    assert row(settings, task.task_id).state == states.EXECUTING


# --- the node's last line ------------------------------------------------------------------


def test_an_execution_that_reaches_its_node_after_the_expiry_ends_without_blaming_the_node(
    settings: Settings,
) -> None:
    # given a task awarded to n1 whose expiry passed while its message waited in n1's queue
    task = assigned(settings, expires_at=clock.now() - 0.5)
    run = execution.begin(settings, task.task_id, 1, "n1")
    # when the node checks it before the body
    late = past_deadline(run)
    assert isinstance(late, TaskExpiredError)
    assert "expired: not started by its expiry" in str(late) and "waited for n1" in str(late)
    assert execution.expired(settings, run, late)
    # then it is FAILED, logged EXPIRED, and neither an episode nor a charge is recorded
    stored = row(settings, task.task_id)
    assert stored.state == states.FAILED and stored.error == str(late)
    assert [kind for kind, *_ in log(settings, task.task_id)][-1] == "EXPIRED"
    with read_session(settings.database_url) as session:
        assert session.scalars(select(Episode).where(Episode.task_id == task.task_id)).all() == []
        assert session.scalars(
            select(LedgerEntry).where(LedgerEntry.task_id == task.task_id)).all() == []
    # and a second check (another copy of the message) changes nothing
    assert not execution.expired(settings, run, late)


def test_an_execution_before_the_expiry_runs(settings: Settings) -> None:
    task = assigned(settings, expires_at=clock.now() + 60)
    assert past_deadline(execution.begin(settings, task.task_id, 1, "n1")) is None


def test_the_node_runs_no_body_of_a_task_whose_expiry_passed_in_its_queue(
    settings: Settings, tmp_path: Any,
) -> None:
    from bidding.execution.dispatch import ATTEMPT_HEADER, NODE_HEADER
    from tests.unit.test_execution import NODE
    from tests.unit.test_landed_commits import node_app

    # given a node's task, and an execution of it that reached the node after its expiry
    app = node_app(settings.database_url, tmp_path / "n1.toml")
    task = app.tasks["t.noop"]
    announcement = assigned(settings, expires_at=clock.now() - 0.2)
    ran: list[Any] = []
    task.run = lambda outcome: ran.append(outcome)
    task.push_request(id=announcement.task_id, called_directly=False, delivery_info={},
                      headers={ATTEMPT_HEADER: 1, NODE_HEADER: NODE}, hostname=None)
    try:
        # when the node's worker runs it
        with pytest.raises(TaskExpiredError, match="expired: not started by its expiry"):
            task("value")
    finally:
        task.pop_request()
    # then the body never ran; the task is FAILED, accepted then EXPIRED, and the node's
    # record is untouched (no episode)
    assert ran == []
    assert row(settings, announcement.task_id).state == states.FAILED
    assert [kind for kind, *_ in log(settings, announcement.task_id)][-2:] == [
        "TASK_ACCEPTED", "EXPIRED"]
    with read_session(settings.database_url) as session:
        assert session.scalars(
            select(Episode).where(Episode.task_id == announcement.task_id)).all() == []


def test_a_graphs_deadline_makes_its_subtask_expire_and_the_graph_fails_saying_why(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from bidding.graphs import store as rows
    from bidding.graphs.advance import advance
    from bidding.graphs.submit import submit
    from bidding.nodes.heartbeat import heartbeat
    from bidding.nodes.profile import NodeProfile
    from bidding.nodes.registry import invalidate_cache
    from tests.unit.test_graph_announce import SINGLE, caller_app

    for name in [k for k in os.environ if k.startswith("BIDDING_")]:
        monkeypatch.delenv(name)
    # given a live node that extracts text, but never starts anything (no worker)
    heartbeat(settings, NodeProfile(name="n1", capabilities=["pdf_text_extraction"]))
    invalidate_cache()
    app = caller_app(settings, "proxy")
    # when a task graph whose deadline is 0.3 s away is submitted: its subtask is awarded
    handle = submit({**SINGLE, "metadata": {"deadline": clock.now() + 0.3}}, app=app)
    (step,) = handle.progress().steps
    task_id = step.task_id
    assert task_id is not None and row(settings, task_id).state == states.ASSIGNED
    # and its deadline passes before the subtask starts
    time.sleep(0.4)
    assert expiry.end_expired(Context(settings, app)) == 1
    advance(Context(settings, app), handle.id)
    # then the subtask never starts, and the graph is FAILED saying why
    assert row(settings, task_id).state == states.FAILED
    assert handle.status() == rows.FAILED
    progress = handle.progress()
    assert progress.error is not None
    assert "expired: not started by its deadline" in progress.error
