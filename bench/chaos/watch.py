"""What the soak watches while it runs: each task's outcome in the store as soon as it is
final (a short retention prunes it soon after), each caller's outcome, the node workers'
memory and the store's size."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.chaos.verdict import Outcome
from bidding.nodes.federation import descendants

#: Seconds between two looks at the pending outcomes, and between two samples of memory
#: and size.
LOOK_EVERY = 1.0
SAMPLE_EVERY = 15.0
FINAL = ("SUCCESS", "FAILED", "ESCALATED")
#: The tables whose rows the soak counts (retention must bound them).
COUNTED = ("bidding_announcements", "bidding_messages", "bidding_bids", "bidding_episodes",
           "bidding_ledger")


def caller_outcome(result: Any, timeout: float) -> Outcome:
    """What the caller's ``.get()`` says (waiting up to ``timeout``)."""
    try:
        return Outcome("SUCCESS", value=result.get(timeout=timeout))
    except Exception as exc:
        name = type(exc).__name__
        return Outcome("TIMEOUT" if name == "TimeoutError" else "FAILED",
                       error=f"{name}: {exc}")


def store_outcomes(database_url: str, task_ids: list[str]) -> dict[str, Outcome]:
    """The final outcomes the store holds for ``task_ids`` (tasks not final left out)."""
    from sqlalchemy import select

    from bidding.store import read_session
    from bidding.store.schema import AnnouncementRow

    found: dict[str, Outcome] = {}
    with read_session(database_url) as session:
        for row in session.execute(
                select(AnnouncementRow.task_id, AnnouncementRow.state, AnnouncementRow.result,
                       AnnouncementRow.error)
                .where(AnnouncementRow.task_id.in_(task_ids), AnnouncementRow.state.in_(FINAL))):
            found[row.task_id] = (Outcome("SUCCESS", value=(row.result or {}).get("value"))
                                  if row.state == "SUCCESS"
                                  else Outcome(row.state, error=row.error or ""))
    return found


@dataclass
class OutcomeWatcher:
    """Collects every submitted task's outcome, at the store and at its caller, while the
    soak runs: a task a retention prunes later is judged on what the store said when it
    ended."""

    database_url: str
    store: dict[str, Outcome] = field(default_factory=dict)
    caller: dict[str, Outcome] = field(default_factory=dict)
    _results: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def add(self, task_id: str, result: Any) -> None:
        """Watch one accepted task."""
        with self._lock:
            self._results[task_id] = result

    def start(self) -> None:
        """Look every second, in a thread of its own."""
        self._thread = threading.Thread(target=self._run, name="soak-outcomes", daemon=True)
        self._thread.start()

    def _pending(self) -> tuple[list[str], list[tuple[str, Any]]]:
        with self._lock:
            return ([t for t in self._results if t not in self.store],
                    [(t, r) for t, r in self._results.items() if t not in self.caller])

    def look(self) -> None:
        """Record what has ended since the last look (a store or broker down: next time)."""
        in_store, at_caller = self._pending()
        for start in range(0, len(in_store), 500):
            with contextlib.suppress(Exception):
                self.store.update(store_outcomes(self.database_url,
                                                 in_store[start:start + 500]))
        for task_id, result in at_caller:
            with contextlib.suppress(Exception):
                if result.ready():
                    self.caller[task_id] = caller_outcome(result, 10.0)

    def _run(self) -> None:
        while not self._stop.wait(LOOK_EVERY):
            self.look()

    def finish(self, deadline: float) -> None:
        """Stop looking in the background; wait for what is left until ``deadline``."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        while time.time() < deadline:
            self.look()
            in_store, at_caller = self._pending()
            if not in_store and not at_caller:
                return
            time.sleep(LOOK_EVERY)
        for task_id, result in self._pending()[1]:
            self.caller[task_id] = caller_outcome(result, 0.1)


def _sqlite_files(database_url: str) -> list[Path]:
    """A SQLite store's file and its WAL, where they exist."""
    name = database_url.split("///", 1)[-1]
    return [p for p in (Path(name), Path(name + "-wal")) if p.exists()]


