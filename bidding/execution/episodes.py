"""Episodes: the outcome record of each attempt (node, task type, success, duration, cost), and
each node's running record of attempts and successes; the source of experience and learned
trust.
"""

from __future__ import annotations

from typing import Any, Final, cast

from sqlalchemy import Integer, Table, bindparam, update
from sqlalchemy.orm import Session

from bidding.store.once import insert_once
from bidding.store.schema import Episode, Node

_NODES: Final = cast(Table, Node.__table__)
_EPISODES: Final = cast(Table, Episode.__table__)
# Core, not ORM: an ORM UPDATE first works out which loaded objects to refresh.
_RECORD = (update(_NODES).where(_NODES.c.name == bindparam("node"))
           .values(attempts=_NODES.c.attempts + 1,
                   successes=_NODES.c.successes + bindparam("won", type_=Integer)))


def count_episode(session: Session, node: str, success: bool) -> None:
    """Add one finished attempt to ``node``'s record (call once per new episode row)."""
    session.execute(_RECORD, {"node": node, "won": int(success)})


def record_episode(session: Session, values: dict[str, Any]) -> None:
    """Store an attempt's episode once (a redelivery, or a sweep racing the node, keeps the
    first) and count a new one in its node's record."""
    if insert_once(session, _EPISODES, values, report=True):
        count_episode(session, values["node"], bool(values["success"]))
