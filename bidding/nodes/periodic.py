"""A restartable daemon thread that calls a function every N seconds until stopped."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

#: Longest pause between two calls of a loop that keeps failing (unless its interval is longer).
BACKOFF_CAP = 5.0
#: A loop that keeps failing logs one line every this many failures.
REPEAT_EVERY = 10
#: A loop that found nothing this many passes in a row starts to slow down (``idle_pause``).
IDLE_PASSES = 5


def _doubled(start: float, times: int, cap: float) -> float:
    """``start`` doubled ``times`` times, at most ``cap``. Doubling stops at the cap: a counter
    that keeps growing (failures, idle passes) would otherwise overflow a float (2.0 ** 1024
    raises) and end the loop that asked."""
    pause = start
    for _ in range(times):
        pause *= 2.0
        if pause >= cap:
            return cap
    return pause


def pause_after(interval: float, failures: int) -> float:
    """Seconds before the next call of a loop whose last ``failures`` calls failed."""
    if failures <= 0 or not interval > 0:
        return interval
    return _doubled(interval, failures, max(interval, BACKOFF_CAP))


def idle_pause(base: float, empty_passes: int, longest: float) -> float:
    """Seconds before the next pass of a loop whose last ``empty_passes`` found nothing:
    ``base`` until ``IDLE_PASSES``, then doubling up to ``longest`` (never below ``base``: a
    loop configured slower stays as slow)."""
    if empty_passes < IDLE_PASSES or not base > 0:
        return base
    return max(base, _doubled(base, empty_passes - IDLE_PASSES + 1, longest))


class Periodic:
    """Call ``fn`` every ``interval`` seconds (with up to ``jitter`` fraction of randomness).

    ``interval`` may be a function, asked before every wait (e.g. to scale with the federation).

    Errors are logged and the loop goes on: a store hiccup must not silence a node for good.
    While it keeps failing (a database restarting, a broker down) it backs off, up to
    ``BACKOFF_CAP`` seconds between calls, and logs the first failure in full, then a line
    every ``REPEAT_EVERY`` failures, and one when it works again: an outage of a few seconds
    is a few lines in the log, not a traceback per call.
    """

    def __init__(self, name: str, interval: float | Callable[[], float],
                 fn: Callable[[], object], jitter: float = 0.0) -> None:
        self.name = name
        self.interval = interval
        self.fn = fn
        self.jitter = jitter
        self._stop = threading.Event()
        #: Set to end the current wait early: by ``wake`` (run now) or ``stop``.
        self._bell = threading.Event()
        #: Calls that failed in a row (the loop backs off while it is above 0).
        self.failures = 0
        self._thread: threading.Thread | None = None
        # Its own generator: a background thread drawing from the module's shared one would
        # move the random state of whatever the process runs meanwhile (a seeded simulation,
        # a property-based test).
        self._random = random.Random()

    def _interval(self) -> float:
        return self.interval() if callable(self.interval) else self.interval

    @property
    def running(self) -> bool:
        """True while the thread runs."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the loop (no-op when already running)."""
        if self.running:
            return
        self._stop, self._bell = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._stop, self._bell),
                                        name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None,
             wake: Callable[[], object] | None = None) -> None:
        """Stop the loop and wait for the current call to finish; ``wake`` (called once the
        loop is told to stop) returns a call that blocks on something else than the loop's
        own wait (a blocking pop)."""
        self._stop.set()
        self._bell.set()
        if wake is not None and self.running:
            wake()
        if self._thread is not None:
            self._thread.join(timeout=self._interval() + 5 if timeout is None else timeout)
            self._thread = None

    def wake(self) -> None:
        """Call ``fn`` now rather than at the end of the current wait (then wait as usual); a
        wake during a call runs ``fn`` once more right after it. A loop backing off after
        failures is better left to its backoff (``failures``)."""
        self._bell.set()

    def _run(self, stop: threading.Event, bell: threading.Event) -> None:
        self.failures = 0
        while True:
            bell.wait(pause_after(self._interval() * (
                1 + self._random.uniform(-self.jitter, self.jitter)), self.failures))
            # Cleared before stop is read: a stop that rings meanwhile is seen now, and a wake
            # is still honoured by the call below.
            bell.clear()
            if stop.is_set():
                return
            try:
                self.fn()
            except Exception as exc:
                self.failures += 1
                if self.failures == 1:
                    logger.exception("%s failed; trying again with backoff", self.name)
                elif self.failures % REPEAT_EVERY == 0:
                    logger.warning("%s still failing (%d times in a row): %s", self.name,
                                   self.failures, _one_line(exc))
            else:
                if self.failures:
                    logger.warning("%s works again, after %d failure(s)", self.name,
                                   self.failures)
                self.failures = 0


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__
