"""One clock for the whole federation: the store's.

Every time this project writes or compares (a heartbeat, an auction's closing time, a due
retry, a watchdog's deadline, a check's due time) is read from :func:`now`, which is the
store's clock as this process last read it, carried forward on this process's monotonic
clock. Hosts whose wall clocks disagree (a node 30 s fast, a sweeper 10 s slow) then still
agree on every comparison: none sees a live node as dead, or a running task as late.

Why not each host's ``time.time()``: a heartbeat stamped by one host and judged by another
compares two clocks, and a sweeper whose clock ran 10 s fast saw every node dead and
re-awarded running tasks, which then ran twice. Why carried on the monotonic clock: a wall
clock that is stepped (NTP, a virtual machine resumed) between two reads moves it, the
monotonic clock does not. The store layer (``bidding.store.clock``) reads the store's time
when a process first uses the store and again every ``SYNC_EVERY`` seconds; until then, and
on a store with no clock of its own (SQLite: one host by nature), :func:`now` is this host's
``time.time()``.

Pure: no Celery, kombu, Redis or SQLAlchemy here, so the models' timestamps use it too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Reading:
    """The store's time read once: what it said, and this process's monotonic time then."""

    #: The store's clock (Unix seconds) at the middle of the round trip that read it.
    server: float
    #: ``time.monotonic()`` at that moment.
    monotonic: float
    #: Which store it came from (its normalized URL), and how long the round trip took.
    source: str = ""
    round_trip: float = 0.0

    def at(self, monotonic: float) -> float:
        """The store's time when this process's monotonic clock reads ``monotonic``."""
        return self.server + (monotonic - self.monotonic)

    @property
    def offset(self) -> float:
        """How far this host's wall clock is behind the store's (seconds; negative: ahead),
        as of now."""
        return self.at(time.monotonic()) - time.time()


_reading: Reading | None = None


def now() -> float:
    """The federation's time now (Unix seconds): the store's clock, carried forward from its
    latest reading on this process's monotonic clock; this host's clock before any reading."""
    reading = _reading
    if reading is None:
        return time.time()
    return reading.at(time.monotonic())


def current() -> Reading | None:
    """The reading :func:`now` is based on (None: this host's clock)."""
    return _reading


def adopt(reading: Reading | None) -> None:
    """Base :func:`now` on ``reading`` from now on (None: this host's clock)."""
    global _reading
    _reading = reading
