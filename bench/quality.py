"""Allocation quality: a seeded discrete-event simulation of a heterogeneous federation.

Issue 4, section 3. The bidding policies call the PRODUCTION code for every task:
``bidding.announce.select_candidates`` (who is asked), ``bidding.bid.compute_bid`` (each node's bid
from its profile and a ``NodeHistory`` built exactly as ``bidding.bid.gather_history`` builds it
from the store), ``bidding.award.refresh_loads`` and ``bidding.award.decide`` with the strategy from
``bidding.strategies.resolve_strategy``. Nothing of their formulas is copied here.

The simulation keeps, per node, what the store would hold: episodes (task type, success,
finish time) and in-flight work (awarded and not finished: queued on the node or running).
An awarded task waits in the node's execution queue while all its slots are busy, as in
Celery's ``exec.<node>`` queue. Time is in seconds, so the production settings
(``experience_window`` 10 episodes, ``recent_failure_seconds`` 3600 s) apply unchanged.

Baselines: FIFO (first free capable node in a fixed, per-seed shuffled order, else a central
queue served by whichever capable node frees first), random, least-loaded, and an oracle that
knows the true success probabilities (highest true probability among capable nodes, ties by
load). "Capable" is the production candidate filter: the node has one of the required skills.

Common random numbers: every policy sees the same arrivals, contents and per-task random
draws (a task succeeds on node n when u < p_true[n][type]), so differences come from the
allocation only.

The PROPOSALS section below evaluates changes to the scoring in the simulation only, without
touching ``bidding/``: a bid function that calls ``compute_bid`` and replaces one sub-score, and a
subclass of the production ``WeightedScore`` that adds one multiplier.

Metrics: success rate (overall and after warm-up), mean completion time, load spread
(max/mean tasks per founding node), specialization (share of tasks on their type's truly best
node, per window of 100 tasks) and the share of the second half won by a newcomer that joins at
mid-run with no history. Plots: ``bench/quality_*.png``.

Run: ``.venv/bin/python bench/quality.py [--tasks N] [--seed S] [--seeds K]``.

Candidate-cap study: ``--caps 4,6,8,0 --copies K`` replicates the federation K times (twins with
the same true rates, the offered load scaled with the capacity, N tasks per copy) and runs FIFO,
the oracle and the default strategy asking at most each cap (0: every eligible node), all on the
same tasks and random stream. "Best node" is then any node with the type's best true rate, and
the newcomers are all the twins of the newcomer.
"""

from __future__ import annotations

import argparse
import heapq
import math
import os
import random
import statistics
import time
import zlib
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

from bidding.announce import select_candidates
from bidding.award import decide, refresh_loads
from bidding.bid import NodeHistory, compute_bid
from bidding.config import Settings
from bidding.models import Announcement, Bid, Refusal, Score
from bidding.profile import NodeProfile
from bidding.registry import LiveNode
from bidding.scoring import slot_share
from bidding.strategies import (
    NodeCapability,
    SelectionStrategy,
    WeightedScore,
    resolve_strategy,
    strategy_name,
)

BENCH_DIR = Path(__file__).resolve().parent
SETTINGS = Settings()  # production defaults: experience_window, recent_failure_seconds, ...

# --------------------------------------------------------------------------------------------
# The federation
# --------------------------------------------------------------------------------------------

#: Task type -> (required skills, share of arrivals).
TASK_TYPES: dict[str, tuple[tuple[str, ...], float]] = {
    "extract": (("pdf",), 0.22),
    "translate": (("nlp",), 0.22),
    "summarize": (("nlp", "writing"), 0.20),
    "sql": (("database",), 0.20),
    "codegen": (("coding",), 0.16),
}

#: Content length bands: (share, min chars, max chars, success multiplier, duration multiplier).
#: Longer tasks are a little harder and take longer for every node: seed 000's content-length
#: confidence heuristic has some truth in it, but the same for every bidder.
LENGTH_BANDS: tuple[tuple[float, int, int, float, float], ...] = (
    (0.70, 80, 499, 1.00, 1.0),
    (0.20, 500, 1999, 0.95, 1.5),
    (0.10, 2000, 4000, 0.88, 2.5),
)
#: Spread of a task's duration around its node's mean (lognormal sigma).
DURATION_SIGMA = 0.4
#: Offered load against the founders' total capacity (work measured at capable nodes' mean).
TARGET_LOAD = 0.80
#: Fraction of the tasks counted as warm-up.
WARMUP = 0.20
NEWCOMER = "nova"


@dataclass(frozen=True)
class NodeSpec:
    """A node: its declared profile, and its hidden true success rate and speed per type."""

    profile: NodeProfile
    p_true: dict[str, float]
    mean_s: dict[str, float]
    joins_mid_run: bool = False

    @property
    def name(self) -> str:
        return self.profile.name


