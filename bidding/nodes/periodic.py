"""A restartable daemon thread that calls a function every N seconds until stopped."""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)


class Periodic:
    """Call ``fn`` every ``interval`` seconds (with up to ``jitter`` fraction of randomness).

    ``interval`` may be a function, asked before every wait (e.g. to scale with the federation).

    Errors are logged and the loop goes on: a store hiccup must not silence a node for good.
    """

    def __init__(self, name: str, interval: float | Callable[[], float],
                 fn: Callable[[], object], jitter: float = 0.0) -> None:
        self.name = name
        self.interval = interval
        self.fn = fn
        self.jitter = jitter
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self._stop,), name=self.name,
                                        daemon=True)
        self._thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop the loop and wait for the current call to finish."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._interval() + 5 if timeout is None else timeout)
            self._thread = None

    def _run(self, stop: threading.Event) -> None:
        while not stop.wait(self._interval() * (1 + random.uniform(-self.jitter, self.jitter))):
            try:
                self.fn()
            except Exception:
                logger.exception("%s failed", self.name)
