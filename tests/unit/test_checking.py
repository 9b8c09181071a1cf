"""The watch against a store (SQLite and PostgreSQL, no broker): due checks claimed once by
concurrent checkers, escalation (journal, signal, log), news from the node's own bookkeeping,
``bidding.reset`` and the ``bidding monitor`` / ``reset`` / ``status`` commands."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select, update

import bidding
from bidding.cli import main
from bidding.config import Settings
from bidding.errors import UnknownTaskError
from bidding.execution import attempt as execution
from bidding.nodes import incarnation
from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.profile import NodeProfile
from bidding.observe import checking
from bidding.observe.status import task_status
from bidding.signals import task_escalated
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow, Message
from tests.unit.test_execution import NODE, assigned, row

#: A compressed policy: checks 1, 2, 4 s apart, escalated at the check after the second.
FAST = {"initial_check_wait_time": 1.0, "check_backoff_factor": 2.0,
        "max_check_wait_time": 4.0, "max_check_attempts": 2}


@pytest.fixture
def fast(settings: Settings) -> Settings:
    """The store's settings with the compressed policy."""
    return settings.model_copy(update=FAST)


def node_alive(settings: Settings, running: list[str], now: float) -> None:
    """Node NODE heartbeats at ``now`` through one worker whose pool runs ``running``."""
    heartbeat(settings, NodeProfile(name=NODE, capabilities=["s1", "s2"]), now=now)
    me = incarnation.Incarnation(hostname=f"{NODE}@host", node=NODE, boot_id="b1", pid=1,
                                 started_at=now)
    incarnation.register(settings, me, now=now)
    assert incarnation.beat(settings, me, now=now, running=running)


def delegated(settings: Settings, at: float | None = None) -> tuple[str, float]:
    """A task ASSIGNED to NODE, awarded at ``at`` (default: now); its id and award time."""
    announcement = assigned(settings)
    if at is not None:
        with write_session(settings.database_url) as session:
            session.execute(update(AnnouncementRow).where(
                AnnouncementRow.task_id == announcement.task_id).values(awarded_at=at))
    awarded = row(settings, announcement.task_id).awarded_at
    assert awarded is not None
    return announcement.task_id, awarded


def watched(settings: Settings, task_id: str, **values: Any) -> None:
    """Set a task's checking state as a watch would have left it."""
    with write_session(settings.database_url) as session:
        session.execute(update(AnnouncementRow).where(AnnouncementRow.task_id == task_id)
                        .values(**values))


def kinds(settings: Settings, task_id: str, kind: str) -> list[dict[str, Any]]:
    with read_session(settings.database_url) as session:
        return list(session.scalars(select(Message.detail).where(
            Message.task_id == task_id, Message.kind == kind).order_by(Message.id)))


def test_two_checkers_looking_at_once_do_one_check(fast: Settings) -> None:
    # given a task delegated to a live node that does not run it, its first check due
    task_id, t0 = delegated(fast)
    node_alive(fast, [], t0)
    # when two node workers' monitors both read it due, one writes, then the other
    due = t0 + 1.5
    first, _ = checking.plan(fast, due)
    second, _ = checking.plan(fast, due)
    assert [c.task_id for c in first] == [c.task_id for c in second] == [task_id]
    assert len(checking.claim(fast, second, due)) == 1
    assert checking.claim(fast, first, due) == []
    # then the task was checked once: one attempt, the next check 2 s later
    found = row(fast, task_id)
    assert (found.check_attempts, found.next_check_time) == (1, due + 2.0)


def test_two_checkers_escalate_a_silent_task_once(
    fast: Settings, caplog: pytest.LogCaptureFixture,
) -> None:
    # given a task whose node stopped heartbeating after the award, checked twice already
    task_id, t0 = delegated(fast)
    node_alive(fast, [task_id], t0)
    for now in (t0 + 1.0, t0 + 3.0):
        assert checking.check_due(fast, now).written == 1
    assert row(fast, task_id).check_attempts == 2
    # when the third check comes due and two checkers look at once, and then a third
    due = t0 + 7.0
    first, _ = checking.plan(fast, due)
    second, _ = checking.plan(fast, due)
    checking.claim(fast, first, due)
    checking.claim(fast, second, due)
    assert checking.check_due(fast, due).escalated == []
    # then it was escalated once, saying why and what the node said
    reason = "silent after 2 checks (node n1 silent for 7.0s)"
    assert [(d["reason"], d["check_attempts"]) for d in
            kinds(fast, task_id, "WATCH_ESCALATED")] == [(reason, 2)]
    found = row(fast, task_id)
    assert found.escalation == reason and found.escalated_at == due
    assert found.state == "ASSIGNED"  # a flag: the task itself goes on


