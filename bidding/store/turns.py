"""A quiet process's background passes take turns at the store, so that it needs one connection.

A node worker's background loops (its heartbeat, the sweeper lease, each sweep phase, the
watch) run on threads of their own, so that one that blocks (a half-open connection until its
timeout, a store waiting for a lock) cannot stop the others. While the federation is idle each
pass is a statement or two, a few milliseconds, yet six loops on one node met often enough
(about every four seconds on the sweeping node) that its pool kept a second connection open for
good, and on PostgreSQL every connection is a server process.

An idle pass first takes this process's turn (``quiet_turn``), waiting for it at most
``QUIET_TURN_WAIT`` seconds: passes that would have met run one after the other on the same
connection, and one that blocks holds the others up by that wait at most, after which they run
as before (on a second connection, which ``store.trim`` closes once it goes unused). Busy passes
never wait: a phase that found work runs at once, as many at a time as the loops need.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from bidding.store.forkguard import child_safe_lock

#: Seconds an idle pass waits for the turn before it runs anyway. A quiet pass takes a few
#: milliseconds; one that takes longer is blocked, and the others must not wait on it for long.
QUIET_TURN_WAIT = 0.2

#: A fork copies a lock as it was: held, if a loop of the parent had its turn, and no thread
#: of the child would ever release it; this one is free in a forked child.
_turn = child_safe_lock()


@contextmanager
def quiet_turn(wait: float = QUIET_TURN_WAIT, *, idle: bool = True) -> Iterator[bool]:
    """Run the block on this process's turn at the store, waiting at most ``wait`` seconds
    for it; yield whether it was taken (False: it ran anyway, beside the pass that held it).
    A pass that is not ``idle`` (its loop found work lately) runs at once, without the turn."""
    turn = _turn
    taken = idle and turn.acquire(timeout=wait)
    try:
        yield taken
    finally:
        if taken:
            turn.release()
