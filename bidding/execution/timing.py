"""When an attempt may run: a call's ``countdown``/``eta`` as the delay of its auction, and the
error of an attempt that reached its node after the task's deadline."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from bidding import clock
from bidding.errors import DeadlinePassedError
from bidding.execution.running import Running


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


def past_deadline(run: Running) -> DeadlinePassedError | None:
    """The error of an attempt that reached its node after the task's deadline, else None."""
    deadline = run.announcement.deadline if run.announcement is not None else None
    now = clock.now()
    if deadline is None or now < deadline:
        return None
    return DeadlinePassedError(
        f"deadline passed {now - deadline:.3f}s before the task could start on {run.node}"
    )
