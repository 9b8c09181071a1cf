"""Retention: a finished task is kept ``bidding_retention_days``, then pruned with everything
recorded about it, while what the nodes learned from it stays.

A task is pruned when it is in a final state (SUCCESS, FAILED, ESCALATED) and finished before
the cutoff, its final state has reached the result backend (no ``report_due``), and it is no
step of a task graph still running. With it go its bids, messages and ledger entries; a
finished graph goes with its steps; ended worker rows with their last heartbeat. Never a task
that is not final.

What scoring reads survives: a node's record (attempts and successes, kept on its row), and
per node and task type the latest outcomes its bids read (three windows of
``bidding_experience_window``: the experience score, the confidence and its prior) and every
outcome within ``bidding_recent_failure_seconds`` (the x0.8 penalty). Only older episodes go,
so a node that kept failing a task type still bids low for it after a prune, however short
the retention.

Deletes run in bounded batches, one short transaction each, oldest first, so that the nodes'
own writes never wait long behind a prune (SQLite has one writer at a time).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, TypeVar, cast

from sqlalchemy import ColumnElement, CursorResult, and_, bindparam, delete, func, select
from sqlalchemy.orm import Session

from bidding import clock
from bidding.config import Settings
from bidding.lifecycle import jobs, states, tallies
from bidding.store import read_session, write_session
from bidding.store.engine import get_engine, is_sqlite
from bidding.store.forkguard import guard
from bidding.store.outage import outlasting
from bidding.store.schema import (
    AnnouncementRow,
    BidRow,
    Episode,
    Graph,
    GraphStep,
    LedgerEntry,
    Message,
    Tag,
    Worker,
)
from bidding.store.turns import quiet_turn

logger = logging.getLogger(__name__)

#: Rows of a kind deleted per transaction.
BATCH = 500
#: Seconds a prune pauses between two batches, so that waiting writers go first.
PAUSE = 0.005
#: Seconds one batch keeps trying while the store is unreachable. A batch is one transaction
#: that a dropped connection rolls back whole, so trying it again is safe; a prune that gave
#: up at the first dropped connection left the store growing until the next one (a soak that
#: severed every connection every 2 s kept every task of its run).
BATCH_PATIENCE = 30.0
#: A task graph's final states (``bidding.graphs.store``; the layer below graphs cannot
#: import it).
GRAPH_FINAL = ("COMPLETED", "FAILED")

SECONDS_PER_DAY = 86_400.0


@dataclass
class Pruned:
    """What a prune deleted (or, dry, would delete), by kind of row."""

    tasks: int = 0
    bids: int = 0
    tags: int = 0
    messages: int = 0
    ledger_entries: int = 0
    graphs: int = 0
    graph_steps: int = 0
    episodes: int = 0
    workers: int = 0

    def add(self, other: Pruned) -> None:
        """Count ``other``'s rows in too (a batch that committed)."""
        for kind, n in vars(other).items():
            setattr(self, kind, getattr(self, kind) + n)

    def as_dict(self) -> dict[str, int]:
        """The counts by kind, as JSON keeps them."""
        return asdict(self)

    def line(self) -> str:
        """One line for a person: ``12 tasks (30 bids, 80 messages, 12 ledger entries), ...``."""
        return (f"{self.tasks} task(s) ({self.bids} bid(s), {self.tags} tag(s), "
                f"{self.messages} message(s), "
                f"{self.ledger_entries} ledger entr{'y' if self.ledger_entries == 1 else 'ies'})"
                f", {self.graphs} task graph(s) ({self.graph_steps} step(s)), "
                f"{self.episodes} old episode(s), {self.workers} ended worker row(s)")


def retention_seconds(settings: Settings) -> float | None:
    """How long finished tasks are kept (None: for ever, ``bidding_retention_days = 0``)."""
    days = settings.retention_days
    return days * SECONDS_PER_DAY if days > 0 else None


def prune_every(settings: Settings) -> float | None:
    """Seconds between two prunes of the federation: a tenth of the retention, between 10 s
    and an hour (None: retention off). A month's retention prunes hourly; a short one, as in
    a soak, often enough that the store stays near its size."""
    keep = retention_seconds(settings)
    return None if keep is None else min(3600.0, max(10.0, keep / 10))


def _graph_running(task_id: Any) -> ColumnElement[bool]:
    return (select(GraphStep.task_id).join(Graph, Graph.graph_id == GraphStep.graph_id)
            .where(GraphStep.task_id == task_id, Graph.state.not_in(GRAPH_FINAL))
            .exists())


