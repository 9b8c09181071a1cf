"""The simulation's state: what the store would hold, and the nodes' execution slots and queues.

Per node: episodes (task type, success, finish time) and in-flight work (awarded and not
finished: queued on the node or running). An awarded task waits in the node's execution queue
while all its slots are busy, as in Celery's ``exec.<node>`` queue. Time is in seconds, so the
production settings (``experience_window`` 10 episodes, read with the 20 before them as
``Settings.episodes_read`` says, ``recent_failure_seconds`` 3600 s) apply unchanged.

Resources (a task's ``needs``, a node's ``profile.resources``): a node starts an attempt only
while its running attempts leave room (``bidding.resources.fits``), as the live node does; its
queue is admitted in arrival order, the head waiting until it fits and nothing behind it
starting first (no bypass: a big attempt is never starved by small ones arriving after it).
With ``enforce=False`` (slot-counting FIFO) memory is ignored and every start that leaves a
node holding more than it declares is counted as a misplacement. ``drift`` changes a node's
true success rate from a given time on.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from bench.simulation.federation import DURATION_SIGMA, NodeSpec, capable
from bench.simulation.tasks import Task
from bidding import resources
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
    #: Why it queued on its node at the award: "" (started at once), "slots" (every slot busy),
    #: "room" (a slot free but its needs do not fit yet), "behind" (behind a waiting attempt).
    queued: str = ""


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
    #: Per (node, type): finished attempts and successes (``nodes.records``' rows).
    typed: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)
    #: False: slot counting only, a start ignores the node's resources (FIFO's view).
    enforce: bool = True
    #: Node -> (from this time on, its true success rate for every type).
    drift: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: Per node: what its running attempts hold, and what its unfinished ones reserve (queued
    #: or running: the award's ``Room.reserved``).
    held: dict[str, dict[str, float]] = field(default_factory=dict)
    reserved: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Starts that left a node holding more than it declares, and among them starts of a task
    #: its node could never hold.
    misplaced: int = 0
    never_fits: int = 0
    #: Integrals over [0, horizon] of what every node holds (resource-seconds), and of the part
    #: within what it declares.
    horizon: float = math.inf
    held_seconds: dict[str, float] = field(default_factory=dict)
    usable_seconds: dict[str, float] = field(default_factory=dict)
    _clock: float = 0.0
    _events: list[tuple[float, int, str, Task]] = field(default_factory=list)
    _seq: int = 0

    def join(self, name: str) -> None:
        """The node registers: it is present, with free slots and an empty queue."""
        self.present.append(name)
        self.running[name] = 0
        self.queue[name] = deque()
        self.held[name] = {}
        self.reserved[name] = {}

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
        newest_first = tuple(reversed(latest))
        window = SETTINGS.experience_window
        return NodeHistory(
            outcomes=newest_first[:window],
            earlier=newest_first[window:],
            recent_failures=len(fails) if fails else 0,
            in_flight=self.in_flight(node),
            attempts=self.attempts[node],
            successes=self.successes[node],
            record=self.typed.get(key, (0, 0)),
        )

    def _tick(self, now: float) -> None:
        """Add what the nodes held since the last change to the integrals (up to horizon)."""
        dt = min(now, self.horizon) - min(self._clock, self.horizon)
        if dt > 0:
            for name, held in self.held.items():
                totals = self.specs[name].profile.resources
                for res, amount in held.items():
                    self.held_seconds[res] = self.held_seconds.get(res, 0.0) + amount * dt
                    self.usable_seconds[res] = (self.usable_seconds.get(res, 0.0)
                                                + min(amount, totals.get(res, 0.0)) * dt)
        self._clock = max(self._clock, now)

    @staticmethod
    def _add(book: dict[str, float], needs: Mapping[str, float], sign: float) -> None:
        for res, amount in needs.items():
            book[res] = book.get(res, 0.0) + sign * amount

    def room_for(self, task: Task, node: str) -> bool:
        """Whether ``task`` may start on ``node`` now as far as its resources go."""
        return not self.enforce or resources.fits(
            task.needs, self.specs[node].profile.resources, self.held[node])

    def start(self, task: Task, node: str, now: float) -> None:
        """Run ``task`` on a free slot of ``node``: its outcome and finish are drawn now."""
        spec = self.specs[node]
        self.running[node] += 1
        if task.needs:
            self._tick(now)
            self._add(self.held[node], task.needs, 1.0)
            totals = spec.profile.resources
            if any(amount > totals.get(res, 0.0) + 1e-9
                   for res, amount in self.held[node].items()):
                self.misplaced += 1
                self.never_fits += resources.shortfall(task.needs, totals) is not None
        p_true = spec.p_true[task.task_type]
        if node in self.drift and now >= self.drift[node][0]:
            p_true = self.drift[node][1]
        ok = task.u_ok < p_true * task.p_factor
        duration = (spec.mean_s[task.task_type] * task.dur_factor
                    * math.exp(DURATION_SIGMA * task.z_dur - DURATION_SIGMA ** 2 / 2))
        rec = self.records[task.idx]
        rec.node, rec.success, rec.start, rec.finish = node, ok, now, now + duration
        self._seq += 1
        heapq.heappush(self._events, (now + duration, self._seq, node, task))

    def assign(self, task: Task, node: str, now: float) -> None:
        """Award: start at once if a slot is free and the task fits, else wait in the node's
        queue (behind any attempt already waiting there)."""
        rec = self.records[task.idx]
        rec.node = node
        self._add(self.reserved[node], task.needs, 1.0)
        if self.queue[node]:
            rec.queued = "behind"
        elif self.running[node] >= self.specs[node].profile.capacity:
            rec.queued = "slots"
        elif not self.room_for(task, node):
            rec.queued = "room"
        else:
            self.start(task, node, now)
            return
        self.queue[node].append(task)

    def complete(self, task: Task, node: str, now: float) -> None:
        """The task finishes: record the episode, free the slot and the room, take the next."""
        self.running[node] -= 1
        if task.needs:
            self._tick(now)
            self._add(self.held[node], task.needs, -1.0)
            self._add(self.reserved[node], task.needs, -1.0)
        ok = self.records[task.idx].success
        key = (node, task.task_type)
        self.outcomes.setdefault(key, deque(maxlen=SETTINGS.episodes_read)).append(ok)
        if not ok:
            self.failures.setdefault(key, deque()).append(now)
        self.attempts[node] += 1
        self.successes[node] += int(ok)
        tried, won = self.typed.get(key, (0, 0))
        self.typed[key] = (tried + 1, won + int(ok))
        self.pull(node, now)

    def pull(self, node: str, now: float) -> None:
        """Free slots take the node's queue in arrival order while its head fits (the head
        waits for room and nothing behind it starts first), then the central queue (the first
        task there that the node can run and that fits)."""
        spec = self.specs[node]
        while self.running[node] < spec.profile.capacity:
            if self.queue[node]:
                if not self.room_for(self.queue[node][0], node):
                    return
                self.start(self.queue[node].popleft(), node, now)
                continue
            nxt = next((t for t in self.central
                        if capable(spec, t.skills) and self.room_for(t, node)), None)
            if nxt is None:
                return
            self.central.remove(nxt)
            self._add(self.reserved[node], nxt.needs, 1.0)
            self.start(nxt, node, now)

    def advance(self, until: float) -> None:
        """Complete every task that finishes by ``until``, in finish order."""
        while self._events and self._events[0][0] <= until:
            when, _, node, task = heapq.heappop(self._events)
            self.complete(task, node, when)


#: A policy: (sim, task, now) -> the node awarded, or None (FIFO: central queue; auctions: no
#: award, the task fails with NoBidsError as with the production default no_bid="fail").
Policy = Callable[[Sim, Task, float], str | None]
