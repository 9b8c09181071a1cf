"""The simulation's state: what the store would hold, and the nodes' execution slots and queues.

Per node: episodes (task type, success, finish time) and in-flight work (awarded and not
finished: queued on the node or running). An awarded task waits in the node's execution queue
while all its slots are busy, as in Celery's ``exec.<node>`` queue. Time is in seconds, so the
production settings (``experience_window`` 10 episodes, ``recent_failure_seconds`` 3600 s)
apply unchanged.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from bench.simulation.federation import DURATION_SIGMA, NodeSpec, capable
from bench.simulation.tasks import Task
from bidding.auction.bid import NodeHistory
from bidding.config import Settings

SETTINGS = Settings()  # production defaults: experience_window, recent_failure_seconds, ...


@dataclass
class Record:
    """What happened to one task: its node (None: never awarded), outcome and times."""

    node: str | None = None
    success: bool = False
    start: float = math.nan
    finish: float = math.nan


@dataclass
class Sim:
    """State that the store would hold, and the execution slots and queues of the nodes."""

    specs: dict[str, NodeSpec]
    tasks: list[Task]
    rng: random.Random
    present: list[str] = field(default_factory=list)
    running: dict[str, int] = field(default_factory=dict)
    queue: dict[str, deque[Task]] = field(default_factory=dict)
    central: deque[Task] = field(default_factory=deque)
    #: Per (node, type): outcomes in finish order (newest last), and failure finish times.
    outcomes: dict[tuple[str, str], deque[bool]] = field(default_factory=dict)
    failures: dict[tuple[str, str], deque[float]] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    successes: dict[str, int] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    _events: list[tuple[float, int, str, Task]] = field(default_factory=list)
    _seq: int = 0

    def join(self, name: str) -> None:
        """The node registers: it is present, with free slots and an empty queue."""
        self.present.append(name)
        self.running[name] = 0
        self.queue[name] = deque()

    def in_flight(self, name: str) -> int:
        """ASSIGNED or EXECUTING on the node: queued there or running."""
        return self.running[name] + len(self.queue[name])

    def history(self, node: str, task_type: str, now: float) -> NodeHistory:
        """What ``bidding.auction.history.gather_history`` would read from the store at ``now``."""
        key = (node, task_type)
        latest = self.outcomes.get(key, ())
        fails = self.failures.get(key)
        cutoff = now - SETTINGS.recent_failure_seconds
        if fails:
            while fails and fails[0] < cutoff:
                fails.popleft()
        return NodeHistory(
            outcomes=tuple(reversed(latest)),
            recent_failures=len(fails) if fails else 0,
            in_flight=self.in_flight(node),
            attempts=self.attempts[node],
            successes=self.successes[node],
        )

    def start(self, task: Task, node: str, now: float) -> None:
        """Run ``task`` on a free slot of ``node``: its outcome and finish are drawn now."""
        spec = self.specs[node]
        self.running[node] += 1
        ok = task.u_ok < spec.p_true[task.task_type] * task.p_factor
        duration = (spec.mean_s[task.task_type] * task.dur_factor
                    * math.exp(DURATION_SIGMA * task.z_dur - DURATION_SIGMA ** 2 / 2))
        rec = self.records[task.idx]
        rec.node, rec.success, rec.start, rec.finish = node, ok, now, now + duration
        self._seq += 1
        heapq.heappush(self._events, (now + duration, self._seq, node, task))

    def assign(self, task: Task, node: str, now: float) -> None:
        """Award: start at once if a slot is free, else wait in the node's queue."""
        self.records[task.idx].node = node
        if self.running[node] < self.specs[node].profile.capacity:
            self.start(task, node, now)
        else:
            self.queue[node].append(task)

    def complete(self, task: Task, node: str, now: float) -> None:
        """The task finishes: record the episode, free the slot, take the next task."""
        self.running[node] -= 1
        ok = self.records[task.idx].success
        key = (node, task.task_type)
        self.outcomes.setdefault(key, deque(maxlen=SETTINGS.experience_window)).append(ok)
        if not ok:
            self.failures.setdefault(key, deque()).append(now)
        self.attempts[node] += 1
        self.successes[node] += int(ok)
        self.pull(node, now)

    def pull(self, node: str, now: float) -> None:
        """A free slot takes the next task of the node's queue, else of the central queue."""
        spec = self.specs[node]
        while self.running[node] < spec.profile.capacity:
            if self.queue[node]:
                self.start(self.queue[node].popleft(), node, now)
                continue
            nxt = next((t for t in self.central if capable(spec, t.skills)), None)
            if nxt is None:
                return
            self.central.remove(nxt)
            self.start(nxt, node, now)

    def advance(self, until: float) -> None:
        """Complete every task that finishes by ``until``, in finish order."""
        while self._events and self._events[0][0] <= until:
            when, _, node, task = heapq.heappop(self._events)
            self.complete(task, node, when)


#: A policy: (sim, task, now) -> the node awarded, or None (FIFO: central queue; auctions: no
#: award, the task fails with NoBidsError as with the production default no_bid="fail").
Policy = Callable[[Sim, Task, float], str | None]
