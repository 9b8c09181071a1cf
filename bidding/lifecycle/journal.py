"""The message log: every protocol event of every task, in order (seed 002's agent_messages)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final, cast

from sqlalchemy import Table, insert
from sqlalchemy.orm import Session

from bidding.store.schema import Message

ANNOUNCED: Final = "ANNOUNCED"
BID: Final = "BID"
REFUSED: Final = "REFUSED"
AWARDED: Final = "AWARDED"
NO_AWARD: Final = "NO_AWARD"
TASK_ACCEPTED: Final = "TASK_ACCEPTED"
PROGRESS_UPDATE: Final = "PROGRESS_UPDATE"
TASK_COMPLETED: Final = "TASK_COMPLETED"
TASK_SUCCEEDED: Final = "TASK_SUCCEEDED"
TASK_FAILED: Final = "TASK_FAILED"
ILLEGAL_TRANSITION: Final = "ILLEGAL_TRANSITION"
#: A refused change from an attempt, or a node, that no longer holds the task (it was
#: re-awarded or retried meanwhile): the expected aftermath of a lost winner, not a fault.
STALE_UPDATE: Final = "STALE_UPDATE"
SCHEDULED: Final = "SCHEDULED"
RETRYING: Final = "RETRYING"
REAWARDED: Final = "REAWARDED"
#: The award is committed but its execution message could not be sent (the broker down).
SEND_FAILED: Final = "SEND_FAILED"
#: A sweeper sent an undelivered execution again, to the same winner.
RESENT: Final = "RESENT"
#: A worker of the winning node ended (restarted, or stopped heartbeating) and may have held
#: the execution's message: it is sent again to the node.
WORKER_LOST: Final = "WORKER_LOST"
DEFERRED: Final = "DEFERRED"
ESCALATED: Final = "ESCALATED"
OUTPUT_INVALID: Final = "OUTPUT_INVALID"
COST_EXCEEDED: Final = "COST_EXCEEDED"
#: A task's checking state was cleared (seed 002's reset_task): allowed at any time, also
#: after a final state; it changes nothing of the task's lifecycle.
RESET: Final = "RESET"
#: A silent task flagged for an operator by the monitor (seed 002's escalation). Not a final
#: state: the task keeps running and may still complete.
WATCH_ESCALATED: Final = "WATCH_ESCALATED"

#: Every kind of message the log holds (the protocol checker refuses any other).
KINDS: Final = frozenset({
    ANNOUNCED, BID, REFUSED, AWARDED, NO_AWARD, TASK_ACCEPTED, PROGRESS_UPDATE, TASK_COMPLETED,
    TASK_SUCCEEDED, TASK_FAILED, ILLEGAL_TRANSITION, STALE_UPDATE, SCHEDULED, RETRYING,
    REAWARDED, SEND_FAILED, RESENT, WORKER_LOST, DEFERRED, ESCALATED, OUTPUT_INVALID,
    COST_EXCEEDED, RESET, WATCH_ESCALATED,
})


#: The message log's table: messages are written with Core INSERTs (no ORM unit of work).
MESSAGES: Final = cast(Table, Message.__table__)
_INSERT: Final = insert(MESSAGES)


def message(
    task_id: str,
    kind: str,
    *,
    node: str | None = None,
    attempt: int = 1,
    at: float | None = None,
    **detail: Any,
) -> dict[str, Any]:
    """The row of one message, for ``write`` (``record``'s arguments)."""
    return {"task_id": task_id, "kind": kind, "node": node, "attempt": attempt,
            "detail": detail, "at": time.time() if at is None else at}


def write(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Add messages (made by ``message``) to the log in the caller's transaction, in order,
    with one statement."""
    if rows:
        session.execute(_INSERT, list(rows) if len(rows) > 1 else rows[0])


def record(
    session: Session,
    task_id: str,
    kind: str,
    *,
    node: str | None = None,
    attempt: int = 1,
    at: float | None = None,
    **detail: Any,
) -> None:
    """Add one message to the log in the caller's transaction.

    The INSERT is sent at once (a Core statement, not ``session.add``): it costs a fraction of
    an ORM flush, and it does not flush the caller's pending objects (messages have no foreign
    key, so their order relative to other tables' rows does not matter).
    """
    session.execute(_INSERT, message(task_id, kind, node=node, attempt=attempt, at=at, **detail))