#: The tasks a prune may delete: final, finished before the cutoff, reported, no running
#: graph's step.
_PRUNABLE = and_(
    AnnouncementRow.state.in_(sorted(states.FINAL_STATES)),
    AnnouncementRow.finished_at < bindparam("cutoff"),
    AnnouncementRow.report_due.is_(None),
    ~_graph_running(AnnouncementRow.task_id),
)
#: Every task a prune with ``cutoff`` would delete (for a check from outside: the soak's).
PRUNABLE_TASKS = select(AnnouncementRow.task_id).where(_PRUNABLE)
_TASKS = (select(AnnouncementRow.task_id).where(_PRUNABLE)
          .order_by(AnnouncementRow.finished_at).limit(bindparam("batch")))
_GRAPHS = (select(Graph.graph_id)
           .where(Graph.state.in_(GRAPH_FINAL), Graph.finished_at < bindparam("cutoff"))
           .order_by(Graph.finished_at).limit(bindparam("batch")))
_ENDED_WORKERS = and_(Worker.status == "ended", Worker.last_heartbeat < bindparam("cutoff"))


def prune(settings: Settings, older_than: float, *, dry_run: bool = False,
          now: float | None = None, batch: int = BATCH) -> Pruned:
    """Delete every task that finished more than ``older_than`` seconds ago (see the module),
    in batches of ``batch``; ``dry_run``: count what would go, delete nothing."""
    if older_than < 0:
        raise ValueError(f"older_than must be 0 or more seconds (got {older_than:g})")
    now = clock.now() if now is None else now
    cutoff = now - older_than
    # An outcome scoring still reads (a recent failure) is kept even past the cutoff.
    episode_cutoff = min(cutoff, now - settings.recent_failure_seconds)
    if dry_run:
        return _count(settings, cutoff, episode_cutoff)
    url = settings.database_url
    pruned = Pruned()
    while _outlasting(url, "pruning tasks",
                      lambda: _prune_tasks(settings, cutoff, batch, pruned)):
        time.sleep(PAUSE)
    while _outlasting(url, "pruning task graphs",
                      lambda: _prune_graphs(settings, cutoff, batch, pruned)):
        time.sleep(PAUSE)
    pruned.episodes = _outlasting(url, "pruning episodes", lambda: _prune_episodes(
        settings, episode_cutoff, batch, dry_run=False))

    def ended_workers() -> int:
        with write_session(url) as session:
            return _deleted(session, delete(Worker).where(_ENDED_WORKERS), {"cutoff": cutoff})

    pruned.workers = _outlasting(url, "pruning ended workers", ended_workers)
    _vacuum(url, pruned)
    return pruned


T = TypeVar("T")


def _outlasting(url: str, what: str, step: Callable[[], T]) -> T:
    return outlasting(url, f"retention: {what}", step, patience=BATCH_PATIENCE)


#: Each kind of row a prune deletes, and its table.
_TABLES = {"tasks": AnnouncementRow, "bids": BidRow, "tags": Tag, "messages": Message,
           "ledger_entries": LedgerEntry, "graphs": Graph, "graph_steps": GraphStep,
           "episodes": Episode, "workers": Worker}


def _vacuum(url: str, pruned: Pruned) -> None:
    """On PostgreSQL, VACUUM the tables a prune deleted from, so that their space is used
    again at once. Autovacuum does it too where it runs, but a server with it off (or behind)
    grew by the deleted rows at every prune: 230 MiB in a 30-minute soak whose rows stayed
    under a thousand tasks. Plain VACUUM: it takes no lock that writers wait for. SQLite
    reuses a deleted page without it."""
    tables = sorted(_TABLES[kind].__tablename__ for kind, n in vars(pruned).items() if n)
    if not tables or is_sqlite(url):
        return
    try:
        # The connection is taken from the pool and given back inside the fork guard, as a
        # session's is (a pool process forked while this thread held the pool's lock would
        # wait on it for ever); the VACUUM itself runs outside, so that a long one does not
        # hold up the forks of new pool processes. The engine is fetched before the guard,
        # as the sessions fetch theirs (it may take the store clock's lock: never the guard,
        # then that lock).
        engine = get_engine(url)
        with guard.inside():
            conn = engine.connect()
        try:
            conn.execution_options(isolation_level="AUTOCOMMIT").exec_driver_sql(
                "VACUUM " + ", ".join(tables))  # our own table names, never a request's
        finally:
            with guard.inside():
                conn.close()
    except Exception as exc:  # the rows are gone; their space waits for the next prune
        logger.warning("retention: VACUUM %s failed (%s: %s)", ", ".join(tables),
                       type(exc).__name__, exc)


