"""The eligible nodes' tasks in flight, as an announcer ranks the nodes it asks
(``candidates.select_candidates``): a full node's standing is taken times its slot share.

Read with one grouped statement, and kept per store for ``bidding_live_cache_seconds``, as the
live nodes and their records are: on PostgreSQL the read added about 1.5 ms to each `.delay()`
of a federation larger than the candidate cap (bench/RESULTS.md). The bids themselves read
fresh loads at the award, so a load a second old only decides who is asked. A read that fails
(the store busy, a dropped connection) gives none: the nodes are ranked as if free, rather
than failing the announcement.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from bidding.auction.history import in_flight_counts
from bidding.config import Settings
from bidding.store.forkguard import child_safe_lock

logger = logging.getLogger(__name__)

#: Per store: when read (monotonic), the nodes the read covered, their tasks in flight.
_cache: dict[str, tuple[float, frozenset[str], dict[str, int]]] = {}
_lock = child_safe_lock()


def recent_loads(settings: Settings, names: Sequence[str]) -> Mapping[str, int]:
    """``names``' tasks in flight (a node with none is missing), at most
    ``bidding_live_cache_seconds`` old; read again when older or when it did not cover them."""
    now = time.monotonic()
    with _lock:
        cached = _cache.get(settings.database_url)
    if (cached is not None and now - cached[0] < settings.live_cache_seconds
            and cached[1].issuperset(names)):
        return cached[2]
    try:
        found = in_flight_counts(settings, names)
    except Exception as exc:
        logger.debug("could not read the nodes' tasks in flight (ranking them as if free): %s",
                     exc)
        return {}
    with _lock:
        _cache[settings.database_url] = (now, frozenset(names), found)
    return found


def invalidate_cache() -> None:
    """Forget every store's loads (tests, and a store that was reset)."""
    with _lock:
        _cache.clear()
