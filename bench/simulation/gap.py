"""Where the default's gap to the oracle that fills free slots first comes from, at scale.

The default strategy is run with what it knows and whom it asks changed one at a time, on the
scale study's federation, tasks and seeds (``scale``):

- *learned* (the default): each node's confidence is its estimate from its latest episodes of
  the task type (``scores.estimated_success``);
- *true*: each node's confidence is its true success rate on the type, as the oracle knows it;
- *class*: the true rate of the node it is a twin of (the founder), not its own: what a
  federation could learn about a kind of node, without telling its twins apart;

each with the production candidate cap ("auto") and with every node asked (cap 0). Only the
confidence is replaced (``compute_bid``, then the bid's ``confidence``); the strategy,
``select_candidates`` and ``decide`` are the production ones. Nothing here is production code.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping

from bench.common.markdown import row, rule
from bench.simulation.auction import Auction, BidFn
from bench.simulation.baselines import oracle_free_slot
from bench.simulation.federation import NodeSpec
from bench.simulation.metrics import measure
from bench.simulation.runner import simulate, stream_seed
from bench.simulation.scale import DEFAULT, REFERENCE, cell
from bidding.auction.bid import NodeHistory, compute_bid
from bidding.models import Announcement, Bid, Refusal
from bidding.nodes.profile import NodeProfile

#: (label, what the bid's confidence is, candidate cap: None = the production default).
VARIANTS: tuple[tuple[str, str, int | None], ...] = (
    ("learned, auto cap (the default)", "learned", None),
    ("learned, every node asked", "learned", 0),
    ("class rate, auto cap", "class", None),
    ("class rate, every node asked", "class", 0),
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
        policy = Auction("weighted", bid_fn=bid_fn(knows, specs), cap=cap)
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