def _deleted(session: Session, statement: Any, params: dict[str, Any]) -> int:
    return int(cast(CursorResult[Any], session.execute(statement, params)).rowcount or 0)


def _prune_tasks(settings: Settings, cutoff: float, batch: int, pruned: Pruned) -> bool:
    """One batch of tasks, in one transaction, added to ``pruned`` once it commits; False
    when none was left."""
    got = Pruned()
    with write_session(settings.database_url) as session:
        chosen = _TASKS if is_sqlite(settings.database_url) else _TASKS.with_for_update(
            skip_locked=True)  # a task being reset meanwhile is left for the next prune
        ids = list(session.execute(chosen, {"cutoff": cutoff, "batch": batch}).scalars())
        if not ids:
            return False
        ids_of = {"ids": ids}
        # The counters read from the log must not go down with it (``lifecycle.tallies``).
        tallies.carry(session, ids)
        got.messages = _deleted(session, delete(Message).where(
            Message.task_id.in_(bindparam("ids", expanding=True))), ids_of)
        got.ledger_entries = _deleted(session, delete(LedgerEntry).where(
            LedgerEntry.task_id.in_(bindparam("ids", expanding=True))), ids_of)
        got.bids = _deleted(session, delete(BidRow).where(
            BidRow.task_id.in_(bindparam("ids", expanding=True))), ids_of)
        # Explicitly, as the bids: the foreign key's cascade needs SQLite's foreign_keys
        # pragma on every connection that deletes, and the count is reported.
        got.tags = _deleted(session, delete(Tag).where(
            Tag.task_id.in_(bindparam("ids", expanding=True))), ids_of)
        got.tasks = _deleted(session, delete(AnnouncementRow).where(
            AnnouncementRow.task_id.in_(bindparam("ids", expanding=True))), ids_of)
    pruned.add(got)
    return len(ids) == batch


def _prune_graphs(settings: Settings, cutoff: float, batch: int, pruned: Pruned) -> bool:
    """One batch of finished task graphs and their steps, added to ``pruned`` once it
    commits; False when none was left."""
    got = Pruned()
    with write_session(settings.database_url) as session:
        ids = list(session.execute(_GRAPHS, {"cutoff": cutoff, "batch": batch}).scalars())
        if not ids:
            return False
        ids_of = {"ids": ids}
        got.graph_steps = _deleted(session, delete(GraphStep).where(
            GraphStep.graph_id.in_(bindparam("ids", expanding=True))), ids_of)
        got.graphs = _deleted(session, delete(Graph).where(
            Graph.graph_id.in_(bindparam("ids", expanding=True))), ids_of)
    pruned.add(got)
    return len(ids) == batch


_GROUPS = (select(Episode.node, Episode.task_type).where(Episode.finished_at < bindparam("cutoff"))
           .group_by(Episode.node, Episode.task_type))
#: The ``keep``-th latest outcome of a node's task type (its bids read the latest ``keep``).
_KEPT_FROM = (select(Episode.finished_at)
              .where(Episode.node == bindparam("node"), Episode.task_type == bindparam("type"),
                     Episode.lost.is_(False))
              .order_by(Episode.finished_at.desc())
              .offset(bindparam("skip")).limit(1))


def _old_episodes(node: str, task_type: str, before: float) -> ColumnElement[bool]:
    return and_(Episode.node == node, Episode.task_type == task_type,
                Episode.finished_at < before)


def _prune_episodes(settings: Settings, cutoff: float, batch: int, *, dry_run: bool) -> int:
    """Delete (or count) the episodes scoring no longer reads: per node and task type, those
    finished before ``cutoff`` and older than the latest outcomes its bids read
    (``Settings.episodes_read``; an attempt lost with its worker is no outcome of the type: it
    goes with the cutoff)."""
    keep = settings.episodes_read
    total = 0
    with read_session(settings.database_url) as session:
        groups = session.execute(_GROUPS, {"cutoff": cutoff}).all()
    for node, task_type in groups:
        with read_session(settings.database_url) as session:
            kept_from = session.execute(_KEPT_FROM, {"node": node, "type": task_type,
                                                     "skip": keep - 1}).scalar()
        outcomes_old = Episode.lost.is_(True) if kept_from is None else \
            Episode.finished_at < kept_from
        old = and_(_old_episodes(node, task_type, cutoff), outcomes_old)
        if dry_run:
            with read_session(settings.database_url) as session:
                total += int(session.scalar(select(func.count()).where(old)) or 0)
            continue
        while True:
            with write_session(settings.database_url) as session:
                ids = select(Episode.id).where(old).limit(batch).scalar_subquery()
                gone = _deleted(session, delete(Episode).where(Episode.id.in_(ids)), {})
            total += gone
            if gone < batch:
                break
            time.sleep(PAUSE)
    return total


