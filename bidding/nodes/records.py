"""Each node's record on a task type (finished attempts and successes, lost ones left out),
read for many nodes at once, so that an announcer can rank the nodes it asks by what they did
on the type at hand (``auction.candidates``). The rows are kept with the episodes
(``execution.episodes.count_episode``): a read is one indexed lookup per node, however long
their histories; an announcer caches the answer per task type for
``bidding_live_cache_seconds``, as it caches the live nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import bindparam, select

from bidding.config import Settings
from bidding.store import read_session
from bidding.store.covered import CoveredCache
from bidding.store.schema import NodeRecord

#: A node's record on one task type: (finished attempts, successes).
Record = tuple[int, int]

_OF_TYPE = (select(NodeRecord.node, NodeRecord.attempts, NodeRecord.successes)
            .where(NodeRecord.task_type == bindparam("task_type"),
                   NodeRecord.node.in_(bindparam("nodes", expanding=True))))


def read_records(settings: Settings, task_type: str, nodes: Sequence[str]) -> dict[str, Record]:
    """The records of ``nodes`` on ``task_type`` (a node without one is missing)."""
    if not nodes:
        return {}
    with read_session(settings.database_url) as session:
        rows = session.execute(_OF_TYPE, {"task_type": task_type, "nodes": list(nodes)}).all()
    return {str(node): (int(attempts), int(successes)) for node, attempts, successes in rows}


_cache: CoveredCache[Record] = CoveredCache("the nodes' records on a task type")


def records_of(settings: Settings, task_type: str,
               nodes: Sequence[str]) -> Mapping[str, Record]:
    """``read_records``, cached per store and task type for ``bidding_live_cache_seconds``
    (the nodes a fresh answer did not cover are read and added to it).

    The records rank the nodes an auction asks, and a replica bids from its own
    (``scores.informed_confidence``): a read that fails (the store busy, a dropped
    connection) gives the last answer or none, and the nodes without a record are ranked by
    their node-wide record and bid from the episodes they read, rather than failing the
    announcement."""
    return _cache.get((settings.database_url, task_type), nodes, settings.live_cache_seconds,
                      lambda missing: read_records(settings, task_type, missing))


def invalidate_cache() -> None:
    """Forget cached records (tests)."""
    _cache.clear()
