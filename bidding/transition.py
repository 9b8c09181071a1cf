"""Applying a state transition to the store: a compare-and-set, logged as a message.

Every change of a task's state goes through ``transition``. It moves the task only from the
states ``lifecycle.ALLOWED`` permits (optionally narrowed), and only for the expected attempt and
node; a refused transition is logged as ILLEGAL_TRANSITION with the state it found, never applied.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.orm import Session

from bidding import journal, lifecycle
from bidding.store.schema import Announcement as AnnouncementRow


def transition(
    session: Session,
    task_id: str,
    target: str,
    *,
    kind: str,
    from_states: Iterable[str] | None = None,
    expect_attempt: int | None = None,
    expect_node: str | None = None,
    message_node: str | None = None,
    at: float | None = None,
    detail: dict[str, Any] | None = None,
    **values: Any,
) -> bool:
    """Move ``task_id`` to ``target`` and log ``kind``; False (and logged) when refused.

    ``from_states`` narrows the allowed sources (it must be a subset of them);
    ``expect_attempt`` and ``expect_node`` make the change conditional on the task's current
    attempt and assigned node. ``values`` are the columns to set (``attempt=`` included).
    """
    allowed = lifecycle.sources(target)
    if from_states is not None:
        narrowed = frozenset(from_states)
        if not narrowed <= allowed:
            raise ValueError(f"{sorted(narrowed - allowed)} -> {target} is not a transition")
        allowed = narrowed
    at = time.time() if at is None else at
    stmt = update(AnnouncementRow).where(AnnouncementRow.task_id == task_id,
                                         AnnouncementRow.state.in_(sorted(allowed)))
    if expect_attempt is not None:
        stmt = stmt.where(AnnouncementRow.attempt == expect_attempt)
    if expect_node is not None:
        stmt = stmt.where(AnnouncementRow.assigned_node == expect_node)
    moved = cast(CursorResult[Any], session.execute(stmt.values(state=target, **values))).rowcount
    log_attempt = values.get("attempt", expect_attempt) or 1
    if moved == 1:
        journal.record(session, task_id, kind, node=message_node or expect_node,
                       attempt=log_attempt, at=at, **(detail or {}))
        return True
    found = session.execute(
        select(AnnouncementRow.state, AnnouncementRow.attempt, AnnouncementRow.assigned_node)
        .where(AnnouncementRow.task_id == task_id)
    ).one_or_none()
    journal.record(
        session, task_id, journal.ILLEGAL_TRANSITION, node=message_node or expect_node,
        attempt=log_attempt, at=at, target=target, wanted=kind,
        current=None if found is None else found[0],
        current_attempt=None if found is None else found[1],
        current_node=None if found is None else found[2],
        expected_attempt=expect_attempt, expected_node=expect_node,
    )
    return False
