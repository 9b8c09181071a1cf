"""Running policies over a seed's tasks: one seed of the comparison or of the cap study.

``run_seed`` and ``cap_study_seed`` take one tuple and are module-level functions, so that
``ProcessPoolExecutor.map`` can run several seeds at once.
"""

from __future__ import annotations

import math
import random
import zlib
from collections.abc import Sequence

from bench.simulation import proposals
from bench.simulation.auction import Auction
from bench.simulation.baselines import fifo, oracle
from bench.simulation.federation import (
    FEDERATION,
    NodeSpec,
    arrival_rate,
    check_federation,
    registration_order,
    replicate,
)
from bench.simulation.metrics import Metrics, measure
from bench.simulation.policies import POLICIES
from bench.simulation.sim import Policy, Record, Sim
from bench.simulation.tasks import Task, make_tasks


def simulate(policy: Policy, tasks: list[Task], federation: Sequence[NodeSpec],
             founders: Sequence[str], seed: int, *, enforce: bool = True,
             drift: dict[str, tuple[float, float]] | None = None) -> Sim:
    """Run ``policy`` over ``tasks``; ``seed`` is the policy's own random stream.
    ``enforce``/``drift``: as ``Sim``'s (resources held to what nodes declare; a node's true
    rate changing at a time). Resource use is integrated up to the last arrival."""
    specs = {s.name: s for s in federation}
    sim = Sim(specs, tasks, random.Random(seed), enforce=enforce, drift=dict(drift or {}),
              horizon=tasks[-1].arrival if tasks else 0.0)
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


def stream_seed(seed: int, stream: str) -> int:
    """A policy's own random stream: from the seed and a name, not from a table row."""
    return seed * 100_003 + zlib.crc32(stream.encode())


def run_seed(args: tuple[int, int, float]) -> dict[str, Metrics]:
    """(tasks, seed, prior episodes): every policy of POLICIES on the same tasks."""
    n_tasks, seed, prior_episodes = args
    # The proposals read their prior from their module: set here, in the process that runs.
    proposals.PRIOR_EPISODES = prior_episodes
    check_federation(FEDERATION)
    tasks = make_tasks(n_tasks, seed, arrival_rate(FEDERATION))
    founders = registration_order(FEDERATION, seed)
    out = {}
    for label, factory, _ in POLICIES:
        sim = simulate(factory(), tasks, FEDERATION, founders, stream_seed(seed, label))
        out[label] = measure(sim, FEDERATION)
    return out


def cap_label(cap: int) -> str:
    """The study's row name of the default strategy asking at most ``cap`` nodes."""
    return "weighted, every node asked" if cap == 0 else f"weighted, cap {cap}"


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
        sim = simulate(policy, tasks, federation, founders, stream_seed(seed, stream))
        out[label] = measure(sim, federation)
    return out
