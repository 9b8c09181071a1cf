#!/usr/bin/env python
"""Micro-benchmark of the winning node's store bookkeeping: ``execution.begin`` and
``execution.complete`` (the success path), per call, without Celery or a broker.

    .venv/bin/python bench/bookkeeping.py [--tasks 500] [--db postgresql://127.0.0.1:5432/test]
                                          [--budget 10] [--profile FILE]

A fresh store (a SQLite file in a temp dir, WAL; or, with ``--db``, a new PostgreSQL database
``bidding_bk_<hex>`` created on that server and dropped at the end) gets ``--tasks``
announcements in state ASSIGNED, as ``announce`` and the award leave them (with their
ANNOUNCED, BID and AWARDED messages). Then, task after task, as a worker does: ``begin`` and
``complete``. For each it reports the wall time (median, p99), the CPU time of this process
(median, via ``time.process_time``) and the SQL statements sent through SQLAlchemy
(``before_cursor_execute``: SQLite's BEGIN IMMEDIATE and the COMMITs are not among them).
``--profile FILE`` writes a cProfile of the timed loop.
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

BENCH_DIR = Path(__file__).absolute().parent
# Running as a script puts bench/ first on sys.path; its modules must not shadow the stdlib, and
# the bench package is imported from the repository root. (Here, not in bench.common: this is
# what makes bench.common importable.)
sys.path[:] = [p for p in sys.path if Path(p or ".").absolute() != BENCH_DIR]
if str(BENCH_DIR.parent) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR.parent))

from sqlalchemy import event, text  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from bench.common.markdown import padded_rule, row  # noqa: E402
from bench.common.postgres import scratch_database  # noqa: E402
from bench.common.stats import percentile  # noqa: E402
from bidding.config import Settings  # noqa: E402
from bidding.execution import attempt as execution  # noqa: E402
from bidding.lifecycle import journal  # noqa: E402
from bidding.lifecycle import states as lifecycle  # noqa: E402
from bidding.models import Announcement  # noqa: E402
from bidding.store import dispose_all, get_engine, upgrade, write_session  # noqa: E402
from bidding.store.schema import AnnouncementRow  # noqa: E402

NODE = "node-a"
PRICE = 0.5
T = TypeVar("T")
#: The report's header; the cells are padded to the width of the numbers under them.
HEADER = ("call    ", "wall p50 ms", "p99 ms ", "CPU p50", "CPU avg", "statements")


def make_announcement(i: int, budget: float | None) -> Announcement:
    """A typical announcement, as ``build_announcement`` makes it."""
    return Announcement(
        task_id=str(uuid.uuid4()), task_name="bench.app.noop", task_type="noop",
        content=f'[[{i}], {{}}]', args=[i], kwargs={}, required_skills=["bench"],
        strategy="weighted", window=2.0, budget=budget,
    )


def seed(url: str, tasks: int, budget: float | None) -> list[str]:
    """``tasks`` announcements in state ASSIGNED to NODE (the rows announce + award write)."""
    ids: list[str] = []
    with write_session(url) as session:
        for i in range(tasks):
            announcement = make_announcement(i, budget)
            now = time.time()
            # bidding.auction.opening.row_values, then the award's transition to ASSIGNED.
            session.add(
                AnnouncementRow(
                    task_id=announcement.task_id,
                    task_name=announcement.task_name,
                    task_type=announcement.task_type,
                    content=announcement.content,
                    required_skills=announcement.required_skills,
                    preferred_node=announcement.preferred_node,
                    priority=announcement.priority,
                    deadline=announcement.deadline,
                    budget=announcement.budget,
                    strategy=announcement.strategy,
                    spec=announcement.model_dump(mode="json"),
                    state=lifecycle.ASSIGNED,
                    attempt=announcement.attempt,
                    candidates=[NODE],
                    expected_bids=1,
                    bids_received=1,
                    announced_at=announcement.announced_at,
                    closes_at=announcement.announced_at + announcement.window,
                    due_at=None,
                    assigned_node=NODE,
                    awarded_at=now,
                    winning_score=0.8,
                    outcome="awarded",
                    closed_by="all bids in",
                )
            )
            journal.record(
                session,
                announcement.task_id,
                journal.ANNOUNCED,
                attempt=1,
                at=announcement.announced_at,
                task_type=announcement.task_type,
                candidates=[NODE],
                required_skills=announcement.required_skills,
            )
            journal.record(
                session, announcement.task_id, journal.BID, node=NODE, attempt=1, at=now
            )
            journal.record(
                session,
                announcement.task_id,
                journal.AWARDED,
                node=NODE,
                attempt=1,
                at=now,
                outcome="awarded",
                strategy="weighted",
                score=0.8,
                closed_by="all bids in",
                latency_ms=1.0,
            )
            ids.append(announcement.task_id)
    return ids


class Meter:
    """Wall time, CPU time and SQL statements of one kind of call."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.statements: list[int] = []

    def time(self, counter: list[int], call: Callable[[], T]) -> T:
        """Run ``call`` and keep its wall time, CPU time and statements (``counter``'s rise)."""
        before = counter[0]
        cpu = time.process_time()
        wall = time.perf_counter()
        out = call()
        self.wall.append(time.perf_counter() - wall)
        self.cpu.append(time.process_time() - cpu)
        self.statements.append(counter[0] - before)
        return out

    def row(self, name: str) -> str:
        """The report's row of this kind of call (milliseconds)."""
        p99 = percentile(self.wall, 99) or 0.0
        cpu = self.cpu
        return row(
            [
                f"{name:<8}",
                f"{statistics.median(self.wall) * 1e3:11.3f}",
                f"{p99 * 1e3:7.3f}",
                f"{statistics.median(cpu) * 1e3:7.3f}",
                f"{statistics.mean(cpu) * 1e3:7.3f}",
                f"{statistics.mean(self.statements):10.2f}",
            ]
        )


