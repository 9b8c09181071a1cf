"""A node's heartbeat: its row in the store, refreshed while its worker takes work.

The first beat writes the node's profile (producers bid for it and pick candidates from it);
later beats are one UPDATE. A worker that stops taking work (warm shutdown, a lost broker
connection) marks the node offline at once but keeps proving it is alive while its pool drains,
so watchdogs do not take its running tasks away. Each worker's beat also says which tasks its
pool is running: what a check of a delegated task asks the node (``bidding.observe.checking``).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, bindparam, func, select, update

from bidding import clock
from bidding.config import Settings
from bidding.nodes import incarnation
from bidding.nodes.periodic import Periodic
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import invalidate_cache
from bidding.store import statement_session, trim, write_session
from bidding.store.direct import execute
from bidding.store.engine import core, is_sqlite
from bidding.store.outage import outlasting
from bidding.store.schema import Job, Node, Worker
from bidding.store.turns import quiet_turn

logger = logging.getLogger(__name__)


def heartbeat(settings: Settings, profile: NodeProfile, *, hostname: str | None = None,
              started_at: float | None = None, now: float | None = None) -> None:
    """Record that ``profile``'s node is alive now (insert or refresh its row)."""
    now = clock.now() if now is None else now
    with write_session(settings.database_url) as session:
        row = session.get(Node, profile.name)
        if row is None:
            row = Node(name=profile.name, started_at=started_at or now)
            session.add(row)
        row.capabilities = list(profile.capabilities)
        row.capacity = profile.capacity
        row.price_per_unit = profile.price_per_unit
        row.latency_ms = profile.latency_ms
        row.trust = profile.trust
        row.description = profile.description
        row.checking = profile.checking.overrides()
        row.bidder = profile.bidder
        row.resources = dict(profile.resources) or None
        # A worker starting holds what its profile says warm, nothing its last run marked.
        row.warm = list(profile.warm) or None
        row.hostname = hostname or socket.gethostname()
        row.status = "online"
        if started_at is not None:
            row.started_at = started_at
        row.last_heartbeat = now
    invalidate_cache()


_NODES = cast(Table, Node.__table__)


# Core, not ORM: an ORM UPDATE first works out which loaded objects to refresh.
# Its parameters are named apart from every column of the two tables: an UPDATE takes a
# parameter named as one of its table's columns for that column's new value, and in the one
# statement below both UPDATEs are given all of them.
_BEAT = (update(_NODES).where(_NODES.c.name == bindparam("n_name"))
         .values(status="online", last_heartbeat=bindparam("n_now")))


#: The periodic beat on a server store, in one statement that commits on its own: ``WITH
#: node_beat AS (the node's UPDATE), worker_beat AS (the worker's UPDATE) SELECT`` how many rows
#: each moved. One round trip where a transaction took four (BEGIN, two UPDATEs, COMMIT), and
#: a quarter to a half less CPU per beat: at 16 idle nodes the beats were the largest share of
#: an idle federation's (bench/idle.py --threads; bench/RESULTS.md).
_NODE_BEAT = _BEAT.returning(_NODES.c.name).cte("node_beat")
_WORKER_BEAT = incarnation.BEAT.returning(incarnation.WORKERS.c.hostname).cte("worker_beat")
_BEAT_ALONE = select(select(func.count()).select_from(_NODE_BEAT).scalar_subquery(),
                     select(func.count()).select_from(_WORKER_BEAT).scalar_subquery())

_JOBS = cast(Table, Job.__table__)
#: A lease's row (a row of the jobs table, ``store.schema.Job``), read with the beat.
_LEASE = select(_JOBS.c.due_at, _JOBS.c.last_by).where(_JOBS.c.name == bindparam("j_name"))
#: The beat, and the lease's row, in the one statement.
_BEAT_AND_LEASE = _BEAT_ALONE.add_columns(
    _LEASE.with_only_columns(_JOBS.c.due_at).scalar_subquery(),
    _LEASE.with_only_columns(_JOBS.c.last_by).scalar_subquery())