def _node(name: str, skills: Sequence[str], capacity: int, rates: dict[str, tuple[float, float]],
          *, trust: float = 70.0, latency_ms: float = 50.0, price: float = 0.01,
          joins_mid_run: bool = False) -> NodeSpec:
    profile = NodeProfile(name=name, capabilities=list(skills), capacity=capacity, trust=trust,
                          latency_ms=latency_ms, price_per_unit=price)
    return NodeSpec(profile, {t: r[0] for t, r in rates.items()},
                    {t: r[1] for t, r in rates.items()}, joins_mid_run)


ALL_SKILLS = ("pdf", "nlp", "writing", "database", "coding")

#: (true success probability, mean duration in s) per task type the node is a candidate for.
FEDERATION: tuple[NodeSpec, ...] = (
    # The generalist: every skill, decent at everything, never the best.
    _node("atlas", ALL_SKILLS, 4, {t: (0.78, 60.0) for t in TASK_TYPES}),
    # The specialist: one skill, excellent and fast at it.
    _node("pdfpro", ["pdf"], 3, {"extract": (0.96, 40.0)}, latency_ms=30, price=0.015),
    # Good at some types, bad at others.
    _node("lingo", ["nlp", "writing", "pdf"], 3,
          {"translate": (0.93, 45.0), "summarize": (0.88, 55.0), "extract": (0.55, 70.0)}),
    _node("scribe", ["writing", "nlp"], 3,
          {"summarize": (0.93, 50.0), "translate": (0.62, 60.0)}, latency_ms=80),
    _node("dbx", ["database", "coding"], 3,
          {"sql": (0.94, 45.0), "codegen": (0.50, 70.0)}, price=0.012),
    _node("forge", ["coding", "database"], 3,
          {"codegen": (0.91, 55.0), "sql": (0.60, 60.0)}, latency_ms=70),
    # The bad node: declares every skill (and more), high trust, cheap and quick to answer.
    _node("hype", [*ALL_SKILLS, "gpu", "vision"], 4, {t: (0.35, 75.0) for t in TASK_TYPES},
          trust=90.0, latency_ms=10, price=0.004),
    # Joins at mid-run with no history: good at translation and code, the best at code.
    _node(NEWCOMER, ["nlp", "coding", "writing"], 3,
          {"translate": (0.90, 45.0), "codegen": (0.95, 50.0), "summarize": (0.80, 55.0)},
          joins_mid_run=True),
)


def capable(spec: NodeSpec, skills: Sequence[str]) -> bool:
    """The production candidate filter: the node has one of the required skills."""
    return not skills or bool(set(skills) & set(spec.profile.capabilities))


def check_federation(federation: Sequence[NodeSpec]) -> None:
    for spec in federation:
        for task_type, (skills, _) in TASK_TYPES.items():
            if capable(spec, skills) != (task_type in spec.p_true):
                raise ValueError(f"{spec.name}: true rate table does not match {task_type}")


def best_nodes(federation: Sequence[NodeSpec]) -> dict[str, str]:
    """The truly best node per task type among ``federation``."""
    return {t: max((s for s in federation if t in s.p_true), key=lambda s: s.p_true[t]).name
            for t in TASK_TYPES}


def best_rates(federation: Sequence[NodeSpec]) -> dict[str, float]:
    """The highest true success rate per task type among ``federation``."""
    return {t: max(s.p_true[t] for s in federation if t in s.p_true) for t in TASK_TYPES}


def replicate(federation: Sequence[NodeSpec], copies: int) -> tuple[NodeSpec, ...]:
    """A federation ``copies`` times as large: every node, and ``copies - 1`` twins of it
    (``atlas``, ``atlas-2``, ...) with the same profile and true rates. The offered load scales
    with it (``arrival_rate``)."""
    out = list(federation)
    for k in range(2, copies + 1):
        out += [replace(s, profile=s.profile.model_copy(update={"name": f"{s.name}-{k}"}))
                for s in federation]
    return tuple(out)


def arrival_rate(federation: Sequence[NodeSpec]) -> float:
    """Tasks/s giving TARGET_LOAD of the founders' capacity, each task costing the mean duration
    of the nodes capable of it (so a policy that prefers slow nodes runs hotter)."""
    founders = [s for s in federation if not s.joins_mid_run]
    length_factor = sum(b[0] * b[4] for b in LENGTH_BANDS)
    work = 0.0
    for task_type, (_, share) in TASK_TYPES.items():
        means = [s.mean_s[task_type] for s in founders if task_type in s.mean_s]
        work += share * statistics.fmean(means) * length_factor
    return TARGET_LOAD * sum(s.profile.capacity for s in founders) / work


# --------------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    idx: int
    task_type: str
    skills: tuple[str, ...]
    arrival: float
    content: str
    p_factor: float
    dur_factor: float
    #: Common random numbers: success when u_ok < p; duration from z_dur.
    u_ok: float
    z_dur: float


