"""``bidding reset TASK_ID`` (``bidding.reset``): clear a task's checking state by hand.

Seed 002's ``reset_task``: ``check_attempts`` back to 0, no ``next_check_time`` and no
escalation, so the watch starts again from now (its first check ``initial_check_wait_time``
later). A task the sweepers parked (``lifecycle.parking``: a scan failed on it pass after
pass) is unparked too, so that every scan looks at it again (after an upgrade that reads its
announcement, say). Logged as RESET with what was cleared. Nothing else about the task
changes: a reset says "a human has seen it", it does not stop, resend or re-announce the task.
"""

from __future__ import annotations

from celery import Celery
from pydantic import BaseModel
from sqlalchemy import update

from bidding import clock
from bidding.config import get_settings
from bidding.errors import ConfigurationError, UnknownTaskError
from bidding.lifecycle import journal, parking, states
from bidding.store import ensure_schema, store_label, write_session
from bidding.store.schema import AnnouncementRow


class ResetOutcome(BaseModel):
    """What ``reset`` cleared, and whether the task is under watch again."""

    task_id: str
    state: str
    node: str | None
    #: The checking state it had: checks without news, and the escalation's reason.
    cleared_attempts: int
    cleared_escalation: str | None
    #: Why the sweepers had parked it (``lifecycle.parking``), if they had: cleared too.
    cleared_parked: str | None = None
    #: True when the task is delegated (ASSIGNED or EXECUTING), so the watch checks it again.
    watched: bool

    def render(self) -> str:
        """One line for terminals."""
        was = f"{self.cleared_attempts} check(s) without news"
        if self.cleared_escalation:
            was += f", escalated: {self.cleared_escalation}"
        if self.cleared_parked:
            was += f", parked: {self.cleared_parked}"
        then = (f"back under watch ({self.state} on {self.node})" if self.watched
                else f"not watched: it is {self.state}, not delegated to a node")
        return f"task {self.task_id}: checking state cleared (was {was}); {then}"


def reset(task_id: str, app: Celery | None = None, *,
          database_url: str | None = None) -> ResetOutcome:
    """Clear ``task_id``'s checking state (attempts, next check, escalation) and log RESET.

    Pass the Celery ``app`` (its ``bidding_database_url`` is used) or a ``database_url``.
    Raises :class:`UnknownTaskError`, naming the store, when it has no such task.
    """
    if database_url is None:
        if app is None:
            raise ConfigurationError("reset: pass app= or database_url=")
        database_url = get_settings(app).database_url
    ensure_schema(database_url)
    now = clock.now()
    with write_session(database_url) as session:
        row = session.get(AnnouncementRow, task_id, with_for_update=True)
        if row is None:
            raise UnknownTaskError(
                f"task {task_id}: no such announcement in the store {store_label(database_url)}"
                " (a finished task is pruned after bidding_retention_days)")
        outcome = ResetOutcome(task_id=task_id, state=row.state, node=row.assigned_node,
                               cleared_attempts=row.check_attempts,
                               cleared_escalation=row.escalation,
                               cleared_parked=row.parked,
                               watched=row.state in states.IN_FLIGHT_STATES)
        attempt = row.attempt
        # (The UPDATE below synchronizes the loaded row: what it had is read before.)
        session.execute(update(AnnouncementRow).where(AnnouncementRow.task_id == task_id)
                        .values(check_attempts=0, next_check_time=None, check_since=now,
                                escalated_at=None, escalation=None, **parking.CLEARED))
        journal.record(session, task_id, journal.RESET, node=outcome.node,
                       attempt=attempt, at=now, check_attempts=outcome.cleared_attempts,
                       escalation=outcome.cleared_escalation,
                       **({"parked": outcome.cleared_parked} if outcome.cleared_parked else {}))
    return outcome
