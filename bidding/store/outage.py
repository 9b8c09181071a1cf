"""Store writes that outlast a database restart.

A PostgreSQL server restarting (or failing over) refuses connections for a few seconds and
ends every open one. The writes an attempt cannot do without (its start, its result, its
failure) wait for it with backoff rather than fail a task whose body may already have run;
the engine replaces the dead connections (``engine._check_on_checkout``).

SQLite has no server to restart, but its write lock can be held longer than a writer waits
for it (30 s) when many processes write at once: 64 node workers starting together on two
cores, each registering itself and beating, had one or two of them exit at start-up with
"database is locked" (bench/idle.py --nodes 64 --store sqlite). Such a write is waited out
the same way; any other SQLite error is raised at once.
"""

from __future__ import annotations

import logging
import sqlite3
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


#: What SQLite says when its write lock was not free within the wait.
SQLITE_LOCKED = "database is locked"


def retryable(url: str, exc: BaseException) -> bool:
    """Whether ``exc`` says the database at ``url`` is unreachable or busy for now (a server
    store restarting, SQLite's write lock held past the wait), rather than that the
    statement is wrong."""
    if make_url(url).get_backend_name() == "sqlite":
        # Raw from the write's BEGIN IMMEDIATE (``engine._begin_immediate``), wrapped by
        # SQLAlchemy from a statement.
        return (isinstance(exc, (OperationalError, sqlite3.OperationalError))
                and SQLITE_LOCKED in str(exc))
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
            state = "busy" if SQLITE_LOCKED in first else "unreachable"
            logger.warning("%s: the store is %s (%s); trying again in %.2gs", what, state,
                           first, pause)
            sleep(pause)
            pause = min(pause * 2, LONGEST_PAUSE)
