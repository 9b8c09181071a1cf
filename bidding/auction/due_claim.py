"""Who announces a due task: the announcer whose claim on it lands.

A due task (a retry after its backoff, a deferral, a scheduled start) may be found by two
announcers at once: the lease holder's sweep and the alarm of the process that scheduled the
retry (``alarm``), or two sweepers for a moment. Their auctions' writes are compare-and-sets,
so only one auction opens; but each would first open the announcement's span and send Flower
its ANNOUNCED. So an announcer first claims the task: one UPDATE that moves its due time a
little into the future, and lands only while the task is still due at the time seen. The loser
skips it, silently. The winner's auction then moves the row on (and its due time with it);
an announcer that fails first gives its claim back, and one killed holds it ``CLAIM_SECONDS``
at most, after which the task is due again.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from sqlalchemy import CursorResult, Table, bindparam, update

from bidding.lifecycle import states
from bidding.store import write_session
from bidding.store.schema import AnnouncementRow

logger = logging.getLogger(__name__)

#: Seconds a claim holds a due task for its announcer (its auction's first write comes within
#: milliseconds; a claimer killed before it only delays the task this much).
CLAIM_SECONDS = 10.0

_ROWS = cast(Table, AnnouncementRow.__table__)
_CLAIM = (update(_ROWS)
          .where(_ROWS.c.task_id == bindparam("c_task"), _ROWS.c.attempt == bindparam("c_attempt"),
                 _ROWS.c.state.in_(sorted(states.DUE_STATES)),
                 _ROWS.c.due_at <= bindparam("c_now"), _ROWS.c.parked.is_(None))
          .values(due_at=bindparam("c_until")))
_RELEASE = (update(_ROWS)
            .where(_ROWS.c.task_id == bindparam("c_task"),
                   _ROWS.c.attempt == bindparam("c_attempt"),
                   _ROWS.c.state.in_(sorted(states.DUE_STATES)),
                   _ROWS.c.due_at == bindparam("c_until"))
            .values(due_at=bindparam("c_due")))


def claim(database_url: str, task_id: str, attempt: int, now: float) -> float | None:
    """Claim due task ``task_id`` (its ``attempt``) for this announcer: the due time the claim
    set (to give back with ``release``), or None when another announcer has it or it is no
    longer due."""
    until = now + CLAIM_SECONDS
    with write_session(database_url) as session:
        moved = cast(CursorResult[Any], session.execute(_CLAIM, {
            "c_task": task_id, "c_attempt": attempt, "c_now": now, "c_until": until,
        })).rowcount
    return until if moved == 1 else None


def release(database_url: str, task_id: str, attempt: int, until: float, due: float) -> None:
    """Give a claim back after the announcement failed: the task is due at ``due`` again, as
    before the claim (the next pass finds it first, as parking counts on). Best effort: with
    the store unreachable, the claim lapses by itself."""
    try:
        with write_session(database_url) as session:
            session.execute(_RELEASE, {"c_task": task_id, "c_attempt": attempt,
                                       "c_until": until, "c_due": due})
    except Exception as exc:
        logger.warning("task %s: giving its announcement claim back failed (%s); it is due "
                       "again in %gs", task_id, exc, CLAIM_SECONDS)
