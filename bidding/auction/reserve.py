"""Reserve, then bind: the loop every award runs, whether it binds in the store's transaction
or appends to the write-behind journal.

An award counts its bidders' work in flight to decide, and reserves the winner's slot as it
binds. Two concurrent awards that counted the same free slot cannot both bind: the one that
finds its count stale (another award took a slot it counted) decides again. The last try
binds as decided, so an award always ends.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import TypeVar

T = TypeVar("T")

#: Decisions made when concurrent awards reserve the same nodes; the last one binds as is.
RESERVATION_TRIES = 3


class Again(Enum):
    """A try whose reservation was stale (or whose row was not there yet): decide again."""

    AGAIN = "again"


AGAIN = Again.AGAIN


def reserve(bind_once: Callable[[bool], T | Again]) -> T | None:
    """Run ``bind_once(last)`` until it binds (or finds nothing to bind), at most
    ``RESERVATION_TRIES`` times; ``last`` tells the last try to bind as decided. None when
    every try said ``AGAIN``."""
    for try_no in range(1, RESERVATION_TRIES + 1):
        result = bind_once(try_no == RESERVATION_TRIES)
        if result is not AGAIN:
            return result
    return None