def make_tasks(n: int, seed: int, rate: float) -> list[Task]:
    rng = random.Random(seed)
    types = list(TASK_TYPES)
    weights = [TASK_TYPES[t][1] for t in types]
    tasks = []
    now = 0.0
    for i in range(n):
        now += rng.expovariate(rate)
        task_type = rng.choices(types, weights)[0]
        band = rng.choices(LENGTH_BANDS, [b[0] for b in LENGTH_BANDS])[0]
        length = rng.randint(band[1], band[2])
        content = f'[["{task_type}"], {{"doc": "' + "x" * max(0, length - 30) + '"}]'
        tasks.append(Task(i, task_type, TASK_TYPES[task_type][0], now, content, band[3],
                          band[4], rng.random(), rng.gauss(0.0, 1.0)))
    return tasks


# --------------------------------------------------------------------------------------------
# The simulation
# --------------------------------------------------------------------------------------------


@dataclass
class Record:
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
        self.present.append(name)
        self.running[name] = 0
        self.queue[name] = deque()

    def in_flight(self, name: str) -> int:
        """ASSIGNED or EXECUTING on the node: queued there or running."""
        return self.running[name] + len(self.queue[name])

    def history(self, node: str, task_type: str, now: float) -> NodeHistory:
        """What ``bidding.bid.gather_history`` would read from the store at ``now``."""
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
        while self._events and self._events[0][0] <= until:
            when, _, node, task = heapq.heappop(self._events)
            self.complete(task, node, when)


#: A policy: (sim, task, now) -> the node awarded, or None (FIFO: central queue; auctions: no
#: award, the task fails with NoBidsError as with the production default no_bid="fail").
Policy = Callable[[Sim, Task, float], str | None]


def fifo(sim: Sim, task: Task, now: float) -> str | None:
    for name in sim.present:
        spec = sim.specs[name]
        if capable(spec, task.skills) and sim.running[name] < spec.profile.capacity:
            return name
    sim.central.append(task)
    return None


def random_node(sim: Sim, task: Task, now: float) -> str | None:
    return sim.rng.choice([n for n in sim.present if capable(sim.specs[n], task.skills)])


def least_loaded(sim: Sim, task: Task, now: float) -> str | None:
    busy = {n: sim.in_flight(n) / sim.specs[n].profile.capacity
            for n in sim.present if capable(sim.specs[n], task.skills)}
    least = min(busy.values())
    return sim.rng.choice([n for n, b in busy.items() if b == least])


def oracle(sim: Sim, task: Task, now: float) -> str | None:
    """Knows the true rates: the highest true success probability, ties by load."""
    nodes = [n for n in sim.present if capable(sim.specs[n], task.skills)]
    return min(nodes, key=lambda n: (-sim.specs[n].p_true[task.task_type],
                                      sim.in_flight(n) / sim.specs[n].profile.capacity))


def oracle_free_slot(sim: Sim, task: Task, now: float) -> str | None:
    """Reference, not a target: knows the true rates but does not queue behind a full node when
    another capable node has a free slot (true probability x ``slot_share``, ties by load)."""
    nodes = [n for n in sim.present if capable(sim.specs[n], task.skills)]
    return max(nodes, key=lambda n: (
        sim.specs[n].p_true[task.task_type]
        * slot_share(sim.in_flight(n), sim.specs[n].profile.capacity),
        -sim.in_flight(n) / sim.specs[n].profile.capacity))


BidFn = Callable[[Announcement, NodeProfile, NodeHistory, float], Bid | Refusal]


@dataclass
class Auction:
    """A production auction: candidates, bids, fresh loads, then ``decide`` with a strategy."""

    #: A registered strategy name, or a strategy class (the proposals), as resolve_strategy takes.
    strategy_spec: str | type
    bid_fn: BidFn = compute_bid
    #: ``bidding_candidate_cap`` (None: the production default; 0: ask every eligible node).
    cap: int | None = None
    #: Resolved per run, its tie-break rng seeded, so that a run is reproducible.
    strategy: SelectionStrategy | None = None

    def reset(self, seed: int) -> None:
        self.strategy = resolve_strategy(self.strategy_spec)
        if hasattr(self.strategy, "rng"):
            self.strategy.rng = random.Random(seed)

    def __call__(self, sim: Sim, task: Task, now: float) -> str | None:
        assert self.strategy is not None
        rfp = Announcement(task_id=f"t{task.idx}", task_name="sim.work", task_type=task.task_type,
                           content=task.content, required_skills=list(task.skills),
                           strategy=strategy_name(self.strategy), announced_at=now,
                           **({} if self.cap is None else {"candidate_cap": self.cap}))
        # The registry lists live nodes ordered by name.
        live = sorted((_live(sim.specs[n].profile, now, sim.attempts[n], sim.successes[n])
                       for n in sim.present),
                      key=lambda n: n.name)
        candidates = select_candidates(rfp, live, sim.rng)
        bids: list[Bid] = []
        refusals: list[Refusal] = []
        for name in candidates:
            answer = self.bid_fn(rfp, sim.specs[name].profile,
                                 sim.history(name, task.task_type, now), now)
            if isinstance(answer, Bid):
                bids.append(answer)
            else:
                refusals.append(answer)
        bids = refresh_loads(bids, {b.node: sim.in_flight(b.node) for b in bids})
        award = decide(rfp, bids, refusals, self.strategy, closed_by="all bids in",
                       candidates=len(candidates))
        return award.winner


