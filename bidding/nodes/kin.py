"""A node's kin: the live nodes that declare the same profile as it but for the name (the
replicas of one deployment, started from one profile template), and their record on a task
type pooled, from which a node with little record of its own on the type starts its bid.

A node's confidence on a task type is its success over its latest episodes, smoothed toward a
prior (``scores.estimated_success``). Without a record, the prior is optimistic (1.0), so a
newcomer gets tried; but in a large federation every untried node is then tried until it
fails, once per task type, and a replica of a node that keeps failing a type is tried as if
nothing were known. Its kin's pooled record is what is known: it becomes the prior
(``scores.kin_prior``), worth up to 80 episodes beside the node's own 30 (decision 0042), so it
keeps a bounded share of the node's confidence for good: where its kin succeed 90% of the time,
a replica that succeeds 40% bids about 0.58 there (below its kin, above the default
``min_confidence`` of 0.5), and one that always fails about 0.33 (under it: ruled out).

The kin's pooled record over everything they ran comes too: set against the node's own, it
says how this replica does beside its kin (``scores.replica_factor``), which a node's few
dozen episodes of one type cannot tell.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Mapping, Sequence
from typing import NamedTuple

from bidding.config import Settings
from bidding.nodes.records import Record, records_of
from bidding.nodes.registry import LiveNode, live_nodes

logger = logging.getLogger(__name__)


def signature(node: LiveNode) -> Hashable:
    """What two nodes must declare alike to be kin: all of their published profile but the
    name (and what they hold warm, which changes as they run)."""
    return (tuple(sorted(node.capabilities)), node.capacity, node.price_per_unit,
            node.latency_ms, node.trust, node.bidder, tuple(sorted(node.resources.items())))


#: The last live list grouped, and its groups: the cached live list is the same object for
#: ``bidding_live_cache_seconds``, and grouping a thousand nodes for every auction would cost
#: more than the auction's bids (the list is held, so that its id is not reused).
_grouped: list[tuple[Sequence[LiveNode], dict[Hashable, list[str]], dict[str, Hashable]]] = []


def _groups(live: Sequence[LiveNode]) -> tuple[dict[Hashable, list[str]], dict[str, Hashable]]:
    found = _grouped[0] if _grouped else None
    if found is not None and found[0] is live:
        return found[1], found[2]
    groups: dict[Hashable, list[str]] = {}
    by_name: dict[str, Hashable] = {}
    for node in live:
        key = signature(node)
        groups.setdefault(key, []).append(node.name)
        by_name[node.name] = key
    _grouped[:] = [(live, groups, by_name)]
    return groups, by_name


def kin_of(live: Sequence[LiveNode], names: Sequence[str]) -> dict[str, list[str]]:
    """Each of ``names``' kin among ``live`` (itself left out; a node with none is missing)."""
    groups, by_name = _groups(live)
    out = {}
    for name in names:
        key = by_name.get(name)
        kin = [other for other in groups.get(key, ()) if other != name] if key else []
        if kin:
            out[name] = kin
    return out


def pooled(records: Mapping[str, Record], kin: Sequence[str]) -> Record:
    """The kin's records (on a type, or node-wide), summed."""
    found = [records[k] for k in kin if k in records]
    return (sum(a for a, _ in found), sum(s for _, s in found))


class KinRecord(NamedTuple):
    """A node's kin's pooled records: on one task type, and on everything they ran."""

    on_type: Record
    overall: Record


def kin_pools(live: Sequence[LiveNode], names: Sequence[str],
              on_type: Mapping[str, Record]) -> dict[str, KinRecord]:
    """Each of ``names``' kin among ``live``, their records pooled: on a type (from ``on_type``,
    the records an announcer read for it) and overall (from ``live``). A node without kin is
    missing.

    Summed once per group of kin, then each node's own taken off: an announcer ranks every
    eligible node (``auction.candidates``), and a thousand replicas of one profile summed for
    each of them would be a million additions per auction.
    """
    groups, by_name = _groups(live)
    node_wide = {node.name: (node.attempts, node.successes) for node in live}
    sums: dict[Hashable, KinRecord] = {}
    out = {}
    for name in names:
        key = by_name.get(name)
        members = groups.get(key, ()) if key is not None else ()
        if len(members) < 2:
            continue
        if key not in sums:
            sums[key] = KinRecord(pooled(on_type, members), pooled(node_wide, members))
        total = sums[key]
        own_type, own_wide = on_type.get(name, (0, 0)), node_wide.get(name, (0, 0))
        out[name] = KinRecord(
            (total.on_type[0] - own_type[0], total.on_type[1] - own_type[1]),
            (total.overall[0] - own_wide[0], total.overall[1] - own_wide[1]))
    return out


def kin_records(settings: Settings, task_type: str,
                names: Sequence[str]) -> dict[str, KinRecord]:
    """For each of ``names`` with live kin that have a record on ``task_type``, their pooled
    records there and overall (``kin_pools``, as the announcer ranks the nodes it asks). From
    the cached live nodes and records (``nodes.records``); a read that fails gives none (the
    nodes then bid from their own record alone)."""
    try:
        live = live_nodes(settings)
        kin = kin_of(live, names)
        if not kin:
            return {}
        # The asking nodes' own records with their kin's, in one read: the bids of those with
        # kin read them next (``records.records_of``), from the cache this fills.
        records = records_of(settings, task_type,
                             sorted({*names, *(k for ks in kin.values() for k in ks)}))
    except Exception as exc:
        logger.debug("could not read the kin's records on %s: %s", task_type, exc)
        return {}
    return {name: pool for name, pool in kin_pools(live, list(kin), records).items()
            if pool.on_type[0] > 0}