def test_an_escalation_is_signalled_and_logged(
    fast: Settings, caplog: pytest.LogCaptureFixture,
) -> None:
    # given a task whose node never heartbeated, past its last allowed check
    task_id, t0 = delegated(fast)
    watched(fast, task_id, check_attempts=2, next_check_time=t0 + 7, check_since=t0)
    heard: list[dict[str, Any]] = []

    def receiver(sender: Any = None, signal: Any = None, **kw: Any) -> None:
        heard.append({"sender": sender, **kw})

    task_escalated.connect(receiver, weak=False)
    try:
        # when a pass finds it due
        done = checking.check_due(fast, t0 + 7)
    finally:
        task_escalated.disconnect(receiver)
    # then the signal's receivers, the log and the pass's result say so
    reason = "silent after 2 checks (node n1 never heartbeated)"
    assert [e.task_id for e in done.escalated] == [task_id]
    assert heard == [{"sender": "task_escalated", "task_id": task_id, "reason": reason,
                      "watch": True, "node": NODE, "attempt": 1, "check_attempts": 2}]
    assert f"task {task_id} escalated: {reason} (attempt 1 on node n1" in caplog.text


def test_the_nodes_own_bookkeeping_is_the_news_that_clears_the_checks(fast: Settings) -> None:
    # given a task delegated 10 s ago and checked twice without news since
    now = time.time()
    task_id, t0 = delegated(fast, now - 10)
    node_alive(fast, [task_id], now)
    checking.check_due(fast, t0 + 1.0)
    checking.check_due(fast, t0 + 3.0)
    assert row(fast, task_id).check_attempts == 2
    # when the node accepts it and reports progress (as BiddingTask does on the node)
    run = execution.begin(fast, task_id, 1, NODE)
    # (the report's own timestamp: a stall after it, a GC pause in a long test run, must not
    # move the pass below past the first check)
    reported = execution.report_progress(fast, run, 1, 4, "a quarter")["at"]
    # then status shows no checks without news before any checker has written a thing
    watch = task_status(fast.database_url, task_id).watch
    assert watch is not None and watch.check_attempts == 0 and not watch.escalated
    # and the next pass (its check was due) schedules the first check from the report
    checking.check_due(fast, reported + 0.5)
    found = row(fast, task_id)
    assert found.check_attempts == 0 and found.escalated_at is None
    assert found.next_check_time == pytest.approx(reported + 1.0, abs=0.5)


def test_reset_clears_the_checking_state_and_puts_the_task_back_under_watch(
    fast: Settings,
) -> None:
    # given an escalated task, delegated 10 s ago
    task_id, t0 = delegated(fast, time.time() - 10)
    watched(fast, task_id, check_attempts=2, next_check_time=t0 + 100, check_since=t0,
            escalated_at=t0 + 7, escalation="silent after 2 checks (x)")
    # when it is reset
    before = time.time()
    outcome = bidding.reset(task_id, database_url=fast.database_url)
    # then its checks and escalation are cleared, logged as RESET with what was cleared
    assert outcome.watched and outcome.cleared_escalation == "silent after 2 checks (x)"
    found = row(fast, task_id)
    assert (found.check_attempts, found.next_check_time, found.escalated_at,
            found.escalation) == (0, None, None, None)
    assert kinds(fast, task_id, "RESET") == [
        {"check_attempts": 2, "escalation": "silent after 2 checks (x)"}]
    # and the watch checks it again, the first check 1 s after the reset
    checking.check_due(fast, before + 0.5)
    assert row(fast, task_id).next_check_time == pytest.approx(before + 1.0, abs=0.5)
    checking.check_due(fast, before + 5.0)
    assert row(fast, task_id).check_attempts == 1


def test_reset_of_an_unknown_task_names_the_store(settings: Settings) -> None:
    with pytest.raises(UnknownTaskError, match="no such announcement in the store"):
        bidding.reset("nope", database_url=settings.database_url)


