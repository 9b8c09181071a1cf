"""Calls on a thread pool that report once: with what they returned or raised, or at their
deadline that they did not return in time.

A node's own bidder (user code, or an LLM call) may take seconds or never return. The thread
that hands it a bid request must not wait for it: a node answers its other bid requests, and
runs its executions, meanwhile. ``TimedCalls.submit`` therefore returns at once; the call runs
on the pool, and one watcher thread reports the calls whose deadline passes first. A call that
outlives its deadline keeps its pool thread until it returns (Python cannot stop a thread):
the pool is sized for that, and a call still queued at its deadline is dropped unrun. At most
``limit`` calls wait for a thread: one more is refused at once (``Overloaded``), so that a
stuck function cannot pile up calls without end. The threads are daemons, so a call that
never returns does not keep its worker from exiting (``concurrent.futures`` joins its threads
at exit).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """How a timed call ended: ``value`` returned, ``error`` raised, or ``timed_out``."""

    value: Any = None
    error: BaseException | None = None
    timed_out: bool = False
    #: Seconds from submit to this outcome.
    elapsed: float = 0.0


@dataclass
class _Call:
    done: Callable[[Outcome], None]
    started: float
    settled: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def settle(self, outcome: Outcome) -> None:
        """Report ``outcome`` unless another one was reported first."""
        with self.lock:
            if self.settled:
                return
            self.settled = True
        try:
            self.done(outcome)
        except Exception:  # the reporter's own failure must not kill a pool or watcher thread
            logger.exception("reporting a timed call's outcome failed")


class Overloaded(RuntimeError):
    """``TimedCalls.submit`` found ``limit`` calls waiting for a thread already."""


class TimedCalls:
    """A pool of ``threads`` threads running calls, each reported once (``submit``), with at
    most ``limit`` calls waiting for a thread."""

    def __init__(self, name: str, threads: int, limit: int) -> None:
        self.name = name
        self.threads = threads
        self.limit = limit
        self._queue: queue.SimpleQueue[tuple[Callable[[], Any], _Call] | None] = (
            queue.SimpleQueue())
        self._workers: list[threading.Thread] = []
        #: Threads waiting for a call, and calls queued that no thread has taken yet.
        self._idle = 0
        self._pending = 0
        self._deadlines: list[tuple[float, int, _Call]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._watcher: threading.Thread | None = None
        self._closed = False

    def submit(self, fn: Callable[[], Any], timeout: float,
               done: Callable[[Outcome], None]) -> None:
        """Run ``fn()`` on the pool; ``done`` gets its outcome, or a timed-out one after
        ``timeout`` seconds, whichever comes first, on a pool or watcher thread.

        Raises ``Overloaded`` (``done`` is not called) when ``limit`` calls are waiting."""
        call = _Call(done, time.monotonic())
        with self._wake:
            if self._closed:
                raise RuntimeError(f"{self.name}: closed")
            # (A call that timed out while waiting still counts until a thread takes it off
            # the queue: while every thread is stuck, that is what the limit is for.)
            if self._pending >= self.limit:
                raise Overloaded(f"{self.name}: {self._pending} call(s) waiting, at most "
                                 f"{self.limit}")
            heapq.heappush(self._deadlines, (call.started + timeout, next(self._order), call))
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name=f"{self.name}-watch",
                                                 daemon=True)
                self._watcher.start()
            self._wake.notify()
            # A thread more while the calls queued outnumber the idle threads, up to the size.
            self._pending += 1
            if self._pending > self._idle and len(self._workers) < self.threads:
                worker = threading.Thread(target=self._work, daemon=True,
                                          name=f"{self.name}-{len(self._workers)}")
                self._workers.append(worker)
                worker.start()
        self._queue.put((fn, call))

    def _work(self) -> None:
        while True:
            with self._wake:
                self._idle += 1
            item = self._queue.get()
            with self._wake:
                self._idle -= 1
                if item is not None:
                    self._pending -= 1
            if item is None:
                return
            fn, call = item
            if not call.settled:  # else it timed out while queued: never run
                try:
                    value = fn()
                except BaseException as exc:  # reported, not raised: nobody waits for it
                    call.settle(Outcome(error=exc, elapsed=time.monotonic() - call.started))
                else:
                    call.settle(Outcome(value=value, elapsed=time.monotonic() - call.started))

    def _watch(self) -> None:
        while True:
            with self._wake:
                while not self._deadlines and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                deadline, _, call = self._deadlines[0]
                if call.settled:
                    heapq.heappop(self._deadlines)
                    continue
                left = deadline - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                heapq.heappop(self._deadlines)
            call.settle(Outcome(timed_out=True, elapsed=time.monotonic() - call.started))

    def close(self) -> None:
        """Stop reporting deadlines and let no new call start; calls running finish alone."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()
            workers = len(self._workers)
        for _ in range(workers):
            self._queue.put(None)
