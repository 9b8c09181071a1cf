"""Idle server connections closed, down to one per pool, as HikariCP's ``idleTimeout`` does.

A pool keeps every connection it has opened, and each is a server process on PostgreSQL. A
node worker's threads (heartbeat, lease, the sweeper's phases, bid listeners) open several
at the moments they meet, so an idle node held about five for ever, a federation about five
per node more than it needs. The pools hand out the connection returned last (LIFO), so the
others go unused while the node is quiet; ``trim_idle`` closes those unused for
``IDLE_CLOSE_AFTER`` seconds and always keeps the one used last. A burst opens what it
needs again (the pool's size is unchanged), so only a quiet process gives its connections
back.

SQLite's connections are files of this process, no server's: they are left alone.
"""

from __future__ import annotations

import os
import threading
import time

from bidding.store.engine import (
    IDLE_SINCE,
    WouldConnect,
    engines,
    is_sqlite,
    looking_at_idle,
)

#: Seconds a pooled server connection may stay unused before ``trim_idle`` closes it (one per
#: pool is always kept). Longer than the sweeper's slowest idle phase, so that a quiet node's
#: own rhythm does not open and close connections (a PostgreSQL connection costs a server
#: process's start, a few milliseconds).
IDLE_CLOSE_AFTER = 60.0
#: ``maybe_trim`` looks at most this often per process.
TRIM_EVERY = 15.0

_last = {"pid": 0, "at": 0.0}
_lock = threading.Lock()


def trim_idle(url: str, *, after: float = IDLE_CLOSE_AFTER) -> int:
    """Close this process's pooled connections to ``url``'s server that have been unused for
    ``after`` seconds, keeping the one returned last; return how many were closed.

    It takes the pool's idle connections (it opens none: ``looking_at_idle``), closes the
    stale ones and returns the rest. A thread that needs a connection
    meanwhile gets a new one from the pool, as at any peak.
    """
    if is_sqlite(url):
        return 0
    pool = engines(url).engine.pool
    if pool.checkedin() <= 1:  # type: ignore[attr-defined]
        return 0
    taken = []
    closed = 0
    with looking_at_idle():
        try:
            while pool.checkedin() > 0:  # type: ignore[attr-defined]
                taken.append(pool.connect())
        except WouldConnect:
            pass  # a slot whose connection was closed before: it stays in the pool, empty
        now = time.monotonic()
        # Oldest first. They go back in that order (their idle times unchanged), so that the
        # one returned last before is on top again and handed out next (LIFO).
        taken.sort(key=lambda c: c.info.get(IDLE_SINCE, now))
        for i, conn in enumerate(taken):
            if i < len(taken) - 1 and now - conn.info.get(IDLE_SINCE, now) >= after:
                conn.invalidate()  # closes the server connection; its slot opens one on demand
                closed += 1
            else:
                conn.close()
    return closed


def maybe_trim(url: str) -> int:
    """``trim_idle`` at most every ``TRIM_EVERY`` seconds per process (a node's heartbeat
    calls it on every beat)."""
    now = time.monotonic()
    with _lock:
        if _last["pid"] == os.getpid() and now - _last["at"] < TRIM_EVERY:
            return 0
        _last["pid"], _last["at"] = os.getpid(), now
    return trim_idle(url)
