"""One node at a time sweeps the federation: a lease, held by renewing it.

Every sweep phase reads the whole federation's due work from the store (auctions past their
window, tasks due, winners to watch, outcomes to report), so one node doing it is enough, and
every further node doing it only multiplied the store's idle load: 16 idle nodes made about
200 transactions a second and used a third of a core between them (bench/idle.py). The lease
is a row of the jobs table (``sweeper``): its holder renews it every heartbeat interval for a
heartbeat TTL; the others learn of each renewal from their own heartbeat, whose statement
reads the row too (``nodes.heartbeat.beat``), read it themselves (``look``: no write, no
lock) only when it could have lapsed (``Sweeper.lease_interval``), and take it when it has (a
holder killed, its broker lost, its store connection gone). A holder that stops cleanly gives
it up at once, and the next beat of a node standing by shows it so.
Two holders for a moment (a renewal that landed after the lease lapsed) is harmless:
every phase is a compare-and-set, as when every node swept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, Table, bindparam, select, update

from bidding import clock
from bidding.store import read_session, write_session
from bidding.store.once import insert_once
from bidding.store.schema import Job

#: The lease's row in the jobs table.
SWEEPER = "sweeper"

_JOBS = cast(Table, Job.__table__)
_HOLD = (update(_JOBS)
         .where(_JOBS.c.name == bindparam("l_name"),
                (_JOBS.c.last_by == bindparam("l_by")) | (_JOBS.c.due_at <= bindparam("l_now")))
         .values(due_at=bindparam("l_until"), last_by=bindparam("l_by"),
                 last_at=bindparam("l_now")))
_READ = select(_JOBS.c.due_at, _JOBS.c.last_by).where(_JOBS.c.name == bindparam("l_name"))
_GIVE_UP = (update(_JOBS)
            .where(_JOBS.c.name == bindparam("l_name"), _JOBS.c.last_by == bindparam("l_by"))
            .values(due_at=0.0))


def hold(database_url: str, holder: str, ttl: float, name: str = SWEEPER,
         now: float | None = None) -> bool:
    """Take or renew lease ``name`` for ``holder`` until ``ttl`` seconds from now; whether
    ``holder`` holds it (False: another holder's has not lapsed)."""
    now = clock.now() if now is None else now
    with write_session(database_url) as session:
        moved = cast(CursorResult[Any], session.execute(_HOLD, {
            "l_name": name, "l_by": holder, "l_now": now, "l_until": now + ttl})).rowcount
        if moved == 1:
            return True
        # No row yet (a new store): whoever inserts it holds it; else someone else does.
        return insert_once(session, _JOBS, {"name": name, "due_at": now + ttl,
                                            "last_by": holder, "last_at": now, "runs": 0},
                           report=True)


def give_up(database_url: str, holder: str, name: str = SWEEPER) -> None:
    """Let lease ``name`` lapse now if ``holder`` holds it (a clean stop: another node takes
    it at its next look)."""
    with write_session(database_url) as session:
        session.execute(_GIVE_UP, {"l_name": name, "l_by": holder})


@dataclass(frozen=True)
class Look:
    """What a look at a lease found: whether the looker holds it now, and until when the
    lease it saw runs (the looker's own renewal, or another holder's; None: nobody's)."""

    held: bool
    until: float | None


def look(database_url: str, holder: str, ttl: float, name: str = SWEEPER,
         now: float | None = None) -> Look:
    """``hold``, for a node that may be standing by: another holder's lease that has not
    lapsed is only read (a standby's look writes nothing); a lapsed one, none, or the
    looker's own is taken or renewed."""
    now = clock.now() if now is None else now
    with read_session(database_url) as session:
        row = session.execute(_READ, {"l_name": name}).first()
    if row is not None and row.last_by != holder and row.due_at > now:
        return Look(False, float(row.due_at))
    if hold(database_url, holder, ttl, name, now=now):
        return Look(True, now + ttl)
    # Another took it between the read and the write: look again soon.
    return Look(False, None)
