"""An attempt's values: how its start went (``Start``), the attempt in progress on this node
(``Running``), and what its worker must do next (``Verdict``)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import Enum

from bidding.models import Announcement

logger = logging.getLogger(__name__)


class Start(Enum):
    """What ``begin`` found."""

    #: First delivery: the task was ASSIGNED to this node and is now EXECUTING.
    FIRST = "first"
    #: Already EXECUTING on this node (its pool process died with the message unacked): run again.
    REDELIVERED = "redelivered"
    #: Finished, or awarded elsewhere since: do not run it.
    DUPLICATE = "duplicate"
    #: Awarded here, but the node's running attempts leave no room for what it needs yet
    #: (``execution.room``): nothing was written; try again shortly.
    WAITING = "waiting"
    #: The store has no such announcement (a leftover message, or a store mismatch): the task
    #: drops it without running the body.
    UNKNOWN = "unknown"


@dataclass
class Running:
    """An attempt in progress on this node."""

    task_id: str
    attempt: int
    node: str
    start: Start
    announcement: Announcement | None
    #: This node's price per unit (AITP 7.1: the node charges its own price).
    price_per_unit: float = 0.0
    #: Units the body reported with ``self.report_units``; default: the announced units.
    units: float | None = None
    began: float = 0.0
    #: When the attempt ended: taken by the first try of ``complete`` or ``fail`` and kept by
    #: every later one (``store.outage`` tries again after a lost connection), so that a try
    #: whose first commit landed finds its own messages, as ``begin`` finds its start time.
    ended: float | None = None
    #: The proposal of the bid this node won the task with ("" if it had none: a fallback
    #: award) and that bid's score (None likewise), read by ``begin`` with the task's row.
    proposal: str = ""
    score: float | None = None


@dataclass
class Verdict:
    """What the worker does after an attempt: nothing, retry after a delay, or raise an error."""

    retry_in: float | None = None
    #: When the retry is due, as written to the store (None: not known here).
    retry_at: float | None = None
    error: BaseException | None = None