def _count(settings: Settings, cutoff: float, episode_cutoff: float) -> Pruned:
    """What a prune at ``cutoff`` would delete."""
    params = {"cutoff": cutoff}
    tasks = select(AnnouncementRow.task_id).where(_PRUNABLE).scalar_subquery()
    graphs = (select(Graph.graph_id)
              .where(Graph.state.in_(GRAPH_FINAL), Graph.finished_at < bindparam("cutoff"))
              .scalar_subquery())

    def count(table: Any, where: ColumnElement[bool]) -> int:
        with read_session(settings.database_url) as session:
            return int(session.scalar(
                select(func.count()).select_from(table).where(where), params) or 0)

    return Pruned(
        tasks=count(AnnouncementRow, _PRUNABLE),
        bids=count(BidRow, BidRow.task_id.in_(tasks)),
        tags=count(Tag, Tag.task_id.in_(tasks)),
        messages=count(Message, Message.task_id.in_(tasks)),
        ledger_entries=count(LedgerEntry, LedgerEntry.task_id.in_(tasks)),
        graphs=count(Graph, Graph.graph_id.in_(graphs)),
        graph_steps=count(GraphStep, GraphStep.graph_id.in_(graphs)),
        episodes=_prune_episodes(settings, episode_cutoff, BATCH, dry_run=True),
        workers=count(Worker, _ENDED_WORKERS),
    )


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": SECONDS_PER_DAY, "w": 7 * SECONDS_PER_DAY}


def parse_duration(text: str) -> float:
    """Seconds in a duration written as a number and a unit: ``30d``, ``12h``, ``15m``,
    ``0s`` (``w`` for weeks; a bare number is seconds). ValueError saying the form otherwise."""
    given = text.strip().lower()
    unit = given[-1:] if given[-1:] in _UNITS else "s"
    number = given[:-1] if given[-1:] in _UNITS else given
    try:
        value = float(number)
    except ValueError:
        value = float("nan")
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{text!r} is not a duration: write a number of s, m, h, d or w, "
                         "e.g. 30d, 12h, 15m or 0s")
    return value * _UNITS[unit]


#: The job's name in the store's jobs table.
JOB = "retention"
#: Longest seconds between two looks of a node at the job's due time.
LOOK_EVERY = 60.0


class RetentionJob:
    """A node worker's part in the retention job: it looks at the job's due time every
    ``LOOK_EVERY`` seconds (or the prune interval, if shorter) and, when this node claims it,
    prunes the tasks older than ``bidding_retention_days``."""

    def __init__(self, settings: Settings, by: str) -> None:
        self.settings = settings
        #: Who runs it, as the jobs table shows (the worker's Celery node name).
        self.by = by
        self._due = 0.0

    def interval(self) -> float:
        """Seconds until the next look."""
        every = prune_every(self.settings)
        return LOOK_EVERY if every is None else min(LOOK_EVERY, every)

    def run(self) -> Pruned | None:
        """Look, and prune if this node's turn (returns what it pruned)."""
        keep, every = retention_seconds(self.settings), prune_every(self.settings)
        if keep is None or every is None:
            return None
        url = self.settings.database_url
        now = clock.now()
        if now < self._due:
            return None
        # The look is an idle pass like the sweeper's: a read a minute, on this process's
        # turn at the store (``store.turns``), so that it does not open a second connection
        # beside the heartbeat's. The prune itself is work and runs at once.
        with quiet_turn():
            due = jobs.due_at(url, JOB)
        if due is not None and now < due:
            self._due = due
            return None
        if not jobs.claim(url, JOB, every, self.by, now):
            return None
        started = time.monotonic()
        pruned = prune(self.settings, keep, now=now)
        jobs.record(url, JOB, {**pruned.as_dict(), "cutoff": now - keep,
                               "seconds": round(time.monotonic() - started, 3)})
        if pruned.tasks or pruned.episodes or pruned.graphs or pruned.workers:
            logger.info("retention: pruned what finished before %gs ago: %s", keep,
                        pruned.line())
        return pruned