def test_the_commands_monitor_reset_and_status(
    store_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a task past its last allowed check, due now (the policy from the environment)
    settings = Settings(database_url=store_url, auto_migrate=False, **FAST)
    for key, value in FAST.items():
        monkeypatch.setenv(f"BIDDING_{key.upper()}", str(value))
    task_id, t0 = delegated(settings, time.time() - 10)
    watched(settings, task_id, check_attempts=2, next_check_time=t0 + 7, check_since=t0)
    runner = CliRunner()
    # when `bidding monitor --once` runs
    done = runner.invoke(main, ["monitor", "--database-url", store_url, "--once"])
    # then it escalated the task, and `bidding status` shows it on the state line and in JSON
    assert done.exit_code == 0, done.output
    assert "1 escalated" in done.output
    text = runner.invoke(main, ["status", task_id, "--database-url", store_url]).output
    assert "state: ASSIGNED, escalated: silent after 2 checks (node n1 never heartbeated)" in text
    shown = json.loads(runner.invoke(
        main, ["status", task_id, "--database-url", store_url, "--json"]).output)
    assert shown["state"] == "ASSIGNED" and shown["watch"]["escalated"] is True
    explained = runner.invoke(main, ["explain", task_id, "--database-url", store_url]).output
    assert "watch: escalated: silent after 2 checks" in explained
    # when `bidding reset` runs
    reset = runner.invoke(main, ["reset", task_id, "--database-url", store_url])
    # then it says what it cleared, and status shows no escalation any more
    assert reset.exit_code == 0, reset.output
    assert "checking state cleared (was 2 check(s) without news, escalated: silent" in (
        reset.output)
    assert "back under watch (ASSIGNED on n1)" in reset.output
    shown = json.loads(runner.invoke(
        main, ["status", task_id, "--database-url", store_url, "--json"]).output)
    assert shown["watch"] == {"check_attempts": 0, "next_check_time": None, "escalated": False,
                              "escalated_at": None, "reason": None}
    # and an unknown task id is a one-line error naming the store, exit code 1
    unknown = runner.invoke(main, ["reset", "nope", "--database-url", store_url])
    assert unknown.exit_code == 1
    assert f"task nope: no such announcement in the store {store_url}" in unknown.output


def test_each_heartbeat_says_which_tasks_the_workers_pool_runs(settings: Settings) -> None:
    # given a worker whose pool has accepted a task (Celery's bookkeeping in its main process)
    from celery.worker import state as worker_state

    from bidding.execution.active import running_tasks
    from bidding.nodes.heartbeat import Heartbeat
    from bidding.store.schema import Worker

    class Request:
        id = "t-running"

    accepted = Request()
    me = incarnation.Incarnation(hostname=f"{NODE}@host", node=NODE, boot_id="b2", pid=1,
                                 started_at=time.time())
    incarnation.register(settings, me)
    beat = Heartbeat(settings, NodeProfile(name=NODE, capabilities=["s1"]), me,
                     running=running_tasks)
    worker_state.active_requests.add(accepted)
    try:
        # when it beats
        beat._beat()
    finally:
        worker_state.active_requests.discard(accepted)
    # then its row lists the task, and the next beat, once it finished, no longer does
    def listed() -> list[str] | None:
        with read_session(settings.database_url) as session:
            found = session.get(Worker, me.hostname)
            assert found is not None
            return found.running

    assert listed() == ["t-running"]
    beat._beat()
    assert listed() == []


def test_a_task_is_checked_on_the_schedule_of_the_node_it_is_delegated_to(
    fast: Settings,
) -> None:
    # given a node whose profile says: escalate after one check (globally: two)
    from bidding.nodes.profile import CheckingProfile

    heartbeat(fast, NodeProfile(name=NODE, capabilities=["s1", "s2"],
                                checking=CheckingProfile(max_check_attempts=1)))
    task_id, t0 = delegated(fast)
    # when its first check finds no news, and the next one comes due
    checking.check_due(fast, t0 + 1.0)
    done = checking.check_due(fast, t0 + 3.0)
    # then that second look escalates it, after one check
    assert [(e.task_id, e.reason.split(" (")[0]) for e in done.escalated] == [
        (task_id, "silent after 1 check")]


def test_a_move_to_another_node_starts_its_watch_afresh(fast: Settings) -> None:
    from bidding.lifecycle import journal, states
    from bidding.lifecycle.transition import Log, transition

    # given a task escalated by the watch while on NODE, its next check half an hour away
    task_id, t0 = delegated(fast)
    watched(fast, task_id, check_attempts=10, check_since=t0, next_check_time=t0 + 1800,
            escalated_at=t0 + 9000, escalation="silent after 10 checks")
    # when a watchdog moves it to the next-best bidder
    with write_session(fast.database_url) as session:
        assert transition(session, task_id, states.ASSIGNED, Log(journal.REAWARDED),
                          assigned_node="other", awarded_at=t0 + 9001)
    # then its checking state is that of a new delegation: no checks, no escalation, and the
    # next pass considers it as soon as its first wait has gone by
    moved = row(fast, task_id)
    assert (moved.check_attempts, moved.next_check_time, moved.escalated_at,
            moved.escalation) == (0, None, None, None)
    watch = task_status(fast.database_url, task_id).watch
    assert watch is None or not watch.escalated


# --- review item e: a huge backoff factor, a task the watch cannot check ---------------------


def test_a_node_row_with_a_huge_backoff_factor_has_its_tasks_checked_at_the_longest_wait(
    fast: Settings,
) -> None:
    # given a node whose row says: multiply each wait by 1e40, escalate after 20 checks (a
    # version without bounds on a profile's [checking] table registered it)
    from bidding.store.schema import Node

    heartbeat(fast, NodeProfile(name=NODE, capabilities=["s1", "s2"]))
    with write_session(fast.database_url) as session:
        session.execute(update(Node).where(Node.name == NODE).values(
            checking={"check_backoff_factor": 1e40, "max_check_attempts": 20}))
    # and a task delegated to it, checked seven times, its eighth check due
    task_id, t0 = delegated(fast)
    watched(fast, task_id, check_attempts=7, next_check_time=t0 + 10, check_since=t0)
    # when a pass finds it due (1e40 ** 8 overflows a float)
    done = checking.check_due(fast, t0 + 10)
    # then it is checked, its next check the longest wait later
    assert done.written == 1
    found = row(fast, task_id)
    assert (found.check_attempts, found.next_check_time) == (8, t0 + 10 + 4.0)


def test_a_task_the_watch_cannot_check_is_parked_and_every_other_task_is_still_checked(
    fast: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    # given two delegated tasks due for their first check: the first in the due list is one
    # the watch raises on (whatever the reason: here its node's answer cannot be computed)
    bad, t0 = delegated(fast, time.time() - 60)
    good, _ = delegated(fast, t0 + 1)
    node_alive(fast, [], t0)
    original = checking.report

    def report(task_id: str, *args: Any, **kwargs: Any) -> Any:
        if task_id == bad:
            raise ValueError("a row this version cannot read")
        return original(task_id, *args, **kwargs)

    monkeypatch.setattr(checking, "report", report)
    # when the watch passes over them
    done = checking.check_due(fast, t0 + 10)
    # then the other task is checked all the same
    assert done.written == 1
    assert row(fast, good).check_attempts == 1
    # when the bad one keeps raising, pass after pass
    for later in (t0 + 11, t0 + 12, t0 + 13, t0 + 14):
        checking.check_due(fast, later)
    # then it is parked with its reason after three passes, and no longer read
    assert row(fast, bad).parked == "watch: ValueError: a row this version cannot read"
    # and it was logged twice: its first failure (with its traceback), its parking
    lines = [r for r in caplog.records if bad in r.getMessage()]
    assert [r.levelname for r in lines] == ["WARNING", "ERROR"], [r.getMessage() for r in lines]
    assert lines[0].exc_info is not None and lines[1].exc_info is None
    # and the other task's checks went on
    assert row(fast, good).check_attempts >= 2


def test_a_node_row_whose_checking_policy_cannot_be_read_has_its_tasks_checked_globally(
    fast: Settings, caplog: pytest.LogCaptureFixture,
) -> None:
    # given a node whose row holds a [checking] table this version cannot read, and another
    # node's task due for its first check
    from bidding.store.schema import Node

    heartbeat(fast, NodeProfile(name="odd", capabilities=["s1"]))
    with write_session(fast.database_url) as session:
        session.execute(update(Node).where(Node.name == "odd").values(
            checking={"max_check_attempts": "many"}))
    task_id, t0 = delegated(fast)
    # when the watch passes, twice
    done = checking.check_due(fast, t0 + 1.5)
    checking.check_due(fast, t0 + 1.6)
    # then the task is checked all the same (the odd node's tasks get the global policy)
    assert done.written == 1 and row(fast, task_id).check_attempts == 1
    # and the odd node's policy is named in the log, once
    assert caplog.text.count("node odd: its [checking] policy cannot be read") == 1
