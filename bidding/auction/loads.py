"""The eligible nodes' tasks in flight, as an announcer ranks the nodes it asks
(``candidates.select_candidates``): a full node's standing is taken times its slot share.

Read with one grouped statement, and kept per store for ``bidding_live_cache_seconds``, as the
live nodes and their records are: on PostgreSQL the read added about 1.5 ms to each `.delay()`
of a federation larger than the candidate cap (bench/RESULTS.md). Each award this process
makes counts on its winner at once (``note_award``), so a burst from one announcer does not
rank a node free for a second while it fills; other announcers' awards show at the next read.
The bids themselves read fresh loads at the award: a stale load only decides who is asked. A
read that fails (the store busy, a dropped connection) gives the last answer, or none: the
nodes are then ranked as if free, rather than failing the announcement.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from bidding.auction.history import in_flight_counts
from bidding.config import Settings
from bidding.store.forkguard import child_safe_lock

logger = logging.getLogger(__name__)

#: Per store: when read (monotonic), the nodes the read covered, their tasks in flight.
_cache: dict[str, tuple[float, frozenset[str], Mapping[str, int]]] = {}
_lock = child_safe_lock()


def recent_loads(settings: Settings, names: Sequence[str]) -> Mapping[str, int]:
    """``names``' tasks in flight (a node with none is missing), at most
    ``bidding_live_cache_seconds`` old; the nodes a fresh answer did not cover are read and
    added to it (its age kept), as ``nodes.records.records_of`` does."""
    now = time.monotonic()
    with _lock:
        cached = _cache.get(settings.database_url)
    if cached is not None and now - cached[0] >= settings.live_cache_seconds:
        cached = None
    if cached is not None and cached[1].issuperset(names):
        return cached[2]
    missing = [n for n in names if cached is None or n not in cached[1]]
    try:
        found = in_flight_counts(settings, missing)
    except Exception as exc:
        logger.debug("could not read the nodes' tasks in flight (ranking them by the last "
                     "answer, or as if free): %s", exc)
        return {} if cached is None else cached[2]
    if cached is not None:
        now, covered, merged = cached[0], cached[1] | frozenset(missing), {**cached[2], **found}
    else:
        covered, merged = frozenset(names), found
    answer = MappingProxyType(merged)
    with _lock:
        _cache[settings.database_url] = (now, covered, answer)
    return answer


def note_award(settings: Settings, node: str) -> None:
    """Count a task this process just awarded to ``node`` in the loads it keeps (if any)."""
    with _lock:
        cached = _cache.get(settings.database_url)
        if cached is None or node not in cached[1]:
            return
        counts = dict(cached[2])
        counts[node] = counts.get(node, 0) + 1
        _cache[settings.database_url] = (cached[0], cached[1], MappingProxyType(counts))


def invalidate_cache() -> None:
    """Forget every store's loads (tests)."""
    with _lock:
        _cache.clear()
