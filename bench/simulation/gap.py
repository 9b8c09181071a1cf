"""Where the default's gap to the oracle that fills free slots first comes from, at scale.

The default strategy is run with what it knows and whom it asks changed one at a time, on the
scale study's federation, tasks and seeds (``scale``):

- *learned* (the default): each node's confidence is what it learned of itself on the task
  type (``scores.informed_confidence``: a replica's whole record there smoothed toward its
  kin's, while its latest episodes agree; else its latest episodes);
- *true*: each node's confidence is its true success rate on the type, as the oracle knows it;
- *class*: the true rate of the node it is a twin of (the founder), not its own: what a
  federation could learn about a kind of node, without telling its twins apart;
- *Bayes*: the best estimate a learner could make of each node, greedy as the auction is: it
  knows each founder's true rate (a founder's is exact) and how ``federation.varied`` spreads
  a twin's around it, and reads the twin's whole record on the type (all its episodes, not
  ``episodes_read``); its confidence is the posterior mean. What it leaves below the
  reference is what telling twins apart from their own episodes costs, at best;

each with the production candidate cap ("auto") and with every node asked (cap 0). Only the
confidence is replaced (``compute_bid``, then the bid's ``confidence``); the strategy,
``select_candidates`` and ``decide`` are the production ones. Nothing here is production code.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping

from bench.common.markdown import row, rule
from bench.simulation.auction import Auction, BidFn
from bench.simulation.baselines import oracle_free_slot
from bench.simulation.federation import NodeSpec
from bench.simulation.metrics import measure
from bench.simulation.runner import simulate, stream_seed
from bench.simulation.scale import DEFAULT, REFERENCE, cell
from bench.simulation.sim import Sim
from bench.simulation.tasks import Task
from bidding.auction.bid import NodeHistory, compute_bid
from bidding.models import Announcement, Bid, Refusal
from bidding.nodes.profile import NodeProfile

#: (label, what the bid's confidence is, candidate cap: None = the production default).
VARIANTS: tuple[tuple[str, str, int | None], ...] = (
    ("learned, auto cap (the default)", "learned", None),
    ("learned, every node asked", "learned", 0),
    ("class rate, auto cap", "class", None),
    ("class rate, every node asked", "class", 0),
    ("Bayes, auto cap", "bayes", None),
    ("Bayes, every node asked", "bayes", 0),
    ("true rate, auto cap", "true", None),
    ("true rate, every node asked", "true", 0),
)


def _knowing(rate: Callable[[str, str], float]) -> BidFn:
    """The production bid, its confidence replaced by ``rate(node, task type)``."""
    def bid(announcement: Announcement, profile: NodeProfile, history: NodeHistory,
            now: float) -> Bid | Refusal:
        made = compute_bid(announcement, profile, history, now)
        if isinstance(made, Refusal):
            return made
        return made.model_copy(update={
            "confidence": rate(profile.name, announcement.task_type)})
    return bid


#: The factors a twin's true rates are its founder's times (``federation.varied``: uniform in
#: [0.9, 1.05], the rate at most 0.99), on a grid.
FACTORS = tuple(0.9 + 0.15 * i / 60 for i in range(61))


def posterior_mean(founder_rate: float, tried: int, won: int) -> float:
    """A twin's expected true rate given its founder's and its own record on the type."""
    rates = [min(0.99, founder_rate * f) for f in FACTORS]
    logs = [won * math.log(p) + (tried - won) * math.log(1 - p) for p in rates]
    top = max(logs)
    weights = [math.exp(v - top) for v in logs]
    return sum(w * p for w, p in zip(weights, rates, strict=True)) / sum(weights)


class BayesAuction(Auction):
    """The production auction whose bids' confidence is ``posterior_mean`` of each node (its
    whole record read from the simulation itself; a founder's true rate is known)."""

    def __init__(self, specs: Mapping[str, NodeSpec], cap: int | None) -> None:
        super().__init__("weighted", bid_fn=self._bid, cap=cap)
        self._specs = specs
        self._typed: dict[tuple[str, str], tuple[int, int]] = {}

    def __call__(self, sim: Sim, task: Task, now: float) -> str | None:
        self._typed = sim.typed
        return super().__call__(sim, task, now)

    def _bid(self, announcement: Announcement, profile: NodeProfile, history: NodeHistory,
             now: float) -> Bid | Refusal:
        made = compute_bid(announcement, profile, history, now)
        if isinstance(made, Refusal):
            return made
        task_type = announcement.task_type
        founder, _, copy = profile.name.rpartition("-")
        if not copy.isdigit():  # a founder: its own rate, exactly
            rate = self._specs[profile.name].p_true[task_type]
        else:
            tried, won = self._typed.get((profile.name, task_type), (0, 0))
            rate = posterior_mean(self._specs[founder].p_true[task_type], tried, won)
        return made.model_copy(update={"confidence": rate})


def bid_fn(knows: str, specs: Mapping[str, NodeSpec]) -> BidFn:
    """The bid function of a variant: ``compute_bid`` itself, or one that knows the rates."""
    if knows == "true":
        return _knowing(lambda node, task_type: specs[node].p_true[task_type])
    if knows == "class":
        # A twin is named after its founder ("atlas-3" of "atlas").
        return _knowing(lambda node, task_type:
                        specs[node.rsplit("-", 1)[0]].p_true[task_type])
    return compute_bid


def gap_seed(args: tuple[int, float, int, int]) -> tuple[int, float, dict[str, float]]:
    """(nodes, load, seed, tasks): success after warm-up of the reference and each variant."""
    nodes, load, seed, n_tasks = args
    federation, tasks, founders = cell(nodes, load, seed, n_tasks)
    specs = {s.name: s for s in federation}
    out = {}
    ref = simulate(oracle_free_slot, tasks, federation, founders, stream_seed(seed, REFERENCE))
    out[REFERENCE] = measure(ref, federation).success_warm
    for label, knows, cap in VARIANTS:
        policy = (BayesAuction(specs, cap) if knows == "bayes"
                  else Auction("weighted", bid_fn=bid_fn(knows, specs), cap=cap))
        # Every variant on the default's random stream: they differ only in what they know
        # and whom they ask.
        sim = simulate(policy, tasks, federation, founders, stream_seed(seed, DEFAULT))
        out[label] = measure(sim, federation).success_warm
    return nodes, load, out


def table(results: list[tuple[int, float, dict[str, float]]]) -> str:
    """Points below the reference per size and load (mean over seeds), one column a variant."""
    cells: dict[tuple[int, float], list[dict[str, float]]] = {}
    for nodes, load, out in results:
        cells.setdefault((nodes, load), []).append(out)
    head = ("nodes", "load", "reference success %", *(label for label, _, _ in VARIANTS))
    lines = [row(head), rule(len(head))]
    for (nodes, load), outs in sorted(cells.items()):
        ref = statistics.fmean(o[REFERENCE] for o in outs)
        lines.append(row([str(nodes), f"{load:.0%}", f"{100 * ref:.1f}", *(
            f"{100 * statistics.fmean(o[REFERENCE] - o[label] for o in outs):.1f}"
            for label, _, _ in VARIANTS)]))
    return "\n".join(lines)
