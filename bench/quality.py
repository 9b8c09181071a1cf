"""Allocation quality: a seeded discrete-event simulation of a heterogeneous federation.

Issue 4, section 3. The bidding policies call the PRODUCTION code for every task:
``auction.candidates.select_candidates`` (who is asked), ``auction.bid.compute_bid`` (each
node's bid from its profile and a ``NodeHistory`` built exactly as
``auction.history.gather_history`` builds it from the store), ``auction.decision.refresh_loads``
and ``auction.decision.decide`` with the strategy from ``strategies.resolve_strategy``.
Nothing of their formulas is copied here.

The simulation keeps, per node, what the store would hold: episodes (task type, success,
finish time) and in-flight work (awarded and not finished: queued on the node or running).
An awarded task waits in the node's execution queue while all its slots are busy, as in
Celery's ``exec.<node>`` queue. Time is in seconds, so the production settings
(``experience_window`` 10 episodes, read with the 20 before them, ``recent_failure_seconds``
3600 s) apply unchanged.

Baselines: FIFO (first free capable node in a fixed, per-seed shuffled order, else a central
queue served by whichever capable node frees first), random, least-loaded, and an oracle that
knows the true success probabilities (highest true probability among capable nodes, ties by
load). "Capable" is the production candidate filter: the node has one of the required skills.

Common random numbers: every policy sees the same arrivals, contents and per-task random
draws (a task succeeds on node n when u < p_true[n][type]), so differences come from the
allocation only.

``bench/simulation/proposals.py`` evaluates changes to the scoring in the simulation only,
without touching ``bidding/``: a bid function that calls ``compute_bid`` and replaces one
sub-score, and a subclass of the production ``WeightedScore`` that adds one multiplier.

Metrics: success rate (overall and after warm-up), mean completion time, load spread
(max/mean tasks per founding node), specialization (share of tasks on their type's truly best
node, per window of 100 tasks) and the share of the second half won by a newcomer that joins at
mid-run with no history. Plots: ``bench/quality_*.png`` (with matplotlib, from the ``bench``
extra; without it the plots are skipped).

At scale (``bench/simulation/scale.py``): 8, 32, 128 and 256 nodes (the federation grown with
twins of different speeds and reliabilities), at 50% and 90% load; FIFO, least loaded, power of
two choices, the default, the oracle and the oracle that fills free slots first; success, p50,
p90 and p99 completion, load spread, the newcomers' share. Drift
(``bench/simulation/drift.py``): a specialist's true rate falls from 0.95 to 0.3 at mid-run; how
many tasks it wins before its share is a bad node's. Resources (``bench/simulation/gpu.py``):
GPU-memory requests of mixed sizes on mixed GPUs, 10,000 tasks; misplacements, memory use,
spread against pack, against slot-counting FIFO.

Run: ``.venv/bin/python bench/quality.py [--tasks N] [--seed S] [--seeds K]
[--only comparison,scale,drift,resources] [--scale-tasks F]``: by default every part, each on
K seeds (a few minutes on 2 cores with K = 1). ``--only gap --sizes 32,128`` (not in the
default) runs the scale study's default strategy knowing the true rates, or only its kind of
node's, or the best estimate a learner could make (Bayes), and asking every node, one change
at a time (``bench/simulation/gap.py``): where its
gap to the oracle that fills free slots first comes from.

Candidate-cap study: ``--caps 4,6,8,0 --copies K`` replicates the federation K times (twins with
the same true rates, the offered load scaled with the capacity, N tasks per copy) and runs FIFO,
the oracle and the default strategy asking at most each cap (0: every eligible node), all on the
same tasks and random stream. "Best node" is then any node with the type's best true rate, and
the newcomers are all the twins of the newcomer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).absolute().parent
# Running as a script puts bench/ first on sys.path; its modules must not shadow the stdlib, and
# the bench package is imported from the repository root. (Here, not in bench.common: this is
# what makes bench.common importable.)
sys.path[:] = [p for p in sys.path if Path(p or ".").absolute() != BENCH_DIR]
if str(BENCH_DIR.parent) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR.parent))

from bench.simulation import drift, gap, gpu, scale  # noqa: E402
from bench.simulation.federation import NEWCOMER, WARMUP  # noqa: E402
from bench.simulation.metrics import Metrics  # noqa: E402
from bench.simulation.plots import plot_report, plot_scale  # noqa: E402
from bench.simulation.policies import TARGETED  # noqa: E402
from bench.simulation.proposals import PRIOR_EPISODES  # noqa: E402
from bench.simulation.report import (  # noqa: E402
    cap_study,
    describe_federation,
    markdown,
    per_node_table,
    table,
    targets,
)
from bench.simulation.runner import cap_study_seed, run_seed  # noqa: E402

#: "gap" is not run by default: it says where the scale study's gap comes from.
PARTS = ("comparison", "scale", "drift", "resources")
EXTRA_PARTS = ("gap",)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
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
    parser.add_argument("--only", default=",".join(PARTS),
                        help=f"parts to run, comma-separated (default: all of {','.join(PARTS)}; "
                             f"also: {','.join(EXTRA_PARTS)})")
    parser.add_argument("--sizes", default=",".join(str(n) for n in scale.SIZES),
                        help="scale: federation sizes (default 8,32,128,256)")
    parser.add_argument("--scale-tasks", type=float, default=1.0,
                        help="scale: multiply the tasks per run (default 1: "
                             + ", ".join(f"{t} at {n}" for n, t in scale.TASKS.items()) + ")")
    return parser.parse_args(argv)


def print_cap_study(args: argparse.Namespace, seeds: list[int]) -> None:
    """``--caps``: the candidate-cap study's table."""
    caps = tuple(int(c) for c in args.caps.split(",") if c.strip())
    study = [(args.tasks, s, args.copies, caps) for s in seeds]
    with ProcessPoolExecutor(max(1, min(args.jobs, len(seeds)))) as pool:
        found = list(pool.map(cap_study_seed, study))
    print(f"candidate-cap study: {args.tasks} tasks per copy, seeds {seeds}, "
          f"warm-up {WARMUP:.0%}, newcomers join at mid-run")
    print(cap_study(found, args.copies))


