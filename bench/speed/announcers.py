"""Bursts from several announcing processes, and nodes that are registered but not running.

``--announcers 1,2,4``: a burst of ``--burst`` auctions is split over that many announcing
processes (spawned, each with the caller's environment and its own connections), started
together; auctions/s is the burst over the time from the start signal to the last result.
On a store that serializes independent auctions it stays flat as announcers are added.

``--registered N``: N - (running nodes) more node rows, heartbeating and with published
profiles, as a federation of N nodes has them; their skill is not the benchmark task's, so
every auction reads, filters and skips them (``select_candidates``) without awarding them
work no worker would run.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from typing import Any

from bench.common.log import log

SPAWN = multiprocessing.get_context("spawn")
#: The skill of the registered-only nodes (not the benchmark task's).
IDLE_SKILL = "bench_registered"


def _announce(count: int, offset: int, ready: Any, go: Any, out: Any) -> None:
    """Child: warm up, wait for the signal, announce ``count`` auctions, get every result."""
    from bench.app import auction_noop

    auction_noop.delay(-1).get(timeout=60)  # connections and caches, before the clock
    ready.put(True)
    go.wait()
    pending = [auction_noop.delay(offset + i) for i in range(count)]
    failures = 0
    for result in pending:
        try:
            result.get(timeout=120)
        except Exception:
            failures += 1
    out.put((time.time(), failures))


def burst_from(processes: int, burst: int) -> dict[str, Any]:
    """``burst`` auctions from ``processes`` announcing processes at once: auctions/s."""
    ready, out, go = SPAWN.Queue(), SPAWN.Queue(), SPAWN.Event()
    share = [burst // processes + (1 if i < burst % processes else 0) for i in range(processes)]
    children = [SPAWN.Process(target=_announce, args=(n, 10**6 * (i + 1), ready, go, out))
                for i, n in enumerate(share)]
    for child in children:
        child.start()
    try:
        for _ in children:
            ready.get(timeout=120)
        start = time.time()
        go.set()
        ends = [out.get(timeout=300) for _ in children]
    finally:
        for child in children:
            child.join(30)
            if child.is_alive():
                child.kill()
    took = max(end for end, _ in ends) - start
    failures = sum(f for _, f in ends)
    return {"processes": processes, "n": burst, "per_s": burst / took,
            "failures": failures}


def measure_announcers(counts: list[int], burst: int) -> list[dict[str, Any]]:
    """``burst_from`` each count of announcers, in order."""
    out = []
    for processes in counts:
        log(f"burst of {burst} auctions from {processes} announcing process(es)")
        r = burst_from(processes, burst)
        log(f"  {r['per_s']:.1f} auctions/s; {r['failures']} failed")
        out.append(r)
    return out


class RegisteredNodes:
    """``count`` node rows that heartbeat (one UPDATE every interval) but run nothing."""

    def __init__(self, settings: Any, count: int) -> None:
        self.settings = settings
        self.names = [f"registered{i:04d}" for i in range(count)]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Register them (a heartbeat with a published profile each) and keep them live."""
        from bidding.nodes.heartbeat import heartbeat
        from bidding.nodes.profile import NodeProfile

        for name in self.names:
            heartbeat(self.settings, NodeProfile(name=name, capabilities=[IDLE_SKILL],
                                                 description="registered, not running"))
        self._thread = threading.Thread(target=self._beat, daemon=True,
                                        name="registered-nodes")
        self._thread.start()

    def _beat(self) -> None:
        from sqlalchemy import update

        from bidding.store import write_session
        from bidding.store.schema import Node

        while not self._stop.wait(self.settings.heartbeat_interval):
            with write_session(self.settings.database_url) as session:
                session.execute(update(Node).where(Node.name.in_(self.names))
                                .values(last_heartbeat=time.time()))

    def stop(self) -> None:
        """Stop beating (the rows stay, and go stale)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
