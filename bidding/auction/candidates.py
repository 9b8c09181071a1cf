"""Which live nodes are asked to bid: filter, then score and cap, as the Kubernetes scheduler does.

Candidates are live nodes with at least one required skill whose declared resources cover the
task's needs, not excluded from the task. Above ``candidate_cap`` we keep the best half by a
prior score (skill match, and what is known of the node on the task's type times the share of
a slot it has free) and draw the rest at random, so good nodes are always asked and new or unlucky
ones still get a chance to earn a history. The default cap, "auto", grows with the eligible nodes
(``scaled_cap``).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence

from bidding import resources
from bidding.auction import scores
from bidding.models import Announcement, BidMode
from bidding.nodes.kin import KinRecord, kin_pools
from bidding.nodes.records import Record
from bidding.nodes.registry import LiveNode
from bidding.strategies.builtins import tie_random
from bidding.strategies.formulas import slot_share

#: The width of the prior's bands of expected success (it was 10 points, which lumped replicas
#: a few points apart; decision 0043).
BAND = 0.02


def prior_score(announcement: Announcement, node: LiveNode,
                record: Record | None = None, kin: KinRecord | None = None,
                in_flight: int = 0) -> float:
    """What the producer can tell about a node before it bids: skill match, and its expected
    success on the task's type times the share of a slot it would give the task
    (``formulas.slot_share`` of its ``in_flight`` tasks, as the default strategy takes it).

    With ``kin`` (its kin's pooled records) that have a record on the type, the expectation
    is the node's ``record`` there (attempts, successes) smoothed toward what its kin's
    record says of it, as its bid's longer record is (``scores.kin_informed_prior``).
    Otherwise, its trust as learned from its record (the declared trust moved toward its
    success rate, as in bids), then moved toward its ``record`` on the type when given. Both
    in bands of ``BAND`` (2 points), so that a replica and a lone node compare on one scale.

    Declared trust alone let a node that claims every skill and high trust hold a place in the
    best half however often it failed (bench/quality.py --caps, 32 nodes: cap 4 got 76.7%
    success with declared trust, 85.6% with learned trust). The node-wide record does not see
    who is good at the task type at hand: with the type's record, the best half holds the
    nodes that do this type well (bench/quality.py, "Ranking the asked nodes"). The kin's
    pooled record tells apart replicas a few points apart, which a few dozen episodes of the
    type cannot; and a ranking that sharp, blind to load, asks the same best few while their
    slots are full (bench/quality.py, "Ranking with the kin's record and the slot share").
    """
    match = scores.capability_score(announcement.required_skills, node.capabilities)
    if kin is not None and kin.on_type[0] > 0:
        attempts, successes = record if record is not None else (0, 0)
        prior, weight = scores.kin_informed_prior(
            kin.on_type, (node.attempts, node.successes), kin.overall)
        expected = scores.smoothed_rate(attempts, successes, prior, weight)
    else:
        trust = scores.learned_trust(node.trust, node.successes, node.attempts)
        if record is not None:
            trust = scores.learned_trust(trust, record[1], record[0])
        expected = trust / 100.0
    expected *= slot_share(in_flight, node.capacity)
    # In bands of 2 points, as the Kubernetes scheduler scores in coarse integers: nodes with
    # about the same record tie, and ties are drawn at random, so the best half rotates among
    # them instead of going to the same few for ever (the epsilon keeps a rate on a band's
    # edge, 0.9 as 0.8999..., in its band).
    return 0.7 * match + 0.3 * math.floor(expected / BAND + 1e-9) * BAND


#: The share of a capped auction's candidates taken by rank (the rest are drawn at random,
#: so that every node is asked now and then and a changed one is seen).
RANKED_SHARE = 0.5

#: The "auto" cap's floor: up to this many eligible nodes, all are asked.
AUTO_CAP_FLOOR = 8


def scaled_cap(eligible: int) -> int:
    """The "auto" candidate cap for ``eligible`` nodes: 8 up to 16, then ``ceil(2 * sqrt(n))``
    (12 of 32, 23 of 128, 32 of 256, 64 of 1,000).

    Why it grows: a fixed 8 left the best nodes of a large federation out of most auctions (its
    best half is ranked by node-wide trust, which does not see who is good at this task type).
    bench/quality.py at 128 nodes: 5.8-6.3 points below the oracle that fills free slots first
    with 8 asked, 3.8-3.9 with 23. Why not all of them: each candidate is a bid to compute (by
    the announcer, or by the node on its own listener), and an announcement to 1,000 nodes
    would cost every auction a thousand. The square root is the usual trade (as Sparrow samples
    a few machines per task, not every one).
    """
    return max(AUTO_CAP_FLOOR, math.ceil(2 * math.sqrt(eligible)))


def not_excluded(capable: Sequence[LiveNode], exclude: Sequence[str]) -> list[LiveNode]:
    """The capable nodes a new attempt may go to (DESIGN rule 7).

    Exclusions steer, they do not strand a task: every node that failed the task (or went
    offline with it) is left out while another can do it; if none is left, only the node that
    just failed (the last one excluded) is; and if that one is the only capable node, the
    retry goes back to it. A task on three nodes with three retries, or on one capable node,
    still gets every attempt its policy allows, and ends with its own error.
    """
    if not exclude:
        return list(capable)
    for out in (set(exclude), {exclude[-1]}):
        kept = [n for n in capable if n.name not in out]
        if kept:
            return kept
    return list(capable)


def select_candidates(
    announcement: Announcement, live: Sequence[LiveNode], rng: random.Random | None = None,
    records: Callable[[Sequence[str]], Mapping[str, Record]] | None = None,
    loads: Callable[[Sequence[str]], Mapping[str, int]] | None = None,
) -> list[str]:
    """Live nodes that could bid (filter), capped at ``announcement.candidate_cap`` (the best
    half by ``prior_score``, and the rest at random; "auto": ``scaled_cap`` of the eligible
    nodes).

    Nodes in ``announcement.exclude_nodes`` (they failed this task or went offline with it) are
    left out while others can do it (``not_excluded``). ``records``: the capable nodes'
    records on the task's type, asked for only when there are more than the cap (the nodes are
    ranked with them and their kin's, pooled from them; a node without one is ranked by its
    node-wide record). ``loads``: their tasks in flight, asked for with the records: a full
    node's expectation is taken times its slot share (a node missing from the answer counts
    as free).
    """
    required = set(announcement.required_skills)
    capable = [n for n in live if (not required or required & set(n.capabilities))
               and resources.shortfall(announcement.resources, n.resources) is None]
    eligible = not_excluded(capable, announcement.exclude_nodes)
    cap = announcement.candidate_cap
    if cap == "auto":
        cap = scaled_cap(len(eligible))
    if cap == 0 or len(eligible) <= cap:
        return [n.name for n in eligible]
    rng = rng or tie_random()
    names = [n.name for n in eligible]
    # The capable nodes' records, not only the eligible ones': a replica left out of a retry
    # (it failed the task) still counts in its kin's record on the type, as in their bids.
    typed = records([n.name for n in capable]) if records is not None else {}
    kin = kin_pools(live, names, typed)
    in_flight = loads(names) if loads is not None else {}
    # A full node ranks as the default strategy would score it (its expectation times its
    # slot share): a ranking sharp enough to tell replicas apart would otherwise ask the same
    # best few while they are full, and leave out free nodes a little worse (decision 0043).
    ranked = sorted(eligible, key=lambda n: (
        -prior_score(announcement, n, typed.get(n.name), kin.get(n.name),
                     in_flight.get(n.name, 0)), rng.random()))
    keep = math.ceil(cap * RANKED_SHARE)
    chosen = ranked[:keep] + rng.sample(ranked[keep:], cap - keep)
    return [n.name for n in chosen]


def split_by_bidder(
    mode: BidMode, live: Sequence[LiveNode], candidates: Sequence[str]
) -> tuple[list[str], list[str]]:
    """Which candidates the announcer bids for (proxied) and which it asks, in ``mode``:
    "proxy" bids for all, "ask" asks all, "auto" bids for the nodes that bid with the built-in
    function alone (their heartbeat says so) and asks those with a bidder of their own."""
    if mode == "proxy":
        return list(candidates), []
    if mode == "ask":
        return [], list(candidates)
    builtin = {node.name for node in live if node.builtin_bidder}
    return ([c for c in candidates if c in builtin], [c for c in candidates if c not in builtin])