@dataclass(frozen=True)
class LeaseSeen:
    """A lease's row as a beat read it: until when it runs and who holds it (both None: no
    row yet)."""

    until: float | None
    holder: str | None


def beat(settings: Settings, profile: NodeProfile, now: float | None = None, *,
         me: incarnation.Incarnation | None = None, running: Sequence[str] = (),
         lease: str | None = None) -> LeaseSeen | None:
    """The periodic heartbeat: one UPDATE of the node's row (the profile was written by
    ``heartbeat`` when the node started), and of worker ``me``'s row with the tasks its pool
    is ``running``, together (one statement on PostgreSQL, one transaction on SQLite); the
    full ``heartbeat`` when the node's row has gone.

    ``lease``: the name of a lease's row in the jobs table to read with the beat, in the same
    statement (``lifecycle.lease``); returned as seen (None when no lease was asked for). A
    node standing by for the sweeper lease then learns of its renewals, and of its holder
    giving it up, from its own beat instead of reading the lease on a loop of its own.

    64 idle nodes beating every 2 s are 32 write transactions a second on the store; each is
    one statement instead of a read and a rewrite of every column (bench/latency.py), and
    the worker's beat rides with it (as two transactions, they were a fifth of an idle
    federation's CPU: bench/RESULTS.md, per thread).
    """
    now = clock.now() if now is None else now
    node = {"n_name": profile.name, "n_now": now}
    seen: LeaseSeen | None = None
    if me is not None and not is_sqlite(settings.database_url):
        params = node | incarnation.beat_params(me, now=now, running=running)
        # On psycopg's cursor (``store.direct``): SQLAlchemy's execution was most of a beat's
        # CPU, and 16 idle nodes beat 8 times a second.
        with statement_session(settings.database_url) as session:
            if lease is None:
                found = execute(core(session), _BEAT_ALONE, params).one_or_none()
            else:
                found = execute(core(session), _BEAT_AND_LEASE,
                                params | {"j_name": lease}).one_or_none()
        assert found is not None  # (a SELECT of counts: always one row)
        moved, worker_moved = found[0], found[1]
        if lease is not None:
            seen = LeaseSeen(found[2], found[3])
        incarnation.beat_counted(me, worker_moved)
    else:
        # On SQLite's cursor too (``store.direct``): three statements in one transaction.
        with write_session(settings.database_url) as session:
            conn = core(session)
            moved = execute(conn, _BEAT, node).rowcount
            if me is not None:
                incarnation.beat_in(session, me, now=now, running=running)
            if lease is not None:
                row = execute(conn, _LEASE, {"j_name": lease}).one_or_none()
                seen = (LeaseSeen(row[0], row[1]) if row is not None
                        else LeaseSeen(None, None))
    if moved != 1:
        heartbeat(settings, profile, now=now)
    return seen


def touch(settings: Settings, name: str, now: float | None = None) -> None:
    """Refresh a node's heartbeat time only: it is alive, but not taking new work (draining)."""
    with write_session(settings.database_url) as session:
        session.execute(update(Node).where(Node.name == name)
                        .values(last_heartbeat=clock.now() if now is None else now))


def mark_offline(settings: Settings, name: str, now: float | None = None,
                 status: str = "offline") -> None:
    """Record a lost broker connection ("offline": it is coming back) or a clean shutdown
    ("stopped"): the node stops being a candidate at once, unless another of its workers is
    online (a node may run several)."""
    now = clock.now() if now is None else now
    others = (select(Worker.hostname)
              .where(Worker.node == name, Worker.status == "online",
                     Worker.last_heartbeat >= now - settings.heartbeat_ttl)
              .exists())
    with write_session(settings.database_url) as session:
        session.execute(update(Node).where(Node.name == name, ~others).values(status=status))
    invalidate_cache()