def print_comparison(args: argparse.Namespace, seeds: list[int],
                     results: list[dict[str, Metrics]]) -> None:
    """Every policy on the same tasks: the federation, the tables, the targets, the plots."""
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
        for line in plot_report(results, args.tasks, seeds):
            print(line)


def run_parts(args: argparse.Namespace, seeds: list[int]) -> None:
    """Every part asked for, their runs on one pool of processes (the longest first), then
    their reports in order."""
    parts = [p.strip() for p in args.only.split(",") if p.strip()]
    unknown = set(parts) - set(PARTS) - set(EXTRA_PARTS)
    if unknown:
        raise SystemExit(f"--only: unknown part(s) {', '.join(sorted(unknown))}")
    sizes = tuple(int(n) for n in args.sizes.split(",") if n.strip())
    work: list[tuple[str, Callable[[Any], Any], Any, int]] = []
    if "comparison" in parts:
        work += [("comparison", run_seed, (args.tasks, s, args.prior_episodes), args.tasks * 11)
                 for s in seeds]
    if "scale" in parts:
        work += [("scale", scale.scale_seed, j, j[3] * (3 + j[0] // 32))
                 for j in scale.jobs(sizes, scale.LOADS, seeds, args.scale_tasks)]
    if "drift" in parts:
        work += [("drift", drift.drift_seed, (n, load, s, drift.TASKS[n]), drift.TASKS[n] * 3)
                 for n in drift.SIZES for load in scale.LOADS for s in seeds]
    if "resources" in parts:
        work += [("resources", gpu.gpu_seed, s, gpu.TASKS * 4) for s in seeds]
    if "gap" in parts:
        work += [("gap", gap.gap_seed, j, j[3] * (3 + j[0] // 32))
                 for j in scale.jobs(sizes, scale.LOADS, seeds, args.scale_tasks)]
    work.sort(key=lambda w: -w[3])
    with ProcessPoolExecutor(max(1, min(args.jobs, len(work)))) as pool:
        futures = [(part, pool.submit(fn, arg)) for part, fn, arg, _ in work]
        done: dict[str, list[Any]] = {p: [] for p in (*PARTS, *EXTRA_PARTS)}
        for part, future in futures:
            done[part].append(future.result())
    if "comparison" in parts:
        print_comparison(args, seeds, done["comparison"])
    if "scale" in parts:
        cells: scale.Cells = {}
        for nodes, load, out in done["scale"]:
            cells.setdefault((nodes, load), []).append(out)
        print(f"\n## at scale: seeds {seeds}, tasks per run "
              + ", ".join(f"{int(scale.TASKS.get(n, 60 * n) * args.scale_tasks)} at {n} nodes"
                          for n in sizes)
              + f"; newcomers hold {scale.newcomer_capacity_share():.1%} of the capacity in "
              "the 2nd half\n")
        print(scale.table(cells))
        print("\ntargets at scale (the default against the oracle that fills free slots "
              "first, success after warm-up; p90 against power of two at 90% load):\n")
        print(scale.targets(cells))
        if not args.no_plots:
            for line in plot_scale(cells, seeds):
                print(line)
    if "drift" in parts:
        dcells: dict[tuple[int, float], list[dict[str, drift.Drift]]] = {}
        for nodes, load, out in done["drift"]:
            dcells.setdefault((nodes, load), []).append(out)
        print(f"\n## drift: {drift.DRIFTED} {drift.BEFORE} -> {drift.AFTER} at mid-run, "
              f"seeds {seeds}, tasks " + ", ".join(f"{t} at {n} nodes"
                                                  for n, t in drift.TASKS.items()) + "\n")
        print(drift.table(dcells))
    if "gap" in parts:
        print(f"\n## where the gap at scale comes from: points below the oracle that fills "
              f"free slots first, seeds {seeds}\n")
        print(gap.table(done["gap"]))
    if "resources" in parts:
        print(f"\n## resources: seeds {seeds}, {gpu.TASKS} tasks per run; {gpu.describe()}\n")
        print(gpu.table(done["resources"]))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the simulation and print the report (with or without matplotlib: exit 0)."""
    args = parse_args(argv)
    started = time.perf_counter()
    seeds = list(range(args.seed, args.seed + args.seeds))
    if args.caps is not None:
        print_cap_study(args, seeds)
    else:
        run_parts(args, seeds)
    print(f"\n{time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
