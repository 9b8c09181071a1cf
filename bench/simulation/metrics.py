"""What one run of one policy scores: success, completion, load spread, specialization."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.simulation.federation import WARMUP, NodeSpec, best_rates
from bench.simulation.sim import Sim

#: Tasks per window of the specialization and newcomer series.
WINDOW = 100
#: Tasks in the rolling success rate.
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
    #: Percentiles of completion (finish - arrival) over executed tasks after warm-up.
    completion_p50: float = math.nan
    completion_p90: float = math.nan
    completion_p99: float = math.nan


def measure(sim: Sim, federation: Sequence[NodeSpec]) -> Metrics:
    """The metrics of a finished run."""
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
    done_warm = [r.finish - t.arrival for r, t in zip(recs[warm:], tasks[warm:], strict=True)
                 if r.node is not None]
    cuts = statistics.quantiles(done_warm, n=100) if len(done_warm) > 1 else [math.nan] * 99
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
        completion_p50=cuts[49],
        completion_p90=cuts[89],
        completion_p99=cuts[98],
    )
