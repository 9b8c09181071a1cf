"""A worker's incarnation: its Celery node name and a boot id that is new at every start.

A node may be served by several worker processes, each with its own Celery node name
(``redfin@host-a``, ``redfin@host-b``): they are workers of one node, not restarts of each
other. A worker restarted under the same name (by systemd, Kubernetes or supervisord, a second
after it died) is a new incarnation of that name: the attempts its earlier incarnation was
running are lost, and the watchdogs hand them on as soon as the new one registers, instead of
waiting for the broker to hand their messages out again (an hour on Redis).

Each worker's row in ``bidding_workers`` holds its current boot id and heartbeat; an attempt
records the worker and boot id that began it.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, Table, and_, bindparam, or_, select, update
from sqlalchemy.orm import Session

from bidding import clock
from bidding.config import Settings
from bidding.store import read_session, write_session
from bidding.store.direct import execute
from bidding.store.engine import core
from bidding.store.schema import Worker

logger = logging.getLogger(__name__)

#: How a pool process started by spawning (not forking) learns its parent's boot id.
BOOT_ENV = "_BIDDING_BOOT_ID"


@dataclass(frozen=True)
class Incarnation:
    """This worker process, as the store knows it."""

    #: The Celery node name, e.g. ``redfin@host-a``.
    hostname: str
    node: str
    boot_id: str
    pid: int
    started_at: float
    #: Pool processes (attempts it runs at once), None when unknown.
    slots: int | None = None


@dataclass(frozen=True)
class Ended:
    """An earlier incarnation of a worker name, or a worker that stopped heartbeating."""

    hostname: str
    node: str
    boot_id: str
    started_at: float
    last_heartbeat: float
    #: "restarted" (a new incarnation took its name) or "stopped heartbeating".
    why: str


_current: Incarnation | None = None


def begin(hostname: str, node: str, slots: int | None = None) -> Incarnation:
    """Start this process's incarnation (the worker's main process, before its pool forks)."""
    global _current
    _current = Incarnation(hostname=hostname, node=node, boot_id=uuid.uuid4().hex,
                           pid=os.getpid(), started_at=clock.now(), slots=slots)
    os.environ[BOOT_ENV] = _current.boot_id
    return _current


def current() -> Incarnation | None:
    """This process's incarnation, if it is a node worker's main process or a forked child."""
    return _current


def boot_id() -> str | None:
    """The boot id of the worker this process belongs to (a pool process inherits it)."""
    if _current is not None:
        return _current.boot_id
    return os.environ.get(BOOT_ENV)


#: The workers table, for statements in Core.
WORKERS = cast(Table, Worker.__table__)
#: A worker's beat: its heartbeat time, status and running tasks, if its row is still this
#: incarnation's (``beat_params`` fills it in). Core, not ORM: one statement per beat.
BEAT = (update(WORKERS)
        .where(WORKERS.c.hostname == bindparam("w_host"),
               WORKERS.c.boot_id == bindparam("w_boot"))
        .values(last_heartbeat=bindparam("w_now"), status=bindparam("w_status"),
                running=bindparam("w_running")))


def register(settings: Settings, me: Incarnation, now: float | None = None) -> Ended | None:
    """Write this incarnation's row; the earlier incarnation it replaces, if any, is returned
    (unless it was already handled as ended)."""
    now = clock.now() if now is None else now
    with write_session(settings.database_url) as session:
        row = session.get(Worker, me.hostname, with_for_update=True)
        earlier: Ended | None = None
        if row is None:
            session.add(Worker(hostname=me.hostname, node=me.node, boot_id=me.boot_id,
                               pid=me.pid, started_at=me.started_at, last_heartbeat=now,
                               slots=me.slots, status=STARTING))
            return None
        if row.boot_id != me.boot_id and row.status != "ended":
            earlier = Ended(hostname=row.hostname, node=row.node, boot_id=row.boot_id,
                            started_at=row.started_at, last_heartbeat=row.last_heartbeat,
                            why="restarted")
        row.node, row.boot_id, row.pid = me.node, me.boot_id, me.pid
        row.started_at, row.last_heartbeat = me.started_at, now
        row.slots, row.status = me.slots, STARTING
    return earlier


def beat(settings: Settings, me: Incarnation, status: str = "online",
         now: float | None = None, running: Sequence[str] = ()) -> bool:
    """Refresh this incarnation's heartbeat (``status``: online, or offline while draining),
    with the ids of the tasks its pool is ``running`` (a check of a delegated task reads them).

    False when its row is not this incarnation's any more: another worker registered under
    the same Celery node name (two workers of a node need names of their own, ``-n``).
    """
    now = clock.now() if now is None else now
    with write_session(settings.database_url) as session:
        return beat_in(session, me, status=status, now=now, running=running)


def beat_in(session: Session, me: Incarnation, *, now: float, status: str = "online",
            running: Sequence[str] = ()) -> bool:
    """``beat`` in a write ``session`` of the caller's (the node's periodic heartbeat writes
    the node's row and this one in one transaction), on the driver's cursor (``store.direct``)."""
    return beat_counted(me, execute(core(session), BEAT, beat_params(
        me, now=now, status=status, running=running)).rowcount)


def beat_params(me: Incarnation, *, now: float, status: str = "online",
                running: Sequence[str] = ()) -> dict[str, Any]:
    """The parameters of worker ``me``'s beat (``BEAT``)."""
    return {"w_host": me.hostname, "w_boot": me.boot_id, "w_now": now, "w_status": status,
            "w_running": list(running)}


