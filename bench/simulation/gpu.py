"""Resources: GPU-memory requests of mixed sizes on mixed GPUs, 10,000 tasks per run.

Sixteen GPU nodes (six with 24 GB, six with 48 GB, four with 80 GB; the bigger the faster and
a little more reliable) declare ``gpu_mem_gb`` in their profile's resources; every task needs
between 4 and 70 GB (``SIZES``). The offered load is ``MEMORY_LOAD`` of the GPU memory (memory
binds before the slots do: about 60% of the slots).

The auctions run as in production (``auction.Auction`` with the task's ``resources``: only nodes
whose totals cover the task are candidates, ``decide`` weighs each bidder's ``Room`` with
``bidding_fit`` "spread" or "pack"). A node starts an attempt only while its running attempts
leave room, its queue in arrival order (``Sim.pull``). Baselines: slot-counting FIFO (the first
node with a free slot, memory ignored: it over-commits, and each start that does is counted),
and a memory-aware FIFO (the first node with a free slot where the task fits now, else a central
queue from which a node with a free slot takes the first task that fits it).

Figures: misplacements (starts that left a node holding more GPU memory than it declares, and
among them tasks the node could never hold), GPU-memory use (held / declared over the run, and
the part within what nodes declare), completion percentiles, and for the big tasks (40 GB and
more) how often one waited on its node for memory while a slot was free (small tasks holding
the big GPUs' memory), and their p90 completion.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass

from bench.common.markdown import row, rule
from bench.common.stats import mean_sd
from bench.simulation.auction import Auction
from bench.simulation.federation import NodeSpec
from bench.simulation.runner import simulate, stream_seed
from bench.simulation.sim import Policy, Sim
from bench.simulation.tasks import Task
from bidding import resources
from bidding.nodes.profile import NodeProfile

GPU = "gpu_mem_gb"
TYPE = "infer"
#: (GPU memory GB, share of tasks).
SIZES = ((4, 0.35), (8, 0.25), (16, 0.20), (24, 0.10), (40, 0.06), (70, 0.04))
BIG = 40
#: (kind, GPU memory GB, nodes, slots, mean duration s, true success rate).
GPUS = (("a10", 24, 6, 4, 70.0, 0.90), ("l40", 48, 6, 4, 55.0, 0.92),
        ("h100", 80, 4, 6, 40.0, 0.95))
MEMORY_LOAD = 0.8
TASKS = 10_000


def gpu_federation() -> tuple[NodeSpec, ...]:
    """The sixteen GPU nodes; each one's true rate a little off its kind's (fixed)."""
    out = []
    jitter = random.Random(0)
    for kind, mem, count, slots, mean_s, p in GPUS:
        for k in range(1, count + 1):
            profile = NodeProfile(name=f"{kind}-{k}", capabilities=["gpu"], capacity=slots,
                                  resources={GPU: mem})
            out.append(NodeSpec(profile, {TYPE: min(0.99, p + jitter.uniform(-0.03, 0.03))},
                                {TYPE: mean_s}))
    return tuple(out)


def gpu_rate(federation: tuple[NodeSpec, ...]) -> float:
    """Tasks/s offering MEMORY_LOAD of the GPU memory (GB-seconds held per second)."""
    mean_need = sum(size * share for size, share in SIZES)
    slots = sum(s.profile.capacity for s in federation)
    mean_s = sum(s.profile.capacity * s.mean_s[TYPE] for s in federation) / slots
    memory = sum(s.profile.resources[GPU] for s in federation)
    return MEMORY_LOAD * memory / (mean_need * mean_s)


def gpu_tasks(n: int, seed: int, rate: float) -> list[Task]:
    """``n`` GPU tasks of mixed sizes, Poisson arrivals at ``rate``."""
    rng = random.Random(seed * 31 + 7)
    now, out = 0.0, []
    for i in range(n):
        now += rng.expovariate(rate)
        size = rng.choices([s for s, _ in SIZES], [w for _, w in SIZES])[0]
        out.append(Task(i, TYPE, ("gpu",), now, f'[["{TYPE}"], {{"gb": {size}}}]', 1.0, 1.0,
                        rng.random(), rng.gauss(0.0, 1.0), needs={GPU: float(size)}))
    return out


def fifo_fit(sim: Sim, task: Task, now: float) -> str | None:
    """Memory-aware FIFO: the first node in registration order with a free slot, nothing
    waiting, and room for the task now; else the central queue."""
    for name in sim.present:
        spec = sim.specs[name]
        if (sim.running[name] < spec.profile.capacity and not sim.queue[name]
                and resources.fits(task.needs, spec.profile.resources, sim.held[name])):
            return name
    sim.central.append(task)
    return None


def fifo_slots(sim: Sim, task: Task, now: float) -> str | None:
    """Slot-counting FIFO: the first node with a free slot (memory ignored), else the
    central queue."""
    for name in sim.present:
        if sim.running[name] < sim.specs[name].profile.capacity:
            return name
    sim.central.append(task)
    return None


#: (label, factory, enforce): whether the nodes hold starts to what they declare.
GPU_POLICIES: tuple[tuple[str, Callable[[], Policy], bool], ...] = (
    ("fifo, slot counting", lambda: fifo_slots, False),
    ("fifo, memory-aware", lambda: fifo_fit, True),
    ("weighted, fit spread (default)", lambda: Auction("weighted", fit="spread"), True),
    ("weighted, fit pack", lambda: Auction("weighted", fit="pack"), True),
)


@dataclass
class GpuMetrics:
    """One run of one policy in the resource scenario."""

    tasks: int
    misplaced: int
    never_fits: int
    use: float
    use_within: float
    success: float
    p50: float
    p90: float
    p99: float
    big_waited_room: float
    big_p90: float
    small_p90: float


def _p(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else float("nan")


def measure_gpu(sim: Sim) -> GpuMetrics:
    """The resource figures of a finished run."""
    recs, tasks = sim.records, sim.tasks
    done = [(r, t) for r, t in zip(recs, tasks, strict=True) if r.node is not None]
    took = [r.finish - t.arrival for r, t in done]
    big = [(r, t) for r, t in done if t.needs[GPU] >= BIG]
    small = [r.finish - t.arrival for r, t in done if t.needs[GPU] < BIG]
    declared = sum(s.profile.resources[GPU] for s in sim.specs.values()) * sim.horizon
    return GpuMetrics(
        tasks=len(tasks),
        misplaced=sim.misplaced,
        never_fits=sim.never_fits,
        use=sim.held_seconds.get(GPU, 0.0) / declared,
        use_within=sim.usable_seconds.get(GPU, 0.0) / declared,
        success=statistics.fmean(r.success for r in recs),
        p50=_p(took, 50), p90=_p(took, 90), p99=_p(took, 99),
        big_waited_room=sum(r.queued == "room" for r, _ in big) / max(1, len(big)),
        big_p90=_p([r.finish - t.arrival for r, t in big], 90),
        small_p90=_p(small, 90),
    )


def gpu_seed(seed: int) -> dict[str, GpuMetrics]:
    """Every policy of GPU_POLICIES on the same TASKS tasks of ``seed``."""
    federation = gpu_federation()
    tasks = gpu_tasks(TASKS, seed, gpu_rate(federation))
    founders = [s.name for s in federation]
    random.Random(seed).shuffle(founders)
    out = {}
    for label, factory, enforce in GPU_POLICIES:
        sim = simulate(factory(), tasks, federation, founders, stream_seed(seed, label),
                       enforce=enforce)
        out[label] = measure_gpu(sim)
    return out


def describe() -> str:
    """The GPU federation and the task mix, one line."""
    fed = gpu_federation()
    return (", ".join(f"{n} x {kind} {mem} GB ({slots} slots, {mean:.0f} s, p {p:.2f})"
                      for kind, mem, n, slots, mean, p in GPUS)
            + "; tasks " + ", ".join(f"{s} GB {w:.0%}" for s, w in SIZES)
            + f"; {gpu_rate(fed):.3f} tasks/s = {MEMORY_LOAD:.0%} of the GPU memory")


def table(results: list[dict[str, GpuMetrics]]) -> str:
    """One row per policy, means ± sd over seeds (misplacements: summed)."""
    head = ("policy", "tasks", "misplaced starts (never fit)", "GPU memory held / declared %",
            "within declared %", "success %", "completion p50 / p90 / p99 s",
            f"tasks >= {BIG} GB: waited for memory with a slot free %", f">= {BIG} GB p90 s",
            f"< {BIG} GB p90 s")
    lines = [row(head), rule(len(head))]
    for label, _, _ in GPU_POLICIES:
        ms = [r[label] for r in results]
        lines.append(row([
            label, str(sum(m.tasks for m in ms)),
            f"{sum(m.misplaced for m in ms)} ({sum(m.never_fits for m in ms)})",
            mean_sd([m.use for m in ms], ".1f", 100),
            mean_sd([m.use_within for m in ms], ".1f", 100),
            mean_sd([m.success for m in ms], ".1f", 100),
            " / ".join(f"{statistics.fmean(getattr(m, q) for m in ms):.0f}"
                       for q in ("p50", "p90", "p99")),
            mean_sd([m.big_waited_room for m in ms], ".1f", 100),
            mean_sd([m.big_p90 for m in ms], ".0f"),
            mean_sd([m.small_p90 for m in ms], ".0f"),
        ]))
    return "\n".join(lines)
