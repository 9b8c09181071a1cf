"""When an attempt may run: a call's ``countdown``/``eta`` as the delay of its auction; its
``expires`` as an absolute time on the store's clock; and the error of an attempt that reached
its node after the task's deadline or expiry."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from bidding import clock
from bidding.errors import ConfigurationError, TaskExpiredError
from bidding.execution.running import Running
from bidding.models import Announcement


def call_delay(options: Mapping[str, Any]) -> float:
    """Seconds a call's ``countdown`` or ``eta`` (the caller's own clock: Celery's meaning)
    puts off its auction."""
    countdown = options.get("countdown")
    if countdown:
        return max(0.0, float(countdown))
    eta = options.get("eta")
    if eta is not None:
        return max(0.0, float(eta.timestamp()) - time.time())
    return 0.0


_EXPECTED = ("expected seconds from now (a number >= 0), a datetime, or an ISO-8601 date and "
             "time")


def expiry_time(value: Any, now: float, wall: float | None = None) -> float | None:
    """The absolute time, on the store's clock (``now`` is the store's time of the call),
    at which a call given ``expires=value`` expires; None for None.

    As plain Celery takes it: a number is seconds from now; a datetime an instant (naive
    means UTC, as Celery's default ``enable_utc``); an ISO-8601 string is read as that
    datetime (options may come as JSON). A datetime is the caller's own time, like an
    ``eta``: it is turned into a delay on the caller's clock (``wall``, default
    ``time.time()``), so a caller whose clock is off gets the delay it meant. A datetime in
    the past expires the task at once (Celery's meaning). Anything else, a negative number,
    NaN or infinity is refused, naming ``expires``."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigurationError(f"expires: {_EXPECTED}; got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
        if math.isnan(seconds) or math.isinf(seconds):
            raise ConfigurationError(f"expires: {_EXPECTED}; got {value!r}, which is not a time")
        if seconds < 0:
            raise ConfigurationError(f"expires: {_EXPECTED}; got {value!r}, which is negative")
        return now + seconds
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ConfigurationError(
                f"expires: {_EXPECTED}; got the string {value!r}, which is not ISO-8601"
            ) from None
    if isinstance(value, datetime):
        instant = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        wall = time.time() if wall is None else wall
        return now + (instant.timestamp() - wall)
    raise ConfigurationError(f"expires: {_EXPECTED}; got a {type(value).__name__}")


def _when(at: float) -> str:
    """``at`` (Unix time) as an ISO-8601 UTC time, to the millisecond."""
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")


def expiry_reason(announcement: Announcement, now: float, where: str) -> str:
    """Why ``announcement`` never starts: ``"expired: ..."``, naming the limit that passed
    (its expiry, or its deadline), when, how long ago, and ``where`` it was waiting."""
    start_by = announcement.start_by
    assert start_by is not None
    which = ("its deadline" if announcement.deadline is not None
             and announcement.deadline <= start_by else "its expiry")
    return (f"expired: not started by {which} ({_when(start_by)}, {max(0.0, now - start_by):.3f}s"
            f" ago) while {where}")


def expired_error(announcement: Announcement, reason: str) -> TaskExpiredError:
    """The error the caller's ``.get()`` raises for a task that expired for ``reason``."""
    return TaskExpiredError(f"task {announcement.task_id}: {reason}")


def past_deadline(run: Running) -> TaskExpiredError | None:
    """The error of an attempt that reached its node after its task's deadline or expiry (its
    start-by time), else None."""
    announcement = run.announcement
    now = clock.now()
    if announcement is None or not announcement.expired(now):
        return None
    return expired_error(
        announcement, expiry_reason(announcement, now, f"its execution waited for {run.node}")
    )