def beat_counted(me: Incarnation, moved: int) -> bool:
    """Whether worker ``me``'s beat updated its row (``moved`` rows); if not, another
    incarnation owns the row, and the log says so."""
    if moved != 1:
        logger.error("worker %s: its row in the store belongs to another incarnation: is a "
                     "second worker running under the same name? Give each worker of a node "
                     "its own name (-n)", me.hostname)
        return False
    return True


#: A registered worker's status until its first heartbeat (its consumer started).
STARTING = "starting"
#: Seconds a starting worker may go without a heartbeat beyond the TTL before it is taken
#: for dead. Registration comes before the pool and the consumer start, and 64 workers
#: starting at once on two cores took longer than the 10 s TTL to beat first: each was
#: logged as "stopped heartbeating" while it started (bench/idle.py --nodes 64). A worker
#: that never beat holds no attempt, unless its first beat failed and its consumer started
#: anyway: the watchdog then still moves those attempts at the TTL (their runner's own
#: check), only the worker's end is called later.
START_GRACE = 60.0

_STALE = (select(Worker.hostname, Worker.node, Worker.boot_id, Worker.started_at,
                 Worker.last_heartbeat)
          .where(Worker.status != "ended",
                 or_(and_(Worker.status != STARTING,
                          Worker.last_heartbeat < bindparam("cutoff")),
                     Worker.last_heartbeat < bindparam("start_cutoff"))))
_END = (update(WORKERS)
        .where(WORKERS.c.hostname == bindparam("w_host"),
               WORKERS.c.boot_id == bindparam("w_boot"), WORKERS.c.status != "ended")
        .values(status="ended"))


def end_stale(settings: Settings, cutoff: float) -> list[Ended]:
    """Workers silent since before ``cutoff`` (a starting one: ``START_GRACE`` longer), each
    claimed as ended once (a compare-and-set: concurrent sweepers handle each one once). Reads
    only, when none is stale."""
    with read_session(settings.database_url) as session:
        stale = session.execute(_STALE, {"cutoff": cutoff,
                                         "start_cutoff": cutoff - START_GRACE}).all()
    if not stale:
        return []
    claimed = []
    with write_session(settings.database_url) as session:
        for hostname, node, boot, started_at, last in stale:
            result = cast(CursorResult[Any], session.execute(
                _END, {"w_host": hostname, "w_boot": boot}))
            if result.rowcount == 1:
                claimed.append(Ended(hostname, node, boot, started_at, last,
                                     "stopped heartbeating"))
    return claimed


_SLOTS = (select(Worker.node, Worker.slots)
          .where(Worker.node.in_(bindparam("nodes", expanding=True)),
                 Worker.last_heartbeat >= bindparam("cutoff")))


def live_slots(session: Any, nodes: Sequence[str], cutoff: float) -> dict[str, int | None]:
    """Pool processes of each node's live workers, summed (None where a worker did not say)."""
    out: dict[str, int | None] = {}
    for node, slots in session.execute(_SLOTS, {"nodes": list(nodes), "cutoff": cutoff}):
        if node in out and out[node] is None:
            continue
        out[node] = None if slots is None else (out.get(node) or 0) + int(slots)
    return out
