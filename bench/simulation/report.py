"""The simulation's report: the federation, the policy table, tasks per node, the targets,
and the candidate-cap study's table. Means ± sd over seeds."""

from __future__ import annotations

import statistics

from bench.common.markdown import row, rule
from bench.common.stats import mean_sd
from bench.simulation.federation import (
    FEDERATION,
    NEWCOMER,
    TARGET_LOAD,
    arrival_rate,
    best_nodes,
)
from bench.simulation.metrics import Metrics
from bench.simulation.policies import POLICIES

#: One run's metrics per policy label, for each seed.
Results = list[dict[str, Metrics]]

COLUMNS = ("policy", "success %", "success % after warm-up", "completion s", "load max/mean",
           "on best node % after warm-up", "newcomer % of 2nd half", "unawarded")
CAP_COLUMNS = ("policy", "success % after warm-up", "vs FIFO", "below oracle", "load max/mean",
               "on best node % after warm-up", "newcomers % of 2nd half")


def describe_federation() -> str:
    """The offered load, the best node per type, and every node's profile and true rates."""
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


def table(results: Results) -> list[list[str]]:
    """One row of COLUMNS per policy."""
    rows = []
    for label, _, _ in POLICIES:
        ms = [r[label] for r in results]
        rows.append([
            label,
            mean_sd([m.success for m in ms], ".1f", 100),
            mean_sd([m.success_warm for m in ms], ".1f", 100),
            mean_sd([m.completion_s for m in ms], ".0f"),
            mean_sd([m.load_ratio for m in ms], ".2f"),
            mean_sd([m.specialization_warm for m in ms], ".1f", 100),
            mean_sd([m.newcomer_share for m in ms], ".1f", 100),
            mean_sd([float(m.unawarded) for m in ms], ".0f"),
        ])
    return rows


def markdown(rows: list[list[str]]) -> str:
    """``table``'s rows under the COLUMNS header."""
    return "\n".join([row(COLUMNS), rule(len(COLUMNS)), *(row(r) for r in rows)])


def per_node_table(results: Results) -> str:
    """Tasks per node and policy, mean over seeds."""
    nodes = [s.name for s in FEDERATION]
    lines = [row(["policy", *nodes]), rule(len(nodes) + 1)]
    for label, _, _ in POLICIES:
        counts = [statistics.fmean(r[label].per_node[n] for r in results) for n in nodes]
        lines.append(row([label, *(f"{c:.0f}" for c in counts)]))
    return "\n".join(lines)


def targets(results: Results, label: str) -> str:
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


def cap_study(results: Results, copies: int) -> str:
    """The cap study as a markdown table (means +- sd over seeds)."""
    nodes = len(FEDERATION) * copies
    lines = [f"{nodes} nodes ({copies} x the federation), {len(results)} seed(s)", "",
             row(CAP_COLUMNS), rule(len(CAP_COLUMNS))]
    for label in results[0]:
        ms = [r[label] for r in results]
        over_fifo = statistics.fmean(r[label].success_warm - r["fifo"].success_warm
                                     for r in results)
        under_oracle = statistics.fmean(r["oracle"].success_warm - r[label].success_warm
                                        for r in results)
        lines.append(row([
            label,
            mean_sd([m.success_warm for m in ms], ".1f", 100),
            f"{100 * over_fifo:+.1f}",
            f"{100 * under_oracle:.1f}",
            mean_sd([m.load_ratio for m in ms], ".2f"),
            mean_sd([m.specialization_warm for m in ms], ".1f", 100),
            mean_sd([m.newcomer_share for m in ms], ".1f", 100),
        ]))
    return "\n".join(lines)
