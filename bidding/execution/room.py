"""A node starts an attempt that needs resources only while its running attempts leave room.

The award reserves a task's resources on its winner (``auction.placement``), but an award may
still choose a node the task fits only once its current work ends (it scored best even so),
and two workers of one node share its totals. The start is where no node may over-commit:
``begin`` runs ``room_for``'s check in its own transaction, with the node's row locked (SQLite
serializes every writer already), and moves the task to EXECUTING only if what the node's
other EXECUTING attempts hold leaves room for it. Otherwise the attempt waits on the node and
tries again every ``WAIT_PAUSE`` seconds: it starts as soon as it fits, and if it waits past
the schedule-to-start limit its task goes to the next-best bidder (the watchdog), as any
attempt that does not start does.

The needs travel in the execution message's ``RESOURCES_HEADER``; the totals are the worker's
own profile's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from bidding import resources
from bidding.lifecycle import states
from bidding.store.engine import core
from bidding.store.schema import AnnouncementRow, Node

#: The execution message's header with what the attempt holds while it runs.
RESOURCES_HEADER = "bidding_resources"
#: Seconds between two tries of an attempt waiting for room.
WAIT_PAUSE = 0.25

_LOCK_NODE = select(Node.name).where(Node.name == bindparam("node")).with_for_update()
_ROW = (select(AnnouncementRow.state, AnnouncementRow.attempt, AnnouncementRow.assigned_node)
        .where(AnnouncementRow.task_id == bindparam("task_id")))
_HELD = (select(AnnouncementRow.resources)
         .where(AnnouncementRow.assigned_node == bindparam("node"),
                AnnouncementRow.state == states.EXECUTING,
                AnnouncementRow.resources.is_not(None),
                AnnouncementRow.task_id != bindparam("task_id")))

#: A room check: True when the attempt may start now (run in ``begin``'s transaction).
RoomCheck = Callable[[Session], bool]


def needs_from(headers: Mapping[str, Any] | None) -> dict[str, float]:
    """The attempt's needs from its message's headers (none: it needs nothing)."""
    value = (headers or {}).get(RESOURCES_HEADER)
    try:
        return resources.needs_of(value, RESOURCES_HEADER)
    except ValueError:
        return {}  # a header we did not write: no gate (the award placed it)


def held_by_others(session: Session, node: str, task_id: str) -> dict[str, float]:
    """What ``node``'s EXECUTING attempts other than ``task_id``'s hold."""
    rows = core(session).execute(_HELD, {"node": node, "task_id": task_id}).scalars().all()
    return resources.total(r for r in rows if r)


def room_for(task_id: str, attempt: int, node: str, needs: Mapping[str, float],
             totals: Mapping[str, float], *, lock: bool) -> RoomCheck:
    """The check ``begin`` runs first in its transaction: the node's row locked (``lock``:
    PostgreSQL), True when the attempt is not the one awarded here and waiting (a copy, a
    redelivery: ``begin`` sorts those out as it always does) or when it fits beside what the
    node's other EXECUTING attempts hold."""

    def check(session: Session) -> bool:
        conn = core(session)
        if lock:
            conn.execute(_LOCK_NODE, {"node": node})
        row = conn.execute(_ROW, {"task_id": task_id}).one_or_none()
        if row is None or (row.state, row.attempt, row.assigned_node) != (
                states.ASSIGNED, attempt, node):
            return True
        return resources.fits(needs, totals, held_by_others(session, node, task_id))

    return check
