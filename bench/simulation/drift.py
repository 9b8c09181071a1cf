"""Drift: a node's true success rate falls from 0.95 to 0.3 at mid-run; how fast its share falls.

The specialist ``pdfpro`` (the only type it can do is ``extract``) succeeds with probability
0.95 until the task at mid-run arrives and 0.3 from then on (``Sim.drift``), worse than the bad
node ``hype`` (0.35), which declares every skill. Nothing tells the policies: the default
learns it from the episodes its bids read (``NodeHistory.outcomes``, the last 10 of the type,
with the 20 before them, ``NodeHistory.earlier``, as their prior).

Caught: walking the ``extract`` tasks that arrive after the drift, the first at which the
drifted node's share of the last ``WINDOW`` extract tasks (those before the drift included) is
at the bad node's level (its share of all post-drift extract tasks, plus one task of the window)
or below. The figure is how many tasks the drifted node was awarded after the drift until then
(the target: at most 50), with its share of the last half of the post-drift extract tasks
beside the bad node's, to show that it stays down.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace

from bench.common.markdown import row, rule
from bench.common.stats import mean_sd
from bench.simulation.auction import Auction
from bench.simulation.baselines import fifo, power_of_two
from bench.simulation.federation import FEDERATION, arrival_rate, registration_order, varied
from bench.simulation.runner import simulate, stream_seed
from bench.simulation.sim import Policy, Sim
from bench.simulation.tasks import make_tasks

DRIFTED, BAD, TYPE = "pdfpro", "hype", "extract"
BEFORE, AFTER = 0.95, 0.3
WINDOW = 50
TARGET = 50
SIZES = (8, 32)
TASKS = {8: 3000, 32: 6000}
DRIFT_POLICIES: tuple[tuple[str, Callable[[], Policy]], ...] = (
    ("weighted (default)", lambda: Auction("weighted")),
    ("power of two", lambda: power_of_two),
    ("fifo", lambda: fifo),
)


@dataclass
class Drift:
    """One run: tasks the drifted node won after the drift until caught (None: never), all it
    won after the drift, and the shares of the last half of the post-drift extract tasks."""

    caught_after: int | None
    won_after: int
    share_late: float
    bad_share_late: float
    share_before: float


def measure_drift(sim: Sim, start: int) -> Drift:
    """The drift figures of a finished run whose drift began at task ``start``."""
    tasks, recs = sim.tasks, sim.records
    ext = [t.idx for t in tasks if t.task_type == TYPE]
    post = [i for i in ext if i >= start]
    pre = [i for i in ext if i < start]
    bad_level = sum(recs[i].node == BAD for i in post) / max(1, len(post))
    won = [recs[i].node == DRIFTED for i in ext]
    first_post = len(pre)
    caught = None
    for k in range(first_post, len(ext)):
        window = won[max(0, k - WINDOW + 1):k + 1]
        if sum(window) / len(window) <= bad_level + 1 / WINDOW:
            caught = sum(won[first_post:k + 1])
            break
    late = post[len(post) // 2:]
    return Drift(
        caught_after=caught,
        won_after=sum(won[first_post:]),
        share_late=sum(recs[i].node == DRIFTED for i in late) / max(1, len(late)),
        bad_share_late=sum(recs[i].node == BAD for i in late) / max(1, len(late)),
        share_before=sum(won[:first_post]) / max(1, first_post),
    )


def drift_seed(args: tuple[int, float, int, int]) -> tuple[int, float, dict[str, Drift]]:
    """(nodes, load, seed, tasks): each policy of DRIFT_POLICIES on the same drifting run."""
    nodes, load, seed, n_tasks = args
    base = tuple(replace(s, p_true={TYPE: BEFORE}) if s.name == DRIFTED else s
                 for s in FEDERATION)
    federation = varied(base, max(1, nodes // len(base)), seed)
    tasks = make_tasks(n_tasks, seed, arrival_rate(federation, load))
    founders = registration_order(federation, seed)
    start = n_tasks // 2
    drift = {DRIFTED: (tasks[start].arrival, AFTER)}
    out = {}
    for label, factory in DRIFT_POLICIES:
        sim = simulate(factory(), tasks, federation, founders, stream_seed(seed, label),
                       drift=drift)
        out[label] = measure_drift(sim, start)
    return nodes, load, out


def table(cells: dict[tuple[int, float], list[dict[str, Drift]]]) -> str:
    """One row per size, load and policy (means ± sd over seeds; caught: how many seeds)."""
    head = ("nodes", "load", "policy", f"{DRIFTED} share of {TYPE} before", "won after drift",
            "won until caught (<= 50)", "caught, seeds", f"share of late {TYPE}",
            f"{BAD}'s share")
    lines = [row(head), rule(len(head))]
    for (nodes, load), results in sorted(cells.items()):
        for label, _ in DRIFT_POLICIES:
            ds = [r[label] for r in results]
            caught = [d.caught_after for d in ds if d.caught_after is not None]
            lines.append(row([
                str(nodes), f"{load:.0%}", label,
                mean_sd([d.share_before for d in ds], ".1f", 100),
                mean_sd([float(d.won_after) for d in ds], ".0f"),
                (f"{statistics.fmean(caught):.0f} (max {max(caught)})" if caught else "-"),
                f"{len(caught)}/{len(ds)}",
                mean_sd([d.share_late for d in ds], ".1f", 100),
                mean_sd([d.bad_share_late for d in ds], ".1f", 100),
            ]))
    return "\n".join(lines)
