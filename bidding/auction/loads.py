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

from collections.abc import Mapping, Sequence

from bidding.auction.history import in_flight_counts
from bidding.config import Settings
from bidding.store.covered import CoveredCache

_cache: CoveredCache[int] = CoveredCache("the nodes' tasks in flight")


def recent_loads(settings: Settings, names: Sequence[str]) -> Mapping[str, int]:
    """``names``' tasks in flight (a node with none is missing), at most
    ``bidding_live_cache_seconds`` old; the nodes a fresh answer did not cover are read and
    added to it (its age kept)."""
    return _cache.get(settings.database_url, names, settings.live_cache_seconds,
                      lambda missing: in_flight_counts(settings, missing))


def note_award(settings: Settings, node: str) -> None:
    """Count a task this process just awarded to ``node`` in the loads it keeps (if any)."""
    _cache.change(settings.database_url, node, lambda count: (count or 0) + 1)


def invalidate_cache() -> None:
    """Forget every store's loads (tests)."""
    _cache.clear()
