"""The message log: every protocol event of every task, in order (seed 002's agent_messages)."""

from __future__ import annotations

import time
from typing import Any, Final

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
SCHEDULED: Final = "SCHEDULED"
RETRYING: Final = "RETRYING"
REAWARDED: Final = "REAWARDED"
DEFERRED: Final = "DEFERRED"
ESCALATED: Final = "ESCALATED"
OUTPUT_INVALID: Final = "OUTPUT_INVALID"
COST_EXCEEDED: Final = "COST_EXCEEDED"


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
    """Add one message to the log in the caller's transaction."""
    session.add(
        Message(
            task_id=task_id,
            kind=kind,
            node=node,
            attempt=attempt,
            detail=detail,
            at=time.time() if at is None else at,
        )
    )
