"""Each node's record on a task type (finished attempts and successes, lost ones left out),
read for many nodes at once, so that an announcer can rank the nodes it asks by what they did
on the type at hand (``auction.candidates``). The rows are kept with the episodes
(``execution.episodes.count_episode``): a read is one indexed lookup per node, however long
their histories; an announcer caches the answer per task type for
``bidding_live_cache_seconds``, as it caches the live nodes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from sqlalchemy import bindparam, select

from bidding.config import Settings
from bidding.store import read_session
from bidding.store.forkguard import child_safe_lock
from bidding.store.schema import NodeRecord

logger = logging.getLogger(__name__)

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


_cache: dict[tuple[str, str], tuple[float, frozenset[str], dict[str, Record]]] = {}
_lock = child_safe_lock()


def records_of(settings: Settings, task_type: str,
               nodes: Sequence[str]) -> Mapping[str, Record]:
    """``read_records``, cached per store and task type for ``bidding_live_cache_seconds``
    (the nodes a fresh answer did not cover are read and added to it).

    The records only rank the nodes an auction asks: a read that fails (the store busy, a
    dropped connection) gives none, and the nodes are ranked by their node-wide record,
    rather than failing the announcement."""
    key = (settings.database_url, task_type)
    now = time.monotonic()
    with _lock:
        cached = _cache.get(key)
    if cached is not None and now - cached[0] >= settings.live_cache_seconds:
        cached = None
    if cached is not None and cached[1].issuperset(nodes):
        return cached[2]
    missing = [n for n in nodes if cached is None or n not in cached[1]]
    try:
        found = read_records(settings, task_type, missing)
    except Exception as exc:
        logger.debug("could not read the nodes' records on %s (ranking them by their "
                     "node-wide records): %s", task_type, exc)
        return {} if cached is None else cached[2]
    if cached is not None:  # add to the fresh answer, which keeps its age
        now, covered, found = cached[0], cached[1] | frozenset(missing), {**cached[2], **found}
    else:
        covered = frozenset(nodes)
    with _lock:
        _cache[key] = (now, covered, found)
        if len(_cache) > 1024:  # many task types: forget the oldest
            for old in sorted(_cache, key=lambda k: _cache[k][0])[:512]:
                del _cache[old]
    return found


def invalidate_cache() -> None:
    """Forget cached records (tests)."""
    with _lock:
        _cache.clear()
