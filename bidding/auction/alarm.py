"""Announce on time the retries and the countdowns this process scheduled.

A retry's backoff ends at a time the node that failed knows. The sweeper announces due tasks at
its passes of ``announce_due``, and an idle federation's sweeper makes those once a second
(``sweeper.IDLE_INTERVAL``, +-25%): alone, it would turn a 0.5 s backoff into up to 1.75 s.
So the process that scheduled a retry also sets an alarm for it: one daemon thread per process
keeps the times and, at each, announces the tasks then due among those it was given. A caller's
``countdown`` or ``eta`` is the same: the idle sweeper wakes for the next due task it read, but
one scheduled after that read waited for its next pass (up to 1.25 s late); the calling process
sets an alarm for it too.

The sweeper stays the fallback (this process killed or recycled before its alarm rings, the
store unreachable then). The alarm and the sweeper may find one retry due together: each claims
it first (``due_claim``), so one attempt is announced once. A retry further away than
``HORIZON`` gets no alarm: a second next to minutes of backoff is noise, and the thread holds
no far future.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
from collections.abc import Callable

from bidding import clock
from bidding.auction.announce import announce_due
from bidding.context import Context

logger = logging.getLogger(__name__)

#: Retries and countdowns due further away than this many seconds are left to the sweeper.
HORIZON = 60.0

#: What an alarm does when it rings: announce these tasks if they are due (``announce_due``).
Announcer = Callable[[Context, list[str]], object]


def _announce(ctx: Context, task_ids: list[str]) -> object:
    return announce_due(ctx, task_ids=task_ids)


class Alarm:
    """A heap of (time, task) and the one thread that wakes for each; started on first use,
    and again in a forked child (a prefork pool's process does not inherit the thread)."""

    def __init__(self, announce: Announcer = _announce) -> None:
        self.announce = announce
        self._order = itertools.count()
        self._fresh()

    def _fresh(self) -> None:
        """No alarms, no thread: as built, and in a forked child (whose copy of the lock may
        have been held by the parent's thread at the fork)."""
        self._due: list[tuple[float, int, str, Context]] = []
        self._changed = threading.Condition()
        self._pid: int | None = None

    def set(self, ctx: Context, task_id: str, at: float) -> bool:
        """Announce ``task_id`` at ``at`` (the store's clock, ``clock.now()``), if due then.
        False when it is beyond ``HORIZON`` (the sweeper's)."""
        if at - clock.now() > HORIZON:
            return False
        with self._changed:
            if self._pid != os.getpid():  # first use here (a forked child starts ``_fresh``)
                self._pid = os.getpid()
                threading.Thread(target=self._ring, name="bidding-alarm",
                                 daemon=True).start()
            heapq.heappush(self._due, (at, next(self._order), task_id, ctx))
            self._changed.notify()
        return True

    def clear(self) -> None:
        """Drop the alarms not rung yet (tests that stop a federation with some set)."""
        with self._changed:
            self._due.clear()

    def pending(self) -> int:
        """Alarms not rung yet."""
        with self._changed:
            return len(self._due)

    def _ring(self) -> None:
        while True:
            with self._changed:
                while not self._due or self._due[0][0] > clock.now():
                    self._changed.wait(None if not self._due
                                       else max(0.0, self._due[0][0] - clock.now()))
                now = clock.now()
                # One look per store and app for the tasks due together (each caller builds
                # a Context of its own).
                ringing: dict[tuple[str, int], tuple[Context, list[str]]] = {}
                while self._due and self._due[0][0] <= now:
                    _, _, task_id, ctx = heapq.heappop(self._due)
                    key = (ctx.settings.database_url, id(ctx.app))
                    ringing.setdefault(key, (ctx, []))[1].append(task_id)
            for ctx, task_ids in ringing.values():
                try:
                    self.announce(ctx, task_ids)
                except Exception as exc:  # the sweeper announces them at its next pass
                    logger.warning("announcing %s at their time failed (%s); the "
                                   "sweeper will", ", ".join(task_ids), exc)


#: This process's alarm.
ALARM = Alarm()
os.register_at_fork(after_in_child=ALARM._fresh)


def announce_at(ctx: Context, task_id: str, at: float) -> bool:
    """Set this process's alarm: announce ``task_id`` at ``at`` if it is due then."""
    return ALARM.set(ctx, task_id, at)
