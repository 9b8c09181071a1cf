"""The simulation's plots, ``bench/quality_*.png``: success over time, specialization and the
newcomer's share, tasks per node.

matplotlib is in the optional ``bench`` extra, which ``make`` does not install: without it the
plots are skipped with one line saying how to get them, and the report is complete without them.
"""

from __future__ import annotations

import importlib.util
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common.paths import BENCH_DIR
from bench.simulation.federation import FEDERATION, NEWCOMER, WARMUP
from bench.simulation.metrics import ROLLING, WINDOW
from bench.simulation.policies import POLICIES
from bench.simulation.report import Results

SKIPPED = ("plots skipped: matplotlib is not installed "
           "(`.venv/bin/pip install -e '.[bench]'` installs it)")
#: Line style per policy kind: baselines solid, the reference dotted, proposals dashed.
STYLES = {"base": "-", "ref": ":", "proposal": "--"}


def plot_report(results: Results, n_tasks: int, seeds: Sequence[int]) -> list[str]:
    """Write the plots; the report's lines about them ("wrote ...", or why they were not)."""
    if importlib.util.find_spec("matplotlib") is None:
        return [SKIPPED]
    return [f"wrote {path.relative_to(BENCH_DIR.parent)}"
            for path in plot(results, n_tasks, seeds)]


def _avg(results: Results, attr: str, label: str) -> list[float]:
    """A per-task or per-window series of ``label``'s metrics, averaged over seeds."""
    series = [getattr(r[label], attr) for r in results]
    return [statistics.fmean(col) for col in zip(*series, strict=True)]


def plot(results: Results, n_tasks: int, seeds: Sequence[int]) -> list[Path]:
    """Write the three PNGs into bench/; their paths."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    labels = [label for label, _, _ in POLICIES]
    styles = {label: STYLES[kind] for label, _, kind in POLICIES}
    palette = [*(plt.get_cmap("tab10")(i) for i in range(10)), "black", "gold"]
    look = {label: {"style": styles[label], "color": color}
            for label, color in zip(labels, palette, strict=False)}
    suffix = f"{len(seeds)} seed(s) {seeds[0]}..{seeds[-1]}, {n_tasks} tasks"
    paths = [BENCH_DIR / "quality_success.png", BENCH_DIR / "quality_specialization.png",
             BENCH_DIR / "quality_tasks_per_node.png"]
    for draw, path in zip((_success, _specialization, _tasks_per_node), paths, strict=True):
        fig = draw(plt, results, n_tasks, look, suffix)
        fig.savefig(path, dpi=110, bbox_inches="tight")
        plt.close(fig)
    return paths


def _success(plt: Any, results: Results, n_tasks: int, look: dict[str, dict[str, Any]],
             suffix: str) -> Any:
    fig, ax = plt.subplots(figsize=(11, 6))
    for label, lk in look.items():
        ax.plot(range(n_tasks), [100 * v for v in _avg(results, "rolling_success", label)],
                lk["style"], color=lk["color"], label=label, linewidth=1.3)
    ax.axvline(int(n_tasks * WARMUP), color="red", linestyle="-.", alpha=0.5,
               label="end of warm-up")
    ax.axvline(n_tasks // 2, color="black", linestyle=":", label=f"{NEWCOMER} joins")
    ax.set(xlabel="task (arrival order)", ylabel=f"success % (rolling {ROLLING} tasks)",
           title=f"Success rate over time ({suffix})")
    ax.legend(fontsize=8, loc="lower right", ncol=2)
    ax.grid(alpha=0.3)
    return fig


def _specialization(plt: Any, results: Results, n_tasks: int,
                    look: dict[str, dict[str, Any]], suffix: str) -> Any:
    join = n_tasks // 2
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(11, 9), sharex=True,
                                  gridspec_kw={"height_ratios": [2, 1]})
    centers = [i + WINDOW / 2 for i in range(0, n_tasks - WINDOW + 1, WINDOW)]
    for label, lk in look.items():
        ax.plot(centers, [100 * v for v in _avg(results, "specialization", label)], lk["style"],
                color=lk["color"], label=label, marker=".", linewidth=1.2)
        ax2.plot(centers, [100 * v for v in _avg(results, "newcomer_windows", label)],
                 lk["style"], color=lk["color"], label=label, marker=".", linewidth=1.2)
    for a in (ax, ax2):
        a.axvline(join, color="black", linestyle=":")
        a.grid(alpha=0.3)
    ax.set(ylabel="% of tasks on their truly best node",
           title=f"Specialization per window of {WINDOW} tasks ({suffix})")
    ax.legend(fontsize=8, ncol=2)
    ax2.set(xlabel="task (arrival order)", ylabel=f"% of window won by {NEWCOMER}",
            title=f"Newcomer {NEWCOMER} (joins at task {join}, no history)")
    return fig


def _tasks_per_node(plt: Any, results: Results, n_tasks: int,
                    look: dict[str, dict[str, Any]], suffix: str) -> Any:
    fig, ax = plt.subplots(figsize=(12, 6))
    nodes = [s.name for s in FEDERATION]
    width = 0.8 / len(look)
    for i, (label, lk) in enumerate(look.items()):
        counts = [statistics.fmean(r[label].per_node[n] for r in results) for n in nodes]
        ax.bar([j + (i - len(look) / 2 + 0.5) * width for j in range(len(nodes))], counts,
               width, color=lk["color"], label=label,
               hatch={"--": "//", ":": ".."}.get(lk["style"]), edgecolor="white")
    ax.set_xticks(range(len(nodes)))
    ax.set_xticklabels([f"{s.name}\ncap {s.profile.capacity}" for s in FEDERATION])
    ax.set(ylabel="tasks", title=f"Tasks per node per policy ({suffix})")
    ax.legend(fontsize=8, ncol=2)
    ax.grid(alpha=0.3, axis="y")
    return fig



def plot_scale(cells: Any, seeds: Sequence[int]) -> list[str]:
    """``bench/quality_scale.png``: success after warm-up and p90 completion against the
    number of nodes, per policy, at each load; the report's lines about it."""
    if importlib.util.find_spec("matplotlib") is None:
        return [SKIPPED]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from bench.simulation.scale import SCALE_POLICIES

    loads = sorted({load for _, load in cells})
    sizes = sorted({n for n, _ in cells})
    fig, axes = plt.subplots(2, len(loads), figsize=(6 * len(loads), 9), squeeze=False)
    for col, load in enumerate(loads):
        for label, _ in SCALE_POLICIES:
            style = ":" if label.startswith("ref") else "-"
            for r, (attr, scale_by) in enumerate((("success_warm", 100), ("completion_p90", 1))):
                ys = [statistics.fmean(getattr(res[label], attr) * scale_by
                                       for res in cells[(n, load)]) for n in sizes]
                axes[r][col].plot(sizes, ys, style, marker="o", label=label)
        axes[0][col].set(title=f"load {load:.0%}", ylabel="success % after warm-up")
        axes[1][col].set(xlabel="nodes", ylabel="completion p90 s (log)", yscale="log")
        for r in (0, 1):
            axes[r][col].set_xscale("log", base=2)
            axes[r][col].set_xticks(sizes, [str(n) for n in sizes])
            axes[r][col].grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Allocation quality at scale ({len(seeds)} seed(s) {seeds[0]}..{seeds[-1]})")
    path = BENCH_DIR / "quality_scale.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return [f"wrote {path.relative_to(BENCH_DIR.parent)}"]
