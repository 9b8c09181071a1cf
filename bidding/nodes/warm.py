"""What a node holds warm (models, data sets): its profile's ``warm`` list when its worker
starts, and what its task bodies mark since (``bidding.mark_warm``).

Kept on the node's row beside its heartbeat, where awards read it (``auction.placement``): a
task body runs in a pool process, not in the worker that beats, so it writes there directly,
and every node worker and announcer sees it at the next award. A worker starting again writes
its profile's list afresh: what a killed process had loaded is gone with it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import select

from bidding import resources
from bidding.config import Settings
from bidding.nodes.registry import invalidate_cache
from bidding.store import write_session
from bidding.store.engine import is_sqlite
from bidding.store.schema import Node


def add_warm(settings: Settings, node: str, items: Sequence[str]) -> list[str]:
    """Add ``items`` to what ``node`` holds warm (checked: ValueError naming the item);
    returns the node's whole list (empty when the node has no row)."""
    wanted = resources.warm_items(list(items), "mark_warm")
    statement = select(Node).where(Node.name == node)
    if not is_sqlite(settings.database_url):
        statement = statement.with_for_update()  # two pool processes marking at once
    with write_session(settings.database_url) as session:
        row = session.execute(statement).scalar_one_or_none()
        if row is None:
            return []
        held = list(row.warm or [])
        added = [item for item in wanted if item not in held]
        if added:
            row.warm = resources.warm_items(held + added, "warm")[-resources.MOST_WARM:]
        result = list(row.warm or [])
    invalidate_cache()
    return result