def _live(profile: NodeProfile, now: float, attempts: int, successes: int) -> LiveNode:
    """The node as ``registry.query_live_nodes`` lists it, record included."""
    return LiveNode(name=profile.name, capabilities=tuple(profile.capabilities),
                    capacity=profile.capacity, price_per_unit=profile.price_per_unit,
                    latency_ms=profile.latency_ms, trust=profile.trust, last_heartbeat=now,
                    attempts=attempts, successes=successes)


def registration_order(federation: Sequence[NodeSpec], seed: int) -> list[str]:
    """The founders in the order they registered (FIFO's scan order): shuffled per seed."""
    founders = [s.name for s in federation if not s.joins_mid_run]
    random.Random(seed).shuffle(founders)
    return founders


def simulate(policy: Policy, tasks: list[Task], federation: Sequence[NodeSpec],
             founders: Sequence[str], seed: int) -> Sim:
    """Run ``policy`` over ``tasks``; ``seed`` is the policy's own random stream."""
    specs = {s.name: s for s in federation}
    sim = Sim(specs, tasks, random.Random(seed))
    sim.records = [Record() for _ in tasks]
    for name in founders:
        sim.join(name)
    for name in specs:
        sim.attempts[name] = 0
        sim.successes[name] = 0
    join_idx = len(tasks) // 2
    if isinstance(policy, Auction):
        policy.reset(seed + 1)
    for task in tasks:
        sim.advance(task.arrival)
        if task.idx == join_idx:
            for spec in federation:
                if spec.joins_mid_run:
                    sim.join(spec.name)
                    sim.pull(spec.name, task.arrival)
        node = policy(sim, task, task.arrival)
        if node is not None:
            sim.assign(task, node, task.arrival)
    sim.advance(math.inf)
    return sim


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------

WINDOW = 100
ROLLING = 200


@dataclass
class Metrics:
    """One run of one policy.

    success: share of all tasks that succeeded (an unawarded task counts as failed);
    success_warm: the same over the tasks after the first WARMUP share; completion_s: mean of
    finish - arrival (queue wait + duration) over executed tasks; load_ratio: max / mean tasks
    per node over the founders (the newcomer is there for half the run only);
    specialization: share of tasks on the truly best capable node for their type among the
    nodes present; newcomer_share: share of the second half's tasks won by the newcomer.
    """

    success: float
    success_warm: float
    completion_s: float
    load_ratio: float
    specialization_warm: float
    newcomer_share: float
    newcomer_tasks: int
    unawarded: int
    per_node: dict[str, int]
    rolling_success: list[float]
    specialization: list[float]
    newcomer_windows: list[float]


def measure(sim: Sim, federation: Sequence[NodeSpec]) -> Metrics:
    recs, tasks = sim.records, sim.tasks
    n = len(tasks)
    warm = int(n * WARMUP)
    join_idx = n // 2
    founders = [s for s in federation if not s.joins_mid_run]
    # "Best" is the highest true rate among the nodes present: with replicas, every copy of the
    # best node counts.
    best_before, best_after = best_rates(founders), best_rates(federation)
    specs = {s.name: s for s in federation}
    newcomers = {s.name for s in federation if s.joins_mid_run}
    ok = [r.success for r in recs]
    per_node = {s.name: sum(1 for r in recs if r.node == s.name) for s in federation}
    counts = [per_node[s.name] for s in founders]
    done = [r.finish - t.arrival for r, t in zip(recs, tasks, strict=True) if r.node is not None]
    on_best = [r.node is not None and specs[r.node].p_true[t.task_type]
               == (best_after if t.idx >= join_idx else best_before)[t.task_type]
               for r, t in zip(recs, tasks, strict=True)]
    second = recs[join_idx:]
    newcomer = sum(1 for r in second if r.node in newcomers)
    cum = [0]
    for x in ok:
        cum.append(cum[-1] + x)
    rolling = [(cum[i + 1] - cum[max(0, i + 1 - ROLLING)]) / min(i + 1, ROLLING)
               for i in range(n)]
    windows = range(0, n - WINDOW + 1, WINDOW)
    return Metrics(
        success=statistics.fmean(ok),
        success_warm=statistics.fmean(ok[warm:]),
        completion_s=statistics.fmean(done) if done else math.nan,
        load_ratio=max(counts) / statistics.fmean(counts),
        specialization_warm=statistics.fmean(on_best[warm:]),
        newcomer_share=newcomer / max(1, len(second)),
        newcomer_tasks=newcomer,
        unawarded=sum(1 for r in recs if r.node is None),
        per_node=per_node,
        rolling_success=rolling,
        specialization=[statistics.fmean(on_best[i:i + WINDOW]) for i in windows],
        newcomer_windows=[sum(1 for r in recs[i:i + WINDOW] if r.node in newcomers) / WINDOW
                          for i in windows],
    )