def rss_kb(pid: int) -> int:
    """Resident memory of ``pid`` and every process under it, in KiB (0 when gone)."""
    total = 0
    for member in [pid, *descendants(pid)]:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(f"/proc/{member}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


@dataclass
class Sample:
    """One look at the federation's memory and the store's size."""

    at: float
    #: (node, pid) -> KiB resident, the worker with its pool processes.
    rss: dict[tuple[str, int], int]
    #: table -> rows.
    rows: dict[str, int]


@dataclass
class Sampler:
    """Samples memory and store size every ``SAMPLE_EVERY`` seconds, in a thread."""

    database_url: str
    workers: Any  # () -> {node name: pid}
    every: float = SAMPLE_EVERY
    #: The nodes' retention in seconds (None: off). With it, each sample also counts, under
    #: ``"overdue"``, the tasks a prune could have deleted (``retention.PRUNABLE_TASKS``) for
    #: ``overdue_after`` seconds since a sample first saw them so, and that are still here.
    retention: float | None = None
    overdue_after: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    #: task id -> when a sample first saw it prunable.
    _prunable_since: dict[str, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        """Sample now and every ``every`` seconds until stopped."""
        self._thread = threading.Thread(target=self._run, name="soak-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Take a last sample and stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        self.sample()

    def _run(self) -> None:
        self.sample()
        while not self._stop.wait(self.every):
            self.sample()

    def sample(self) -> None:
        """One sample (a store that cannot be read now gives no row counts this time)."""
        rss = {(node, pid): rss_kb(pid) for node, pid in self.workers().items()}
        rows: dict[str, int] = {}
        with contextlib.suppress(Exception):
            from sqlalchemy import text

            from bidding.store import read_session
            with read_session(self.database_url) as session:
                rows = {t: int(session.execute(text(f"SELECT count(*) FROM {t}")).scalar_one())
                        for t in COUNTED}
                if self.retention is not None:
                    rows["overdue"] = self._overdue(session)
                # The store's size on disk (its tables and indexes), under a key of its own.
                rows["bytes"] = (int(session.execute(text(
                    "SELECT pg_database_size(current_database())")).scalar_one())
                    if session.get_bind().dialect.name == "postgresql"
                    else sum(f.stat().st_size for f in _sqlite_files(self.database_url)))
        self.samples.append(Sample(time.time(), rss, rows))

    def _overdue(self, session: Any) -> int:
        """How many tasks have stayed prunable ``overdue_after`` seconds since a sample first
        saw them so: a prune that fell behind. (Counted from when a task became prunable, not
        from its end: its final state's report to the result backend, which a killed
        sweeper's lease may hold up, comes first.)"""
        from bidding import clock
        from bidding.lifecycle.retention import PRUNABLE_TASKS

        assert self.retention is not None
        now = clock.now()
        found = set(session.scalars(PRUNABLE_TASKS, {"cutoff": now - self.retention}))
        since = {task: self._prunable_since.get(task, now) for task in found}
        self._prunable_since = since
        return sum(now - first >= self.overdue_after for first in since.values())

    def memory_growth(self, warm_up: float, lived: float
                      ) -> list[tuple[str, int, int, int, float]]:
        """Per worker process sampled for at least ``lived`` seconds after its own warm-up
        (``warm_up`` seconds after it was first seen: a worker killed and started again is a
        new process, warmed up anew): (node, pid, KiB then, KiB at its last sample, growth
        in %)."""
        seen: dict[tuple[str, int], list[tuple[float, int]]] = {}
        for sample in self.samples:
            for key, kb in sample.rss.items():
                if kb > 0:
                    seen.setdefault(key, []).append((sample.at, kb))
        grown = []
        for (node, pid), points in sorted(seen.items()):
            warm = [(at, kb) for at, kb in points if at >= points[0][0] + warm_up]
            if len(warm) >= 2 and warm[-1][0] - warm[0][0] >= lived:
                grown.append((node, pid, warm[0][1], warm[-1][1],
                              100.0 * (warm[-1][1] - warm[0][1]) / warm[0][1]))
        return grown

    def save(self, path: Path) -> None:
        """Every sample, one JSON line each (time, RSS in KiB by node and pid, row counts)."""
        with path.open("w") as out:
            for sample in self.samples:
                out.write(json.dumps({"at": sample.at, "rows": sample.rows, "rss": [
                    [node, pid, kb] for (node, pid), kb in sample.rss.items()]}) + "\n")

    def most_rows(self) -> dict[str, int]:
        """Each counted table's largest row count over the run."""
        most: dict[str, int] = {}
        for sample in self.samples:
            for table, n in sample.rows.items():
                most[table] = max(most.get(table, 0), n)
        return most
