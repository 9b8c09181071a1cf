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
import time

from sqlalchemy.pool import PoolProxiedConnection

from bidding.store.engine import (
    IDLE_SINCE,
    WouldConnect,
    engines,
    is_sqlite,
    looking_at_idle,
)
from bidding.store.forkguard import child_safe_lock, guard

#: Seconds a pooled server connection may stay unused before ``trim_idle`` closes it (one per
#: pool is always kept). Longer than the sweeper's slowest idle phase, so that a quiet node's
#: own rhythm does not open and close connections (a PostgreSQL connection costs a server
#: process's start, a few milliseconds).
IDLE_CLOSE_AFTER = 60.0
#: ``maybe_trim`` looks at most this often per process.
TRIM_EVERY = 15.0

_last = {"pid": 0, "at": 0.0}
_lock = child_safe_lock()


def trim_idle(url: str, *, after: float = IDLE_CLOSE_AFTER) -> int:
    """Close this process's pooled connections to ``url``'s server that have been unused for
    ``after`` seconds, keeping the one returned last; return how many were closed.

    Only while the process is quiet (none of its connections in use), it takes the pool's
    idle connections (opening none: ``looking_at_idle``), stopping as soon as another thread
    takes one, closes the stale ones and returns the rest. A thread that needs a connection
    meanwhile gets a new one from the pool, as at any peak.
    """
    if is_sqlite(url):
        return 0
    pool = engines(url).engine.pool
    if pool.checkedin() <= 1:  # type: ignore[attr-defined]
        return 0
    if pool.checkedout() > 0:  # type: ignore[attr-defined]
        return 0  # not quiet now: the next look
    taken: list[PoolProxiedConnection] = []
    closed = 0
    # Inside the fork guard, as a session is (closing a connection is a call into the driver).
    with guard.inside(), looking_at_idle():
        try:
            # Only what is idle, and only while nobody else is taking: a checkout finding
            # the pool empty would open a connection (refused here: ``WouldConnect``) or, with
            # every slot in use, wait for one (which a heartbeat must not do). At most one
            # try per slot idle now: an empty slot the pool kept would come back at every try.
            for _ in range(pool.checkedin()):  # type: ignore[attr-defined]
                if (pool.checkedin() == 0  # type: ignore[attr-defined]
                        or pool.checkedout() != len(taken)):  # type: ignore[attr-defined]
                    break
                try:
                    taken.append(pool.connect())
                except WouldConnect:
                    continue  # a slot without a connection: the pool has let it go
            now = time.monotonic()
            # Oldest first. They go back in that order (their idle times unchanged), so that
            # the one returned last before is on top again and handed out next (LIFO).
            taken.sort(key=lambda c: c.info.get(IDLE_SINCE, now))
            for conn in [c for c in taken[:-1] if now - c.info.get(IDLE_SINCE, now) >= after]:
                taken.remove(conn)
                conn.invalidate()  # closes the server connection; its slot leaves the pool
                closed += 1
        finally:
            for conn in taken:
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