def run(url: str, tasks: int, budget: float | None, profile: str | None) -> None:
    """Seed ``tasks`` tasks, time begin and complete of each, check the store, print."""
    upgrade(url)
    settings = Settings(database_url=url, auto_migrate=False)
    ids = seed(url, tasks, budget)
    counter = [0]

    def count(*_: Any) -> None:
        counter[0] += 1

    event.listen(get_engine(url), "before_cursor_execute", count)
    # Warm up (connection pool, statement caches) on tasks that are not measured.
    warm = seed(url, 20, budget)
    for task_id in warm:
        execution.complete(settings, execution.begin(settings, task_id, 1, NODE, PRICE), None)
    began, completed = Meter(), Meter()
    profiler = cProfile.Profile()
    if profile:
        profiler.enable()
    for task_id in ids:
        started = began.time(counter, partial(execution.begin, settings, task_id, 1, NODE, PRICE))
        assert started.start is execution.Start.FIRST, started.start
        verdict = completed.time(
            counter, partial(execution.complete, settings, started, {"ok": 1})
        )
        assert verdict.error is None and verdict.retry_in is None, verdict
    if profile:
        profiler.disable()
        profiler.dump_stats(profile)
    with write_session(url) as session:
        states = session.execute(
            text("SELECT state, count(*) FROM bidding_announcements GROUP BY state")
        ).all()
    assert dict((s, int(n)) for s, n in states) == {lifecycle.SUCCESS: tasks + len(warm)}, states
    backend = make_url(url).get_backend_name()
    print(f"\n{backend}: {tasks} tasks, budget={budget}\n")
    print(row(HEADER))
    print(padded_rule(HEADER))
    print(began.row("begin"))
    print(completed.row("complete"))


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and run on a fresh store."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--db", help="a PostgreSQL server URL (a new database is created there)")
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="give every task this budget (exercises the ledger sum)",
    )
    parser.add_argument("--profile", help="write a cProfile of the timed loop to this file")
    args = parser.parse_args(argv)
    try:
        if args.db:
            with scratch_database(args.db, "bidding_bk") as url:
                run(url, args.tasks, args.budget, args.profile)
        else:
            with tempfile.TemporaryDirectory(prefix="bidding-bk-") as tmp:
                run(f"sqlite:///{tmp}/store.db", args.tasks, args.budget, args.profile)
    finally:
        dispose_all()


if __name__ == "__main__":
    main()
