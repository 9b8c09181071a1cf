"""The message log: every protocol event of every task, in order (seed 002's agent_messages).

Messages are written with the transaction that makes them true, so the log never says what
the store does not. They are kept on the session (``write``, ``record``) and inserted
together, in order, in one statement just before it commits (``flush``, on SQLAlchemy's
``before_commit``): an award's announcement, answers and award were three or more inserts,
one per answer on PostgreSQL's executemany. Nothing reads the log inside a writing
transaction; readers see a transaction's messages when it commits, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, cast

from sqlalchemy import Table, event
from sqlalchemy.orm import Session, SessionTransaction

from bidding import clock
from bidding.store.rows import commit_with, insert_rows
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
#: The task had not started by its start-by time (its expiry or deadline): FAILED, never run.
EXPIRED: Final = "EXPIRED"
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
    COST_EXCEEDED, RESET, WATCH_ESCALATED, EXPIRED,
})


#: The message log's table: messages are written with Core INSERTs (no ORM unit of work).
MESSAGES: Final = cast(Table, Message.__table__)
#: Where a session keeps the messages its transaction has made, until it commits.
_PENDING: Final = "bidding_pending_messages"


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
            "detail": detail, "at": clock.now() if at is None else at}


def write(session: Session, rows: Sequence[dict[str, Any]]) -> None:
    """Add messages (made by ``message``) to the log in the caller's transaction, in order:
    inserted with the transaction's others when it commits (``flush``)."""
    if rows:
        session.info.setdefault(_PENDING, []).extend(rows)


def flush(session: Session) -> None:
    """Insert the messages the session's transaction has made so far, in one statement (it
    runs on its own just before the session commits)."""
    rows = session.info.pop(_PENDING, None)
    if rows:
        insert_rows(session, MESSAGES, rows)


@event.listens_for(Session, "before_commit")
def _before_commit(session: Session) -> None:
    rows = session.info.get(_PENDING)
    if rows and not session.in_nested_transaction() and commit_with(session, MESSAGES, rows):
        session.info.pop(_PENDING, None)
        return
    flush(session)


@event.listens_for(Session, "after_transaction_end")
def _after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    # A transaction that ended without committing (rolled back, closed) takes its messages
    # with it; a savepoint's end is not the transaction's.
    if transaction.parent is None:
        session.info.pop(_PENDING, None)


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
    """Add one message to the log in the caller's transaction (``write``): a Core INSERT
    when it commits, not ``session.add`` (messages have no foreign key, so their order
    relative to other tables' rows does not matter)."""
    write(session, [message(task_id, kind, node=node, attempt=attempt, at=at, **detail)])
