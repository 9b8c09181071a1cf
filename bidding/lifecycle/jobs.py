"""The federation's periodic jobs (the retention prune): every node worker looks, one runs.

A job is a row with the time it is next due. A node whose look finds it due moves that time on
with a compare-and-set; the one whose update lands runs the job, the others see it moved.
Each node reads the row at most once per look (a cheap read) and writes only when the job is
due, so a thousand idle nodes cost a thousand reads a look, not a thousand transactions.
"""

from __future__ import annotations

from typing import Any, cast

from sqlalchemy import CursorResult, Table, bindparam, select, update

from bidding import clock
from bidding.store import read_session, write_session
from bidding.store.once import insert_once
from bidding.store.schema import Job

_JOBS = cast(Table, Job.__table__)
_DUE_AT = select(Job.due_at).where(Job.name == bindparam("name"))
_CLAIM = (update(_JOBS)
          .where(_JOBS.c.name == bindparam("j_name"), _JOBS.c.due_at <= bindparam("j_now"))
          .values(due_at=bindparam("j_next"), last_by=bindparam("j_by"),
                  last_at=bindparam("j_now"), runs=_JOBS.c.runs + 1))


def due_at(database_url: str, name: str) -> float | None:
    """When job ``name`` is next due (None: it never ran)."""
    with read_session(database_url) as session:
        return cast(float | None, session.scalar(_DUE_AT, {"name": name}))


def claim(database_url: str, name: str, every: float, by: str,
          now: float | None = None) -> bool:
    """Whether ``by`` runs job ``name`` now: it was due (or had never run) and this call moved
    its due time ``every`` seconds on before any other node did."""
    now = clock.now() if now is None else now
    with write_session(database_url) as session:
        moved = cast(CursorResult[Any], session.execute(_CLAIM, {
            "j_name": name, "j_now": now, "j_next": now + every, "j_by": by})).rowcount
        if moved == 1:
            return True
        if session.scalar(_DUE_AT, {"name": name}) is not None:
            return False
        # Its first run: whoever inserts the row runs it.
        return insert_once(session, _JOBS, {"name": name, "due_at": now + every,
                                            "last_by": by, "last_at": now, "runs": 1},
                           report=True)


def record(database_url: str, name: str, result: dict[str, Any]) -> None:
    """Keep what the job's latest run did (``bidding status``-like views read it)."""
    with write_session(database_url) as session:
        session.execute(update(Job).where(Job.name == name).values(last_result=result))
