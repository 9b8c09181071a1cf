"""Reading the store's clock, so that every process of the federation keeps one time
(``bidding.clock``).

PostgreSQL's ``clock_timestamp()`` is read when a process first uses the store and again
every ``SYNC_EVERY`` seconds, on the connection's autocommit engine (one round trip; the
reading is taken as of the middle of it, so it is off by at most half a round trip). A
store whose time cannot be read now (a restart, a dropped connection) keeps the previous
reading and is tried again ``RETRY_AFTER`` seconds later. SQLite runs on one host by nature:
its clock is that host's, and nothing is read.

A process uses one store; if it uses several (tests do), the clock follows the one it used
last, so the comparisons it makes on each store's rows are on that store's clock.
"""

from __future__ import annotations

import logging
import math
import time

from sqlalchemy import Engine, text

from bidding import clock
from bidding.store.forkguard import child_safe_lock, guard

logger = logging.getLogger(__name__)

#: Seconds between two readings of the store's clock (a monotonic clock drifts by
#: microseconds over this time; a store whose own clock was stepped is followed within it).
SYNC_EVERY = 30.0
#: Seconds before a reading that failed is tried again.
RETRY_AFTER = 5.0
#: Seconds after which a reading that could not be refreshed is worth a warning.
STALE_AFTER = 10 * SYNC_EVERY
#: Seconds a thread waits for another thread's first reading of a store before going on
#: with the clock it has.
FIRST_READ_WAIT = 5.0
#: A refresh whose round trip took longer than this, and than ``ROUGH_FACTOR`` times the
#: reading it would replace, is dropped for that reading (carried on the monotonic clock, it
#: stays right): a reading is off by up to half its round trip, and a process descheduled in
#: the middle of one (a loaded host) would move the federation's time by seconds, enough for
#: a watchdog to take a live node for dead. It is tried again ``RETRY_AFTER`` seconds later;
#: a reading older than ``STALE_AFTER`` is replaced whatever its successor's round trip.
ROUGH_ROUND_TRIP = 0.5
ROUGH_FACTOR = 4.0

_SERVER_NOW = text("SELECT extract(epoch FROM clock_timestamp())")

_lock = child_safe_lock()
#: The store the current reading came from ("" before any), and when (monotonic) to read
#: it again.
_source = ""
_next_read = 0.0
#: When (monotonic) a store whose reading failed may be tried again, by store.
_retry_at: dict[str, float] = {}


def keep_current(source: str, engine: Engine, *, local: bool) -> None:
    """Make :func:`bidding.clock.now` the clock of the store ``source`` (its normalized URL),
    reading it through ``engine`` (autocommit) when the reading is missing or due. ``local``:
    the store runs on this host (SQLite), whose clock is the store's."""
    if source == _source and time.monotonic() < _next_read:
        return  # the usual case: one comparison per session
    switching = source != _source
    # A thread that meets another one's first reading of this store waits for it (its
    # timestamps must be on the store's clock); a due refresh is left to the one doing it.
    if not _lock.acquire(timeout=FIRST_READ_WAIT if switching else 0):
        return
    try:
        _read(source, engine, local=local)
    finally:
        _lock.release()


def _read(source: str, engine: Engine, *, local: bool) -> None:
    global _source, _next_read
    started = time.monotonic()
    if source == _source and started < _next_read:
        return  # another thread read it while this one waited
    if local:
        clock.adopt(None)
        _source, _next_read = source, math.inf
        return
    if started < _retry_at.get(source, 0.0):
        return
    try:
        # Inside the fork guard, as a session is: no pool process is forked while this
        # thread is in the driver (opening a connection takes the C library's own locks).
        with guard.inside(), engine.connect() as connection:
            sent = time.monotonic()
            server = connection.execute(_SERVER_NOW).scalar_one()
            received = time.monotonic()
    except Exception as exc:
        # Kept: the previous reading (carried on the monotonic clock, it stays right for
        # far longer than an outage), or this host's clock before the first one.
        _retry_at[source] = time.monotonic() + RETRY_AFTER
        first = (str(exc).strip().splitlines() or [""])[0]
        # Before the first reading the session that follows meets the same error and says
        # so, and a refresh that fails now and then (a dropped connection) changes nothing:
        # the previous reading stays right. A reading kept far longer than planned is news.
        previous = clock.current()
        had = previous is not None
        stale = previous is not None and time.monotonic() - previous.monotonic > STALE_AFTER
        logger.log(logging.WARNING if stale else logging.INFO,
                   "could not read the store's clock (%s: %s); keeping %s, trying again in "
                   "%gs", type(exc).__name__, first,
                   "the previous reading" if had else "this host's clock", RETRY_AFTER)
        return
    reading = clock.Reading(server=float(server), monotonic=(sent + received) / 2,
                            source=source, round_trip=received - sent)
    previous = clock.current()
    if previous is not None and previous.source == source and rougher(reading, previous):
        _next_read = received + RETRY_AFTER
        logger.info("the store's clock read in a %.2fs round trip: keeping the previous "
                    "reading (%.3fs), trying again in %gs", reading.round_trip,
                    previous.round_trip, RETRY_AFTER)
        return
    clock.adopt(reading)
    _retry_at.pop(source, None)
    _source, _next_read = source, received + SYNC_EVERY
    if previous is None or previous.source != source:
        offset = reading.offset
        if abs(offset) >= 1.0:
            # Worth saying once: this host's clock is off, and the federation's is used.
            logger.warning("this host's clock is %.1fs %s the store's; using the store's",
                           abs(offset), "behind" if offset > 0 else "ahead of")


def rougher(reading: clock.Reading, previous: clock.Reading) -> bool:
    """Whether ``reading`` is too rough to replace ``previous`` (see ``ROUGH_ROUND_TRIP``)."""
    return (reading.round_trip > max(ROUGH_ROUND_TRIP, ROUGH_FACTOR * previous.round_trip)
            and reading.monotonic - previous.monotonic < STALE_AFTER)


def forget() -> None:
    """Drop the reading (tests; a process that changes stores reads the new one anyway)."""
    global _source, _next_read
    with _lock:
        clock.adopt(None)
        _source, _next_read = "", 0.0
        _retry_at.clear()
