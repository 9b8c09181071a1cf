"""Parking: a task that a sweeper's scan keeps failing on is set aside, with its reason.

The scans of the store (the deadline closer, the announcer of due tasks, the watchdog of
winners, seed 002's watch) each read a bounded batch of tasks, oldest first, and handle them
one by one. A task a scan fails on (an announcement this version cannot read, written by a
later one) is still there, still the oldest, at the next pass: a batch of such tasks would fill
every pass and hide the tasks behind them for good. So each pass keeps a ``Tally``:

- a failure about the task itself counts on its row (``scan_failures``); the first one is
  logged as a warning with its reason (and its traceback, unless it is a stored announcement
  this version cannot read, which the reason says all about), never again each pass;
- at ``PARK_AFTER`` failures in a row the task is parked: ``parked`` says which scan failed and
  why, every scan skips it (``UNPARKED``), it is logged once as an error, and ``bidding
  status`` shows it;
- a pass that handles a task which had failed before resets its count;
- a failure of the store, the broker or the bid board (an outage: ``is_outage``) says nothing
  about the task and does not count: an outage must not park every task it touched within
  three passes of a fifth of a second. Such failures are logged once per pass.

Any transition of the task clears both columns (``CLEARED``: it moved on, and what failed was
about where it was), as ``bidding reset`` does. The counts are compare-and-sets on the count
a pass read, so of several nodes' scans failing on a task at once one counts (and logs) it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Final, cast

import redis.exceptions
from kombu.exceptions import OperationalError as BrokerError
from pydantic import ValidationError
from sqlalchemy import CursorResult, Table, bindparam, update
from sqlalchemy import exc as sql_errors

from bidding.models import describe_validation
from bidding.store import write_session
from bidding.store.schema import AnnouncementRow

logger = logging.getLogger(__name__)

#: Failed passes in a row after which a task is parked.
PARK_AFTER: Final = 3
#: The longest reason kept (an error's text may be pages).
REASON_LIMIT: Final = 1000
#: The condition every scan adds: tasks not parked.
UNPARKED: Final = AnnouncementRow.parked.is_(None)
#: What a scan reads of each task besides its spec, in ``Seen``'s order.
SEEN_COLUMNS: Final = (AnnouncementRow.task_id, AnnouncementRow.state, AnnouncementRow.attempt,
                       AnnouncementRow.scan_failures)
#: What a transition (``lifecycle.transition``) and a reset set: nothing counted, not parked.
CLEARED: Final[dict[str, Any]] = {"scan_failures": 0, "parked": None}

#: Errors that say a service is unreachable for now, not that the task is wrong.
OUTAGES: Final[tuple[type[BaseException], ...]] = (
    OSError,  # ConnectionError, TimeoutError, socket errors
    sql_errors.OperationalError, sql_errors.InterfaceError, sql_errors.TimeoutError,
    redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
    BrokerError,
)

_TABLE: Final = cast(Table, AnnouncementRow.__table__)
_C = _TABLE.c
#: One count: on the task as the pass read it (its state, attempt and count), not parked.
_COUNT: Final = (
    update(_TABLE)
    .where(_C.task_id == bindparam("p_task"), _C.state == bindparam("p_state"),
           _C.attempt == bindparam("p_attempt"), _C.scan_failures == bindparam("p_seen"),
           _C.parked.is_(None))
    .values(scan_failures=bindparam("p_count"), parked=bindparam("p_parked"))
)


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the store, the broker or the bid board is unreachable for now."""
    return isinstance(exc, OUTAGES)


def describe(exc: BaseException) -> str:
    """A failure as one line: what a stored announcement lacks or holds too much of, or the
    error's type and first line."""
    if isinstance(exc, ValidationError):
        text = f"cannot read its stored {exc.title.lower()}: {describe_validation(exc)}"
    else:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= REASON_LIMIT else text[:REASON_LIMIT - 3] + "..."


@dataclass(frozen=True)
class Seen:
    """A task as a scan read it: where it stood, and its failures counted so far."""

    task_id: str
    state: str
    attempt: int
    failures: int = 0


@dataclass
class Tally:
    """What one pass of ``scan`` did to the tasks that fail, or failed before; ``save``
    writes the counts after the pass."""

    #: The scan, as reasons and logs name it ("watchdog").
    scan: str
    failed: list[tuple[Seen, BaseException]] = field(default_factory=list)
    handled: list[Seen] = field(default_factory=list)

    def failure(self, seen: Seen, exc: BaseException) -> None:
        """The pass failed on ``seen`` with ``exc``."""
        self.failed.append((seen, exc))

    def success(self, seen: Seen) -> None:
        """The pass handled ``seen`` (its count is reset if it had failed before)."""
        if seen.failures:
            self.handled.append(seen)

    def save(self, database_url: str) -> list[str]:
        """Count this pass's failures on their tasks, park those failing ``PARK_AFTER``
        passes in a row, reset the others' counts; log each first failure and each parking
        once. Returns the ids of the tasks parked. Never raises: a store that fails here
        fails the next pass too, which counts again."""
        outages = [(seen, exc) for seen, exc in self.failed if is_outage(exc)]
        if outages:
            seen, exc = outages[0]
            logger.warning("%s: the store, broker or bid board failed on %d task(s) this pass "
                           "(task %s: %s); tried again next pass", self.scan, len(outages),
                           seen.task_id, describe(exc))
        own = [(seen, exc) for seen, exc in self.failed if not is_outage(exc)]
        if not own and not self.handled:
            return []
        counted: list[tuple[Seen, BaseException, str, str | None]] = []
        changes: list[tuple[Seen, BaseException | None]] = [*own, *(
            (seen, None) for seen in self.handled)]
        try:
            with write_session(database_url) as session:
                # In one order for every scan: crossed row locks would deadlock PostgreSQL.
                for seen, error in sorted(changes, key=lambda c: c[0].task_id):
                    reason = None if error is None else describe(error)
                    count = 0 if reason is None else seen.failures + 1
                    parked = (f"{self.scan}: {reason}"
                              if reason is not None and count >= PARK_AFTER else None)
                    moved = cast(CursorResult[Any], session.execute(_COUNT, {
                        "p_task": seen.task_id, "p_state": seen.state,
                        "p_attempt": seen.attempt, "p_seen": seen.failures,
                        "p_count": count, "p_parked": parked})).rowcount
                    if moved == 1 and error is not None and reason is not None:
                        counted.append((seen, error, reason, parked))
        except Exception as exc:
            logger.warning("%s: could not count the failures of this pass on %d task(s) (%s)",
                           self.scan, len(own), describe(exc))
            return []
        for seen, error, reason, parked in counted:
            if parked is not None:
                logger.error("task %s parked: the %s failed on it %d passes in a row (%s); no "
                             "sweeper looks at it until it moves on or `bidding reset %s`",
                             seen.task_id, self.scan, PARK_AFTER, reason, seen.task_id)
            elif seen.failures == 0:
                logger.warning("task %s: the %s failed on it (%s); it is parked if that "
                               "happens %d passes in a row", seen.task_id, self.scan, reason,
                               PARK_AFTER,
                               exc_info=None if isinstance(error, ValidationError) else error)
        return [seen.task_id for seen, _, _, parked in counted if parked is not None]
