"""No fork while a thread of this process is inside the store.

A Celery prefork worker forks a new pool process whenever one dies (a hard time limit, a
``max_tasks_per_child``). The node worker's main process runs threads that use the store all the
time (bids, awards, sweeps, heartbeats). POSIX copies only the forking thread into the child, and
the SQLite library's own mutexes are copied in whatever state they were: if another thread was
inside SQLite at that moment, the child's first SQLite call waits for ever. The task handed to
that pool process then never starts (reproduced: 5 children of 200 hung, forked while three
threads wrote to a SQLite store; ``tests/unit/test_forkguard.py``).

So store sessions hold the guard shared, and a fork (``os.register_at_fork``) takes it
exclusively: it waits until no thread is inside the store (sessions are milliseconds long), keeps
new sessions out while ``fork()`` runs, and lets them in again after. A thread that forks while
inside a session itself does not wait for itself. The wait is bounded: after ``FORK_WAIT``
seconds the fork goes ahead and a warning says so.

The same copy holds for Python's own locks: one that a thread of the parent held at the fork
stays held in the child, where no thread will ever release it. The module-level locks that a
pool process may take (caches, the clock's reading, the engines) are made with
``child_safe_lock``: a forked child gets each of them free, as ``logging`` does for its
handlers' locks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

logger = logging.getLogger(__name__)

#: Seconds a fork waits for the store's sessions to end before going ahead anyway.
FORK_WAIT = 10.0


class ForkGuard:
    """Shared by store sessions, exclusive for ``fork()``; re-entrant per thread."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._inside = 0  # sessions open in all threads
        self._forking = False
        self._local = threading.local()

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    @contextmanager
    def inside(self) -> Iterator[None]:
        """Hold the guard shared while the body uses the store."""
        depth = self._depth()
        if depth == 0:
            with self._cond:
                while self._forking:
                    self._cond.wait()
                self._inside += 1
        self._local.depth = depth + 1
        try:
            yield
        finally:
            self._local.depth = depth
            if depth == 0:
                with self._cond:
                    self._inside -= 1
                    if self._inside == 0:
                        self._cond.notify_all()

    def before_fork(self) -> None:
        """Wait until no other thread is inside the store, and keep them out (lock held)."""
        self._cond.acquire()
        self._forking = True
        mine = 1 if self._depth() else 0
        deadline = time.monotonic() + FORK_WAIT
        while self._inside > mine:
            left = deadline - time.monotonic()
            if left <= 0:
                logger.warning("forking while %d thread(s) use the store: the child must not "
                               "use the connections they hold", self._inside - mine)
                break
            self._cond.wait(left)

    def after_fork_in_parent(self) -> None:
        """Let sessions in again."""
        self._forking = False
        self._cond.notify_all()
        self._cond.release()

    def after_fork_in_child(self) -> None:
        """A fresh guard: only this thread exists in the child."""
        depth = self._depth()
        self._reset()
        self._inside = 1 if depth else 0
        self._local.depth = depth


guard = ForkGuard()

#: The locks a forked child gets free (``child_safe_lock``).
_child_safe: list[threading.Lock] = []


def child_safe_lock() -> threading.Lock:
    """A module-level lock that a forked child gets free, whoever held it in the parent.

    For a lock the process keeps for its lifetime (each one is remembered): a cache's, a
    reading's. The child starts with its parent's data as it was; only its locks are new.
    Never fork while holding one: the child's would be free, and its release would raise.
    (Celery forks pool processes from its main thread, which holds none.)"""
    lock = threading.Lock()
    _child_safe.append(lock)
    return lock


def _free_locks_in_child() -> None:
    for lock in _child_safe:
        # CPython's own way (threading, logging and concurrent.futures use it): the lock
        # object stays the one the modules hold, unlocked, with nothing waiting on it.
        cast_lock: Any = lock
        cast_lock._at_fork_reinit()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(before=guard.before_fork, after_in_parent=guard.after_fork_in_parent,
                        after_in_child=guard.after_fork_in_child)
    os.register_at_fork(after_in_child=_free_locks_in_child)
