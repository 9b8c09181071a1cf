"""A thread pool that holds a bounded number of calls: ``try_submit`` says no when it is full.

``concurrent.futures.ThreadPoolExecutor`` queues without end: a node flooded with bid requests
faster than its threads answer them would hold every one in memory, each answered long after
its auction closed. This pool holds at most ``threads + queue`` calls (running or waiting);
its caller decides what a call it cannot take becomes (a bid request: a refusal at once).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, ParamSpec

P = ParamSpec("P")


class BoundedPool:
    """``threads`` threads, and room for ``queue`` calls waiting for one."""

    def __init__(self, threads: int, queue: int, name: str) -> None:
        self.threads = threads
        self.queue = queue
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
        self._held = 0
        self._lock = threading.Lock()

    @property
    def held(self) -> int:
        """Calls running or waiting now."""
        return self._held

    def try_submit(self, fn: Callable[P, Any], *args: P.args, **kwargs: P.kwargs) -> bool:
        """Run ``fn(*args, **kwargs)`` on the pool; False (and nothing runs) when it is full."""
        with self._lock:
            if self._held >= self.threads + self.queue:
                return False
            self._held += 1
        try:
            future = self._pool.submit(fn, *args, **kwargs)
        except BaseException:
            self._release()
            raise
        future.add_done_callback(self._done)
        return True

    def _done(self, _: Future[Any]) -> None:
        self._release()

    def _release(self) -> None:
        with self._lock:
            self._held -= 1

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        """Stop taking calls; see ``ThreadPoolExecutor.shutdown``."""
        self._pool.shutdown(wait=wait, cancel_futures=cancel_futures)