# --------------------------------------------------------------------------------------------
# PROPOSALS (simulation only; nothing here is production code and bidding/ is not modified)
#
# P1 "learned confidence" (bid): a node's confidence is its honest estimate of success on this
#    task type: the mean of a Beta posterior over its latest episodes of the type
#    (NodeHistory.outcomes, the production experience window of 10), with an OPTIMISTIC prior
#    worth A episodes that all succeeded:
#        confidence = (successes + A) / (n + A),   A = 2
#    A node with no episode of the type (a newcomer) bids 1.0 and so is tried; the estimate
#    falls as failures come in; a node estimated below the announcement's min_confidence (0.5)
#    is no longer eligible for that type (decide() already applies min_confidence). The content
#    heuristic leaves the ranking: it is the same for every bidder of an auction.
#    Production: new ``scoring.estimated_success(outcomes)``, used by ``bid.compute_bid`` for
#    ``confidence=`` instead of ``scoring.confidence_score(content)``.
# P2 = P1 + "slot share" (strategy): WeightedScore's total (0.6 confidence + 0.4 skill match,
#    unchanged) is multiplied, like composite's multipliers, by the share of a slot the task
#    would get on the node: slot_share = min(1, capacity / (in_flight + 1)). Among nodes with a
#    free slot the best estimate wins; a full node wins only if it is that much better. It uses
#    the bid's in_flight and capacity, which refresh_loads keeps current.
#    Production: new ``scoring.slot_share(in_flight, capacity)``, applied in
#    ``strategies.WeightedScore.score`` as ``multipliers["slot_share"]``.
#    (Putting the share into the bid's confidence instead was tried and rejected: a busy node's
#    confidence then falls under min_confidence, and when every capable node is busy the task
#    fails with NoBidsError. Load belongs in the ranking, not in the eligibility.)
# P3 "composite, smoothed experience" (bid): seed 000's composite unchanged, except that the
#    experience sub-score is the same estimate, (successes + 2) / (n + 2), instead of the raw
#    rate with a fixed 0.3 for a newcomer. Production: ``scoring.experience_score``.
# --------------------------------------------------------------------------------------------

#: A, the optimistic prior's weight in episodes (``--prior-episodes``).
PRIOR_EPISODES = 2.0


def estimated_success(outcomes: Sequence[bool], prior_episodes: float | None = None) -> float:
    """Optimistic Beta posterior mean of success: (successes + A) / (n + A)."""
    a = PRIOR_EPISODES if prior_episodes is None else prior_episodes
    return (sum(outcomes) + a) / (len(outcomes) + a)


def bid_learned_confidence(rfp: Announcement, profile: NodeProfile, history: NodeHistory,
                           now: float) -> Bid | Refusal:
    """P1: the production bid, with confidence = estimated_success(outcomes)."""
    bid = compute_bid(rfp, profile, history, now)
    if isinstance(bid, Refusal):
        return bid
    return bid.model_copy(update={"confidence": estimated_success(history.outcomes)})


def bid_smoothed_experience(rfp: Announcement, profile: NodeProfile, history: NodeHistory,
                            now: float) -> Bid | Refusal:
    """P3: the production bid, with experience = estimated_success(outcomes)."""
    bid = compute_bid(rfp, profile, history, now)
    if isinstance(bid, Refusal):
        return bid
    return bid.model_copy(update={"experience": estimated_success(history.outcomes)})


