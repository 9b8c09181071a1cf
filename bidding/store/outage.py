"""Store writes that outlast a database restart.

A PostgreSQL server restarting (or failing over) refuses connections for a few seconds and
ends every open one. The writes an attempt cannot do without (its start, its result, its
failure) wait for it with backoff rather than fail a task whose body may already have run;
the engine replaces the dead connections (``engine._check_on_checkout``). SQLite has no
server to restart: its errors (a lock held too long) are raised at once, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds an attempt's store write keeps trying while the database is unreachable.
PATIENCE = 120.0
#: The first and the longest pause between two tries.
FIRST_PAUSE, LONGEST_PAUSE = 0.25, 5.0


def retryable(url: str, exc: BaseException) -> bool:
    """Whether ``exc`` says the database at ``url`` is unreachable for now (a server store
    restarting), rather than that the statement is wrong."""
    if make_url(url).get_backend_name() == "sqlite":
        return False
    return isinstance(exc, (OperationalError, InterfaceError))


def outlasting(url: str, what: str, write: Callable[[], T], patience: float = PATIENCE,
               sleep: Callable[[float], None] = time.sleep) -> T:
    """``write()``, tried again with backoff for up to ``patience`` seconds while the store
    at ``url`` is unreachable; ``write`` must be safe to repeat (a compare-and-set)."""
    deadline = time.monotonic() + patience
    pause = FIRST_PAUSE
    while True:
        try:
            return write()
        except Exception as exc:
            if not retryable(url, exc) or time.monotonic() + pause > deadline:
                raise
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            logger.warning("%s: the store is unreachable (%s); trying again in %.2gs", what,
                           first, pause)
            sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)