class Heartbeat:
    """Keeps one node's row, and this worker's (its incarnation), fresh while started;
    restartable.

    A worker's consumer restarts after a lost broker connection, and the node must not look
    alive while it cannot receive bid requests.
    """

    def __init__(self, settings: Settings, profile: NodeProfile,
                 me: incarnation.Incarnation | None = None,
                 running: Callable[[], Sequence[str]] | None = None,
                 lease: tuple[str, Callable[[LeaseSeen], None]] | None = None) -> None:
        self.settings = settings
        self.profile = profile
        self.me = me
        #: The ids of the tasks this worker's pool runs now (each beat carries them).
        self.running = running or tuple
        #: A lease's name, read with each periodic beat, and who is told what it showed.
        self.lease = lease
        self.started_at = me.started_at if me is not None else clock.now()
        self._registered = False
        self._loop = Periodic(f"bidding-heartbeat-{profile.name}", settings.heartbeat_interval,
                              self._beat)
        # After stop (a warm shutdown, or a lost broker connection) the pool may still be
        # finishing tasks: the node is offline for new work but not dead, and watchdogs must
        # not hand its running tasks to someone else.
        self._draining = Periodic(f"bidding-draining-{profile.name}",
                                  settings.heartbeat_interval, self._drain)

    def start(self) -> None:
        """Beat once now (the node is a candidate from this moment), then periodically."""
        self._draining.stop()
        self._registered = False
        try:
            self._beat()
        except Exception:
            # A store busy for longer than the lock timeout (seen with 64 nodes starting at
            # once on 2 cores) must not kill the worker: the loop registers it on its next beat.
            logger.exception("first heartbeat of node %s failed; retrying every %gs",
                             self.profile.name, self.settings.heartbeat_interval)
        self._loop.start()

    def _beat(self) -> None:
        # A beat that meets a dropped store connection (a failover, a PgBouncer restart, an
        # idle timeout) is tried again at once on a fresh one, within its interval: a node
        # whose beats failed twice in a row would otherwise back off past its TTL and look
        # dead while it runs.
        with quiet_turn():  # beside the sweeper's idle passes, on the same connection
            seen = outlasting(self.settings.database_url, f"heartbeat of node {self.profile.name}",
                              self._beat_once, patience=self.settings.heartbeat_interval)
        if seen is not None and self.lease is not None:
            try:
                self.lease[1](seen)
            except Exception:  # the lease's own loop still reads it when it could lapse
                logger.exception("node %s: what its beat read of lease %s was not taken in",
                                 self.profile.name, self.lease[0])
        # The beat's rhythm also gives back the store connections the node's threads opened
        # together and no longer use (an idle node then holds one).
        try:
            trim.maybe_trim(self.settings.database_url)
        except Exception:
            logger.exception("could not close node %s's idle store connections",
                             self.profile.name)

    def _beat_once(self) -> LeaseSeen | None:
        # The full row (this run's profile) until it is written once, then one UPDATE of it
        # and of this worker's row, in one transaction.
        if self._registered:
            return beat(self.settings, self.profile, me=self.me,
                        running=self.running() if self.me is not None else (),
                        lease=self.lease[0] if self.lease is not None else None)
        heartbeat(self.settings, self.profile, started_at=self.started_at)
        self._registered = True
        if self.me is not None:
            incarnation.beat(self.settings, self.me, running=self.running())
        return None

    def _drain(self) -> None:
        touch(self.settings, self.profile.name)
        if self.me is not None:
            incarnation.beat(self.settings, self.me, status="offline", running=self.running())

    def stop(self, final: bool = False) -> None:
        """Stop taking new work: mark the node offline (``final``: stopped, so no task waits
        for it to come back), keep proving it is alive until exit."""
        self._loop.stop()
        try:
            if self.me is not None:
                incarnation.beat(self.settings, self.me, status="offline",
                                 running=self.running())
            mark_offline(self.settings, self.profile.name,
                         status="stopped" if final else "offline")
        except Exception:  # shutting down: the TTL will expire the node anyway
            logger.exception("could not mark node %s offline", self.profile.name)
        self._draining.start()
