"""Retention, on SQLite and PostgreSQL: a prune deletes the finished tasks older than its
cutoff with everything recorded about them, never a task that is not final, and keeps what
the nodes learned; one node at a time runs it on a schedule."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from sqlalchemy import func, select, text, update

from bidding import clock
from bidding.auction.history import gather_history
from bidding.config import Settings
from bidding.execution import attempt as execution
from bidding.lifecycle import jobs, retention
from bidding.lifecycle import states as lifecycle
from bidding.lifecycle.retention import (
    JOB,
    RetentionJob,
    parse_duration,
    prune,
    prune_every,
)
from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.profile import NodeProfile
from bidding.observe.stats import collect, window_start
from bidding.store import read_session, write_session
from bidding.store.forkguard import guard
from bidding.store.schema import (
    AnnouncementRow,
    BidRow,
    Episode,
    Graph,
    GraphStep,
    LedgerEntry,
    Message,
    Worker,
)
from tests.unit.test_execution import assigned

DAY = 86_400.0


def finished(settings: Settings, *, node: str = "n1", task_type: str = "noop",
             success: bool = True, days_ago: float = 40.0) -> str:
    """A task that ran on ``node`` and ended (SUCCESS, or FAILED by its body), its records
    dated ``days_ago``: its row, messages, ledger entry, episode, and a bid."""
    announcement = assigned(settings, node=node)
    with write_session(settings.database_url) as session:
        session.execute(
            update(AnnouncementRow)
            .where(AnnouncementRow.task_id == announcement.task_id)
            .values(
                task_type=task_type,
                spec={**announcement.model_dump(mode="json"), "task_type": task_type},
            )
        )
        session.add(
            BidRow(
                task_id=announcement.task_id,
                attempt=1,
                node=node,
                will_bid=True,
                capability=1.0,
                experience=0.5,
                load=1.0,
                confidence=0.5,
                cost=0.0,
                latency_ms=1.0,
                trust=70.0,
                bid_at=clock.now(),
            )
        )
    run = execution.begin(settings, announcement.task_id, 1, node, 0.5)
    if success:
        execution.complete(settings, run, {"ok": True})
    else:
        execution.fail(settings, run, ValueError("boom"))
    at = clock.now() - days_ago * DAY
    with write_session(settings.database_url) as session:
        session.execute(
            update(AnnouncementRow)
            .where(AnnouncementRow.task_id == announcement.task_id)
            .values(finished_at=at, announced_at=at, report_due=None)
        )
        session.execute(
            update(Message).where(Message.task_id == announcement.task_id).values(at=at)
        )
        session.execute(
            update(Episode).where(Episode.task_id == announcement.task_id).values(finished_at=at)
        )
        session.execute(
            update(LedgerEntry).where(LedgerEntry.task_id == announcement.task_id).values(at=at)
        )
    return announcement.task_id


def rows_of(settings: Settings, task_id: str) -> dict[str, int]:
    """How many rows of each kind the store keeps of ``task_id``."""
    with read_session(settings.database_url) as session:
        return {
            name: int(
                session.scalar(
                    select(func.count()).select_from(table).where(table.task_id == task_id)
                )
                or 0
            )
            for name, table in (
                ("task", AnnouncementRow),
                ("bids", BidRow),
                ("messages", Message),
                ("ledger", LedgerEntry),
                ("episodes", Episode),
            )
        }


def state_of(settings: Settings, task_id: str) -> str | None:
    with read_session(settings.database_url) as session:
        row = session.get(AnnouncementRow, task_id)
        return None if row is None else row.state


def test_a_prune_deletes_old_finished_tasks_with_their_records_and_nothing_else(
    settings: Settings,
) -> None:
    # given a task that finished 40 days ago, one that finished yesterday, one still running
    # since 40 days ago, and one 40 days old whose outcome has not reached the result backend
    old = finished(settings, days_ago=40)
    recent = finished(settings, days_ago=1)
    running = assigned(settings).task_id
    with write_session(settings.database_url) as session:
        session.execute(
            update(AnnouncementRow)
            .where(AnnouncementRow.task_id == running)
            .values(announced_at=clock.now() - 40 * DAY)
        )
    unreported = finished(settings, days_ago=40)
    with write_session(settings.database_url) as session:
        session.execute(
            update(AnnouncementRow)
            .where(AnnouncementRow.task_id == unreported)
            .values(report_due=clock.now())
        )
    before = rows_of(settings, old)
    assert before["task"] == before["bids"] == before["ledger"] == 1 and before["messages"] > 2
    # when the store is pruned of what finished more than 30 days ago
    pruned = prune(settings, 30 * DAY)
    # then the old task is gone with its bids, messages and ledger entry, counted
    assert {k: v for k, v in rows_of(settings, old).items() if k != "episodes"} == {
        "task": 0,
        "bids": 0,
        "messages": 0,
        "ledger": 0,
    }
    assert (pruned.tasks, pruned.bids, pruned.messages, pruned.ledger_entries) == (
        1,
        1,
        before["messages"],
        1,
    )
    # and the recent, the running and the unreported tasks are all still there
    assert state_of(settings, recent) == lifecycle.SUCCESS
    assert state_of(settings, running) == lifecycle.ASSIGNED
    assert state_of(settings, unreported) == lifecycle.SUCCESS


def test_a_node_that_kept_failing_a_task_type_still_bids_low_for_it_after_a_prune(
    settings: Settings,
) -> None:
    # given a node that failed a task type two more times than its bids read, and one that
    # did it as often, all of it finished 40 days ago
    for name in ("flaky", "steady"):
        heartbeat(
            settings,
            NodeProfile(
                name=name,
                capabilities=["ocr"],
                capacity=2,
                price_per_unit=0.0,
                latency_ms=1,
                trust=70,
            ),
        )
    runs = settings.episodes_read + 2
    for _ in range(runs):
        finished(settings, node="flaky", task_type="ocr", success=False)
        finished(settings, node="steady", task_type="ocr", success=True)
    before = {n: gather_history(settings, n, "ocr") for n in ("flaky", "steady")}
    assert before["flaky"].outcomes == (False,) * settings.experience_window
    assert len(before["flaky"].earlier) == settings.episodes_read - settings.experience_window
    # when everything finished is pruned (the shortest retention there is)
    pruned = prune(settings, 0)
    # then every task is gone, the episodes beyond those the bids read with them
    assert pruned.tasks == 2 * runs
    assert pruned.episodes == 2 * (runs - settings.episodes_read)
    # and each node's latest outcomes and record survive: the failing node still bids low
    after = {n: gather_history(settings, n, "ocr") for n in ("flaky", "steady")}
    assert after == before
    assert (after["flaky"].attempts, after["flaky"].successes) == (runs, 0)
    assert (after["steady"].attempts, after["steady"].successes) == (runs, runs)


def test_recent_failures_survive_a_prune_of_everything(settings: Settings) -> None:
    # given a node whose failures of a task type are within the last hour (the x0.8 penalty)
    for _ in range(3):
        finished(settings, node="flaky", task_type="ocr", success=False, days_ago=0.01)
    # when everything finished is pruned
    prune(settings, 0)
    # then they still count as recent failures
    assert gather_history(settings, "flaky", "ocr").recent_failures == 3


def test_a_dry_run_counts_what_a_prune_would_delete_and_deletes_nothing(
    settings: Settings,
) -> None:
    # given two tasks that finished 40 days ago
    tasks = [finished(settings), finished(settings)]
    # when a dry run counts them
    counted = prune(settings, 30 * DAY, dry_run=True)
    # then it counts what the prune then deletes, and deleted nothing meanwhile
    assert all(state_of(settings, t) == lifecycle.SUCCESS for t in tasks)
    assert counted == prune(settings, 30 * DAY)
    assert counted.tasks == 2 and counted.bids == 2 and counted.ledger_entries == 2


def test_a_finished_graph_goes_with_its_steps_and_a_running_ones_steps_stay(
    settings: Settings,
) -> None:
    # given a graph that completed 40 days ago and one still running, each with a step task
    # that finished 40 days ago
    now = clock.now()
    steps: dict[str, str] = {}
    with write_session(settings.database_url) as session:
        for graph_id, state in (("done", "COMPLETED"), ("busy", "EXECUTING")):
            task_id = finished(settings)
            steps[graph_id] = task_id
            session.add(
                Graph(
                    graph_id=graph_id,
                    name=graph_id,
                    state=state,
                    created_at=now - 41 * DAY,
                    touched_at=now - 40 * DAY,
                    finished_at=now - 40 * DAY if state == "COMPLETED" else None,
                )
            )
            session.add(
                GraphStep(
                    graph_id=graph_id,
                    step_id="a",
                    capability="x",
                    task_name="t.noop",
                    task_id=task_id,
                    state="SUCCESS",
                )
            )
    # when the store is pruned
    pruned = prune(settings, 30 * DAY)
    # then the finished graph and its step's task are gone; the running graph keeps its step
    assert (pruned.graphs, pruned.graph_steps) == (1, 1)
    assert state_of(settings, steps["done"]) is None
    assert state_of(settings, steps["busy"]) == lifecycle.SUCCESS
    with read_session(settings.database_url) as session:
        assert [g.graph_id for g in session.scalars(select(Graph))] == ["busy"]


def test_ended_worker_rows_go_with_the_retention(settings: Settings) -> None:
    # given a worker that ended 40 days ago and one online now
    now = clock.now()
    with write_session(settings.database_url) as session:
        for name, status, seen in (("old@h", "ended", now - 40 * DAY), ("new@h", "online", now)):
            session.add(
                Worker(
                    hostname=name,
                    node="n1",
                    boot_id=uuid.uuid4().hex[:16],
                    pid=1,
                    started_at=seen,
                    last_heartbeat=seen,
                    status=status,
                )
            )
    # when the store is pruned, then only the ended one is gone
    assert prune(settings, 30 * DAY).workers == 1
    with read_session(settings.database_url) as session:
        assert [w.hostname for w in session.scalars(select(Worker))] == ["new@h"]


def test_one_node_at_a_time_runs_the_retention_job(settings: Settings) -> None:
    # given three nodes' retention loops, a short retention, and a task older than it
    short = settings.model_copy(update={"retention_days": 1.0})
    task = finished(short, days_ago=2)
    loops = [RetentionJob(short, f"n{i}@host") for i in range(3)]
    # when each looks, one after another
    results = [loop.run() for loop in loops]
    # then exactly one of them pruned (the task with it), and the job is due a tenth of the
    # retention later, saying who ran it and what it did
    ran = [r for r in results if r is not None]
    assert len(ran) == 1 and ran[0].tasks == 1 and state_of(short, task) is None
    due = jobs.due_at(short.database_url, JOB)
    assert due is not None and abs(due - clock.now() - prune_every(short)) < 5  # type: ignore[operator]
    # and when it is due again, the first node that looks runs it
    with write_session(short.database_url) as session:
        from bidding.store.schema import Job

        session.execute(update(Job).values(due_at=clock.now() - 1))
    loops[2]._due = 0.0
    assert loops[2].run() is not None


def test_retention_zero_keeps_everything(settings: Settings) -> None:
    # given retention off, and a task that finished long ago
    off = settings.model_copy(update={"retention_days": 0})
    task = finished(off, days_ago=400)
    # when a node's retention loop looks, then nothing is pruned
    assert RetentionJob(off, "n1@host").run() is None
    assert state_of(off, task) == lifecycle.SUCCESS


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30d", 30 * DAY),
        ("12h", 43_200.0),
        ("15m", 900.0),
        ("0s", 0.0),
        ("2w", 14 * DAY),
        ("90", 90.0),
        ("1.5h", 5400.0),
    ],
)
def test_durations_read_as_a_number_and_a_unit(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "d", "-1d", "thirty days", "nan", "infh", "3y"])
def test_a_duration_that_is_none_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError, match="write a number of s, m, h, d or w"):
        parse_duration(text)


def test_stats_read_the_last_day_unless_told_otherwise(settings: Settings) -> None:
    # given a task announced 40 days ago and one half a day ago
    finished(settings, days_ago=40)
    finished(settings, days_ago=0.5)
    # when stats are read without a window, then only the last day's task counts
    assert collect(settings.database_url, window_start(None)).announced == 1
    # and with since=0, every task in the store
    assert collect(settings.database_url, window_start(0.0)).announced == 2


# Only on PostgreSQL: SQLite reuses a deleted page without a VACUUM.
@pytest.mark.parametrize("settings", ["postgresql"], indirect=True)
def test_on_postgresql_a_prune_vacuums_what_it_deleted_from(settings: Settings) -> None:
    # given old finished tasks in a store whose tables were never vacuumed since
    for _ in range(3):
        finished(settings)
    since = time.time()
    # when a prune deletes them
    assert retention.prune(settings, 30 * DAY).tasks == 3
    # then the tables it deleted from were vacuumed after it (their space is used again,
    # whether or not the server runs autovacuum), and the others were not
    def vacuumed() -> set[str]:
        with read_session(settings.database_url) as session:
            return {name for name, at in session.execute(text(
                "SELECT relname, last_vacuum FROM pg_stat_user_tables")) if at is not None
                and at.timestamp() >= since - 1}

    deadline = time.monotonic() + 10
    while not {"bidding_announcements", "bidding_messages", "bidding_bids",
               "bidding_ledger"} <= vacuumed() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert {"bidding_announcements", "bidding_messages", "bidding_bids",
            "bidding_ledger"} <= vacuumed()
    assert "bidding_graphs" not in vacuumed()


def test_a_prune_whose_connection_drops_mid_batch_still_prunes_everything_once(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given two old finished tasks, and a store whose connection drops in the middle of the
    # prune's first batch (a failover, a PgBouncer restart)
    from sqlalchemy.exc import OperationalError

    from bidding.lifecycle import tallies
    from bidding.store import outage

    tasks = [finished(settings), finished(settings)]
    real = tallies.carry
    calls: list[int] = []

    def dropped(session: Any, ids: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("INSERT", {}, Exception("server closed the connection"))
        real(session, ids)

    monkeypatch.setattr(tallies, "carry", dropped)
    monkeypatch.setattr(outage, "FIRST_PAUSE", 0.01)
    if settings.database_url.startswith("sqlite"):
        # (SQLite has no connection to drop: its errors are raised as they are)
        with pytest.raises(OperationalError):
            retention.prune(settings, 30 * DAY)
        return
    # when the retention prunes what finished more than 30 days ago
    pruned = retention.prune(settings, 30 * DAY)
    # then the batch was tried again: both tasks are gone with their records, counted once
    assert len(calls) == 2
    assert all(state_of(settings, task) is None for task in tasks)
    assert all(sum(n for kind, n in rows_of(settings, task).items() if kind != "episodes") == 0
               for task in tasks)
    assert pruned.tasks == 2 and pruned.bids == 2


@pytest.mark.parametrize("settings", ["postgresql"], indirect=True)
def test_a_prunes_vacuum_takes_its_connection_inside_the_fork_guard_and_runs_outside(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # given old finished tasks, and a store engine that notes, at each step of the VACUUM's
    # connection, whether this thread is inside the fork guard
    for _ in range(2):
        finished(settings)
    seen: list[tuple[str, bool]] = []
    real = retention.get_engine(settings.database_url)

    class Noted:
        def __init__(self, conn: Any) -> None:
            self.conn = conn

        def execution_options(self, **options: Any) -> Noted:
            self.conn = self.conn.execution_options(**options)
            return self

        def exec_driver_sql(self, statement: str) -> Any:
            seen.append((statement.split()[0], guard._depth() > 0))
            return self.conn.exec_driver_sql(statement)

        def close(self) -> None:
            seen.append(("close", guard._depth() > 0))
            self.conn.close()

    class Engine:
        def connect(self) -> Noted:
            seen.append(("connect", guard._depth() > 0))
            return Noted(real.connect())

    def engine_of(url: str) -> Engine:
        seen.append(("engine", guard._depth() > 0))
        return Engine()

    monkeypatch.setattr(retention, "get_engine", engine_of)
    # when a prune deletes them
    assert retention.prune(settings, 30 * DAY).tasks == 2
    # then the connection was taken and given back inside the guard (no pool process is
    # forked while this thread holds the pool's lock), and the engine fetched and the VACUUM
    # run outside it (the engine may take the store clock's lock; a long VACUUM does not hold
    # up a fork)
    assert seen == [("engine", False), ("connect", True), ("VACUUM", False), ("close", True)]


@pytest.mark.parametrize("settings", ["postgresql"], indirect=True)
def test_a_vacuum_that_fails_gives_its_connection_back_inside_the_fork_guard(
        settings: Settings, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    # given old finished tasks, and a store whose VACUUM fails (a statement timeout, a
    # dropped connection)
    finished(settings)
    seen: list[tuple[str, bool]] = []

    class Failing:
        def execution_options(self, **options: Any) -> Failing:
            return self

        def exec_driver_sql(self, statement: str) -> Any:
            raise OSError("server closed the connection unexpectedly")

        def close(self) -> None:
            seen.append(("close", guard._depth() > 0))

    class Engine:
        def connect(self) -> Failing:
            return Failing()

    monkeypatch.setattr(retention, "get_engine", lambda url: Engine())
    # when a prune deletes them
    with caplog.at_level("WARNING", logger="bidding.lifecycle.retention"):
        assert retention.prune(settings, 30 * DAY).tasks == 1
    # then the prune's deletions stand, the connection was given back inside the guard, and
    # the log says the VACUUM failed and why
    assert seen == [("close", True)]
    assert "VACUUM" in caplog.text and "server closed the connection" in caplog.text
