"""Allocation quality at scale: 8 to 256 nodes, 50% and 90% load, against five baselines.

The federation of ``federation.FEDERATION`` grown K times with ``federation.varied``: every twin
has its own speed (mean durations x 0.7-1.4) and reliability (true rates x 0.9-1.05), so the
nodes differ at every size. The twins of the newcomer join at mid-run with no history. The
offered load is a share of the founders' capacity (``arrival_rate``). Fewer tasks per node at
the larger sizes keep the run short (``TASKS``); a node's experience then has fewer episodes
to learn from, which is part of what the study measures.

``scale_seed`` takes one tuple and is module-level, so ``ProcessPoolExecutor.map`` runs cells
at once.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from bench.common.markdown import row, rule
from bench.common.stats import mean_sd
from bench.simulation.auction import Auction
from bench.simulation.baselines import (
    fifo,
    least_loaded,
    oracle,
    oracle_free_slot,
    power_of_two,
)
from bench.simulation.federation import (
    FEDERATION,
    NodeSpec,
    arrival_rate,
    registration_order,
    varied,
)
from bench.simulation.metrics import Metrics, measure
from bench.simulation.runner import simulate, stream_seed
from bench.simulation.sim import Policy
from bench.simulation.tasks import Task, make_tasks

SIZES = (8, 32, 128, 256)
LOADS = (0.5, 0.9)
#: Tasks per run at each size (about 375, 190, 95 and 62 per node).
TASKS = {8: 3000, 32: 6000, 128: 12000, 256: 16000}
DEFAULT = "weighted (default)"
REFERENCE = "ref: oracle, free slot first"
#: (label, factory): fresh policies for every run.
SCALE_POLICIES: tuple[tuple[str, Callable[[], Policy]], ...] = (
    ("fifo", lambda: fifo),
    ("least_loaded", lambda: least_loaded),
    ("power of two", lambda: power_of_two),
    (DEFAULT, lambda: Auction("weighted")),
    ("oracle", lambda: oracle),
    (REFERENCE, lambda: oracle_free_slot),
)
#: The targets: points below the reference at most (per size), and p90 against power of two.
WITHIN = {8: 1.0, 32: 1.0, 128: 1.0, 256: 2.0}

#: One cell's runs: (nodes, load) -> one dict of metrics per seed.
Cells = dict[tuple[int, float], list[dict[str, Metrics]]]

COLUMNS = ("nodes", "load", "policy", "success % after warm-up", "completion p50 s", "p90 s",
           "p99 s", "load max/mean", "newcomers % of 2nd half")


def cell(nodes: int, load: float, seed: int,
         n_tasks: int) -> tuple[tuple[NodeSpec, ...], list[Task], list[str]]:
    """One cell's run: its federation, its tasks, and its founders in registration order."""
    federation = varied(FEDERATION, max(1, nodes // len(FEDERATION)), seed)
    tasks = make_tasks(n_tasks, seed, arrival_rate(federation, load))
    return federation, tasks, registration_order(federation, seed)


def scale_seed(args: tuple[int, float, int, int]) -> tuple[int, float, dict[str, Metrics]]:
    """(nodes, load, seed, tasks): every policy of SCALE_POLICIES on the same tasks."""
    nodes, load, seed, n_tasks = args
    federation, tasks, founders = cell(nodes, load, seed, n_tasks)
    out = {}
    for label, factory in SCALE_POLICIES:
        sim = simulate(factory(), tasks, federation, founders, stream_seed(seed, label))
        out[label] = measure(sim, federation)
    return nodes, load, out


def jobs(sizes: tuple[int, ...], loads: tuple[float, ...], seeds: list[int],
         scale_tasks: float) -> list[tuple[int, float, int, int]]:
    """The cells' runs, the largest first (so that a pool of processes ends together)."""
    out = [(n, load, s, int(TASKS.get(n, 60 * n) * scale_tasks))
           for n in sizes for load in loads for s in seeds]
    return sorted(out, key=lambda j: -j[3])


def newcomer_capacity_share() -> float:
    """The newcomers' share of the capacity in the 2nd half (the same at every size)."""
    cap = {s.name: s.profile.capacity for s in FEDERATION}
    new = sum(c for n, c in cap.items() if any(s.joins_mid_run and s.name == n
                                               for s in FEDERATION))
    return new / sum(cap.values())


def table(cells: Cells) -> str:
    """One row per size, load and policy (means ± sd over seeds)."""
    lines = [row(COLUMNS), rule(len(COLUMNS))]
    for (nodes, load), results in sorted(cells.items()):
        for label, _ in SCALE_POLICIES:
            ms = [r[label] for r in results]
            lines.append(row([
                str(nodes), f"{load:.0%}", label,
                mean_sd([m.success_warm for m in ms], ".1f", 100),
                mean_sd([m.completion_p50 for m in ms], ".0f"),
                mean_sd([m.completion_p90 for m in ms], ".0f"),
                mean_sd([m.completion_p99 for m in ms], ".0f"),
                mean_sd([m.load_ratio for m in ms], ".2f"),
                mean_sd([m.newcomer_share for m in ms], ".1f", 100),
            ]))
    return "\n".join(lines)


def targets(cells: Cells) -> str:
    """Per cell: the default's points below the reference (target by size) and over FIFO,
    and at 90% load its p90 completion against power of two's."""
    head = ("nodes", "load", "below free-slot oracle (target)", "vs FIFO",
            "p90 s: default / power of two", "met")
    lines = [row(head), rule(len(head))]
    for (nodes, load), results in sorted(cells.items()):
        below = statistics.fmean(100 * (r[REFERENCE].success_warm - r[DEFAULT].success_warm)
                                 for r in results)
        over = statistics.fmean(100 * (r[DEFAULT].success_warm - r["fifo"].success_warm)
                                for r in results)
        p90 = statistics.fmean(r[DEFAULT].completion_p90 for r in results)
        p90_two = statistics.fmean(r["power of two"].completion_p90 for r in results)
        within = WITHIN.get(nodes, 2.0)
        ok = below <= within and (load < 0.9 or p90 <= p90_two)
        lines.append(row([
            str(nodes), f"{load:.0%}", f"{below:.1f} (<= {within:g})", f"{over:+.1f}",
            f"{p90:.0f} / {p90_two:.0f}" + ("" if load >= 0.9 else " (no target)"),
            "yes" if ok else "NO",
        ]))
    return "\n".join(lines)