@dataclass
class WeightedSlotShare(WeightedScore):
    """P2: the production WeightedScore, its total multiplied by the bidder's slot share."""

    name: ClassVar[str] = "weighted_slot_share"

    def score(
        self, bid: Bid, rfp: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        base = super().score(bid, rfp, capabilities)
        share = slot_share(bid.in_flight, bid.capacity)
        if share >= 1.0:
            return base
        return base.model_copy(update={"total": base.total * share,
                                       "multipliers": {"slot_share": share}})


# --------------------------------------------------------------------------------------------
# Runner
# --------------------------------------------------------------------------------------------

#: (label, factory, kind). Factories, so that every run starts from a fresh policy.
#: kind: "base" (baselines and production strategies), "ref" (reference), "proposal".
POLICIES: tuple[tuple[str, Callable[[], Policy], str], ...] = (
    ("fifo", lambda: fifo, "base"),
    ("random", lambda: random_node, "base"),
    ("least_loaded", lambda: least_loaded, "base"),
    ("weighted (default)", lambda: Auction("weighted"), "base"),
    ("composite", lambda: Auction("composite"), "base"),
    ("routing", lambda: Auction("routing"), "base"),
    ("oracle", lambda: oracle, "base"),
    ("ref: oracle, free slot first", lambda: oracle_free_slot, "ref"),
    ("P1 weighted, learned conf", lambda: Auction("weighted", bid_learned_confidence), "proposal"),
    ("P2 P1 + slot share", lambda: Auction(WeightedSlotShare, bid_learned_confidence),
     "proposal"),
    ("P3 composite, smoothed exp", lambda: Auction("composite", bid_smoothed_experience),
     "proposal"),
)
TARGETED = ("weighted (default)", "composite", "routing", "P1 weighted, learned conf",
            "P2 P1 + slot share", "P3 composite, smoothed exp")


def run_seed(args: tuple[int, int, float]) -> dict[str, Metrics]:
    global PRIOR_EPISODES
    n_tasks, seed, PRIOR_EPISODES = args
    check_federation(FEDERATION)
    tasks = make_tasks(n_tasks, seed, arrival_rate(FEDERATION))
    founders = registration_order(FEDERATION, seed)
    out = {}
    for label, factory, _ in POLICIES:
        # A policy's own random stream depends on the seed and its label, not its table row.
        sim = simulate(factory(), tasks, FEDERATION, founders,
                       seed * 100_003 + zlib.crc32(label.encode()))
        out[label] = measure(sim, FEDERATION)
    return out


def cap_study_seed(args: tuple[int, int, int, tuple[int, ...]]) -> dict[str, Metrics]:
    """One seed of the candidate-cap study: FIFO, the oracle, and the default strategy asking at
    most each cap, on the federation replicated ``copies`` times (``n_tasks`` per copy)."""
    n_tasks, seed, copies, caps = args
    federation = replicate(FEDERATION, copies)
    tasks = make_tasks(n_tasks * copies, seed, arrival_rate(federation))
    founders = registration_order(federation, seed)
    policies: list[tuple[str, Policy]] = [("fifo", fifo), ("oracle", oracle)]
    policies += [(cap_label(c), Auction("weighted", cap=c)) for c in caps]
    out = {}
    for label, policy in policies:
        # The same stream for every cap: the caps differ only in whom they ask.
        stream = label if label in ("fifo", "oracle") else "weighted"
        sim = simulate(policy, tasks, federation, founders,
                       seed * 100_003 + zlib.crc32(stream.encode()))
        out[label] = measure(sim, federation)
    return out


def cap_label(cap: int) -> str:
    """The study's row name of the default strategy asking at most ``cap`` nodes."""
    return "weighted, every node asked" if cap == 0 else f"weighted, cap {cap}"


def cap_study(results: list[dict[str, Metrics]], copies: int) -> str:
    """The cap study as a markdown table (means +- sd over seeds)."""
    nodes = len(FEDERATION) * copies
    cols = ("policy", "success % after warm-up", "vs FIFO", "below oracle", "load max/mean",
            "on best node % after warm-up", "newcomers % of 2nd half")
    lines = [f"{nodes} nodes ({copies} x the federation), {len(results)} seed(s)", "",
             "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for label in results[0]:
        ms = [r[label] for r in results]
        over_fifo = statistics.fmean(r[label].success_warm - r["fifo"].success_warm
                                     for r in results)
        under_oracle = statistics.fmean(r["oracle"].success_warm - r[label].success_warm
                                        for r in results)
        lines.append("| " + " | ".join([
            label,
            _ms([m.success_warm for m in ms], ".1f", 100),
            f"{100 * over_fifo:+.1f}",
            f"{100 * under_oracle:.1f}",
            _ms([m.load_ratio for m in ms], ".2f"),
            _ms([m.specialization_warm for m in ms], ".1f", 100),
            _ms([m.newcomer_share for m in ms], ".1f", 100),
        ]) + " |")
    return "\n".join(lines)


def _ms(values: Sequence[float], fmt: str, scale: float = 1.0) -> str:
    mean = statistics.fmean(values) * scale
    if len(values) < 2:
        return format(mean, fmt)
    return f"{format(mean, fmt)} ± {format(statistics.stdev(values) * scale, fmt)}"


COLUMNS = ("policy", "success %", "success % after warm-up", "completion s", "load max/mean",
           "on best node % after warm-up", "newcomer % of 2nd half", "unawarded")


def table(results: list[dict[str, Metrics]]) -> list[list[str]]:
    rows = []
    for label, _, _ in POLICIES:
        ms = [r[label] for r in results]
        rows.append([
            label,
            _ms([m.success for m in ms], ".1f", 100),
            _ms([m.success_warm for m in ms], ".1f", 100),
            _ms([m.completion_s for m in ms], ".0f"),
            _ms([m.load_ratio for m in ms], ".2f"),
            _ms([m.specialization_warm for m in ms], ".1f", 100),
            _ms([m.newcomer_share for m in ms], ".1f", 100),
            _ms([float(m.unawarded) for m in ms], ".0f"),
        ])
    return rows


def markdown(rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def targets(results: list[dict[str, Metrics]], label: str) -> str:
    """Issue 4's four targets on the means over seeds, with how many seeds pass each alone."""
    def per_seed(r: dict[str, Metrics]) -> tuple[float, float, float, int]:
        m = r[label]
        return (100 * (m.success_warm - r["fifo"].success_warm),
                100 * (r["oracle"].success_warm - m.success_warm),
                m.load_ratio, m.newcomer_tasks)

    rows = [per_seed(r) for r in results]
    over_fifo, under_oracle, load = (statistics.fmean(x[i] for x in rows) for i in range(3))
    newcomer = statistics.fmean(r[label].newcomer_share for r in results)
    k = len(rows)
    checks = [
        (f"{over_fifo:+.1f} pts vs FIFO (>= +15)", over_fifo >= 15,
         sum(x[0] >= 15 for x in rows)),
        (f"{under_oracle:.1f} pts below oracle (<= 5)", under_oracle <= 5,
         sum(x[1] <= 5 for x in rows)),
        (f"load max/mean {load:.2f} (<= 1.5)", load <= 1.5, sum(x[2] <= 1.5 for x in rows)),
        (f"newcomer wins {100 * newcomer:.1f}% of 2nd half (> 0)", min(x[3] for x in rows) > 0,
         sum(x[3] > 0 for x in rows)),
    ]
    return f"{label:28s} " + "; ".join(
        f"{text} {'PASS' if ok else 'FAIL'} [{n}/{k} seeds]" for text, ok, n in checks)


def per_node_table(results: list[dict[str, Metrics]]) -> str:
    nodes = [s.name for s in FEDERATION]
    lines = ["| policy | " + " | ".join(nodes) + " |", "|" + "---|" * (len(nodes) + 1)]
    for label, _, _ in POLICIES:
        counts = [statistics.fmean(r[label].per_node[n] for r in results) for n in nodes]
        lines.append(f"| {label} | " + " | ".join(f"{c:.0f}" for c in counts) + " |")
    return "\n".join(lines)


def plot(results: list[dict[str, Metrics]], n_tasks: int, seeds: Sequence[int]) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [label for label, _, _ in POLICIES]
    styles = {label: {"base": "-", "ref": ":", "proposal": "--"}[kind]
              for label, _, kind in POLICIES}
    palette = [*(plt.get_cmap("tab10")(i) for i in range(10)), "black", "gold"]
    colors = dict(zip(labels, palette, strict=False))
    join = n_tasks // 2
    suffix = f"{len(seeds)} seed(s) {seeds[0]}..{seeds[-1]}, {n_tasks} tasks"

    def avg(attr: str, label: str) -> list[float]:
        series = [getattr(r[label], attr) for r in results]
        return [statistics.fmean(col) for col in zip(*series, strict=True)]

    paths = []
    fig, ax = plt.subplots(figsize=(11, 6))
    for label in labels:
        ax.plot(range(n_tasks), [100 * v for v in avg("rolling_success", label)],
                styles[label], color=colors[label], label=label, linewidth=1.3)
    ax.axvline(int(n_tasks * WARMUP), color="red", linestyle="-.", alpha=0.5,
               label="end of warm-up")
    ax.axvline(join, color="black", linestyle=":", label=f"{NEWCOMER} joins")
    ax.set(xlabel="task (arrival order)", ylabel=f"success % (rolling {ROLLING} tasks)",
           title=f"Success rate over time ({suffix})")
    ax.legend(fontsize=8, loc="lower right", ncol=2)
    ax.grid(alpha=0.3)
    paths.append(BENCH_DIR / "quality_success.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 9), sharex=True,
                                  gridspec_kw={"height_ratios": [2, 1]})
    centers = [i + WINDOW / 2 for i in range(0, n_tasks - WINDOW + 1, WINDOW)]
    for label in labels:
        ax.plot(centers, [100 * v for v in avg("specialization", label)], styles[label],
                color=colors[label], label=label, marker=".", linewidth=1.2)
        ax2.plot(centers, [100 * v for v in avg("newcomer_windows", label)], styles[label],
                 color=colors[label], label=label, marker=".", linewidth=1.2)
    for a in (ax, ax2):
        a.axvline(join, color="black", linestyle=":")
        a.grid(alpha=0.3)
    ax.set(ylabel="% of tasks on their truly best node",
           title=f"Specialization per window of {WINDOW} tasks ({suffix})")
    ax.legend(fontsize=8, ncol=2)
    ax2.set(xlabel="task (arrival order)", ylabel=f"% of window won by {NEWCOMER}",
            title=f"Newcomer {NEWCOMER} (joins at task {join}, no history)")
    paths.append(BENCH_DIR / "quality_specialization.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(12, 6))
    nodes = [s.name for s in FEDERATION]
    width = 0.8 / len(labels)
    for i, label in enumerate(labels):
        counts = [statistics.fmean(r[label].per_node[n] for r in results) for n in nodes]
        ax.bar([j + (i - len(labels) / 2 + 0.5) * width for j in range(len(nodes))], counts,
               width, color=colors[label], label=label,
               hatch={"--": "//", ":": ".."}.get(styles[label]), edgecolor="white")
    ax.set_xticks(range(len(nodes)))
    ax.set_xticklabels([f"{s.name}\ncap {s.profile.capacity}" for s in FEDERATION])
    ax.set(ylabel="tasks", title=f"Tasks per node per policy ({suffix})")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3, axis="y")
    paths.append(BENCH_DIR / "quality_tasks_per_node.png")
    fig.savefig(paths[-1], dpi=110, bbox_inches="tight")
    plt.close(fig)
    return paths


def describe_federation() -> str:
    lines = [f"offered load {TARGET_LOAD:.0%} of the founders' capacity, "
             f"{arrival_rate(FEDERATION):.3f} tasks/s; best node per type: "
             + ", ".join(f"{t}={n}" for t, n in best_nodes(
                 [s for s in FEDERATION if not s.joins_mid_run]).items())
             + f"; after {NEWCOMER} joins: "
             + ", ".join(f"{t}={n}" for t, n in best_nodes(FEDERATION).items())]
    for s in FEDERATION:
        rates = ", ".join(f"{t} {p:.2f}/{s.mean_s[t]:.0f}s" for t, p in s.p_true.items())
        lines.append(f"  {s.name:7s} cap {s.profile.capacity} trust {s.profile.trust:.0f} "
                     f"skills {','.join(s.profile.capabilities)}: {rates}"
                     + (" (joins mid-run)" if s.joins_mid_run else ""))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tasks", type=int, default=3000, help="tasks per run (default 3000)")
    parser.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    parser.add_argument("--seeds", type=int, default=1, help="number of seeds (default 1)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes for several seeds (default: CPU count)")
    parser.add_argument("--prior-episodes", type=float, default=PRIOR_EPISODES,
                        help="A of the proposals' estimate (successes + A) / (n + A) (default 2)")
    parser.add_argument("--no-plots", action="store_true", help="skip the PNGs")
    parser.add_argument("--caps", default=None,
                        help="candidate-cap study instead: caps to compare, e.g. 4,6,8,0 "
                             "(0: every node); FIFO, the oracle and the default strategy only")
    parser.add_argument("--copies", type=int, default=1,
                        help="with --caps: replicate the federation this many times (default 1)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    seeds = list(range(args.seed, args.seed + args.seeds))
    if args.caps is not None:
        caps = tuple(int(c) for c in args.caps.split(",") if c.strip())
        study = [(args.tasks, s, args.copies, caps) for s in seeds]
        with ProcessPoolExecutor(max(1, min(args.jobs, len(seeds)))) as pool:
            found = list(pool.map(cap_study_seed, study))
        print(f"candidate-cap study: {args.tasks} tasks per copy, seeds {seeds}, "
              f"warm-up {WARMUP:.0%}, newcomers join at mid-run")
        print(cap_study(found, args.copies))
        print(f"\n{time.perf_counter() - started:.1f} s")
        return 0
    jobs = [(args.tasks, s, args.prior_episodes) for s in seeds]
    if args.jobs > 1 and len(seeds) > 1:
        with ProcessPoolExecutor(min(args.jobs, len(seeds))) as pool:
            results = list(pool.map(run_seed, jobs))
    else:
        results = [run_seed(j) for j in jobs]
    print(f"allocation quality: {args.tasks} tasks, seeds {seeds}, warm-up {WARMUP:.0%}, "
          f"{NEWCOMER} joins at task {args.tasks // 2}, "
          f"proposals' prior A = {args.prior_episodes:g} episodes")
    print(describe_federation())
    print()
    print(markdown(table(results)))
    print()
    print("tasks per node (mean over seeds):")
    print(per_node_table(results))
    print()
    print("targets (issue 4) on the means over seeds, success after warm-up:")
    for label in TARGETED:
        print("  " + targets(results, label))
    if not args.no_plots:
        print()
        for path in plot(results, args.tasks, seeds):
            print(f"wrote {path.relative_to(BENCH_DIR.parent)}")
    print(f"\n{time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
