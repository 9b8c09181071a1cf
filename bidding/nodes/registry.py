"""Which nodes are alive, read from the store without asking any worker.

Producers never call ``inspect()`` or ``ping`` (they block for a timeout on every call); they
read the ``bidding_nodes`` table, which each node's worker refreshes every
``bidding_heartbeat_interval`` seconds (``heartbeat``), and cache the answer for
``bidding_live_cache_seconds``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import bindparam, select

from bidding.config import Settings
from bidding.store import read_session
from bidding.store.schema import Node


@dataclass(frozen=True)
class LiveNode:
    """A node as the producer sees it: its declared profile and when it last beat."""

    name: str
    capabilities: tuple[str, ...]
    capacity: int
    price_per_unit: float
    latency_ms: float
    trust: float
    last_heartbeat: float
    #: Its record: finished attempts, and how many succeeded.
    attempts: int = 0
    successes: int = 0
    #: Its own bidder ("package.module:function" or "llm"); "" for the built-in one.
    bidder: str = ""

    @property
    def builtin_bidder(self) -> bool:
        """True when the node bids with the built-in function alone, so that an announcer can
        make its bid for it (``bidding_bid_mode = "auto"``)."""
        return not self.bidder


def dead_after(settings: Settings, now: float | None = None) -> float:
    """Heartbeats older than this (Unix time) mean the node is dead, not just offline."""
    return (time.time() if now is None else now) - settings.heartbeat_ttl


_LIVE = (
    select(Node.name, Node.capabilities, Node.capacity, Node.price_per_unit, Node.latency_ms,
           Node.trust, Node.last_heartbeat, Node.attempts, Node.successes, Node.bidder)
    .where(Node.status == "online", Node.last_heartbeat >= bindparam("cutoff"))
    .order_by(Node.name)
)


def query_live_nodes(settings: Settings, now: float | None = None) -> list[LiveNode]:
    """Nodes whose last heartbeat is within ``bidding_heartbeat_ttl`` seconds."""
    now = time.time() if now is None else now
    cutoff = now - settings.heartbeat_ttl
    with read_session(settings.database_url) as session:
        rows = session.execute(_LIVE, {"cutoff": cutoff}).all()
    return [
        LiveNode(name=r.name, capabilities=tuple(r.capabilities), capacity=r.capacity,
                 price_per_unit=r.price_per_unit, latency_ms=r.latency_ms, trust=r.trust,
                 last_heartbeat=r.last_heartbeat, attempts=r.attempts, successes=r.successes,
                 bidder=r.bidder or "")
        for r in rows
    ]


_COMING_BACK = (
    select(Node.name, Node.capabilities)
    .where(Node.status == "offline", Node.last_heartbeat >= bindparam("since"))
    .order_by(Node.name)
)


def coming_back(settings: Settings, skills: list[str], now: float | None = None) -> list[str]:
    """Nodes offering every one of ``skills`` that are offline without having stopped (their
    worker lost the broker and is reconnecting) and were seen within
    ``bidding_liveness_grace`` seconds."""
    if settings.liveness_grace <= 0:
        return []
    now = time.time() if now is None else now
    with read_session(settings.database_url) as session:
        rows = session.execute(_COMING_BACK, {"since": now - settings.liveness_grace}).all()
    return [name for name, capabilities in rows if set(skills) <= set(capabilities)]


_live_cache: dict[str, tuple[float, list[LiveNode]]] = {}


def live_nodes(settings: Settings) -> list[LiveNode]:
    """Live nodes, cached per database for ``bidding_live_cache_seconds``."""
    now = time.monotonic()
    cached = _live_cache.get(settings.database_url)
    if cached is not None and now - cached[0] < settings.live_cache_seconds:
        return cached[1]
    nodes = query_live_nodes(settings)
    _live_cache[settings.database_url] = (now, nodes)
    return nodes


def invalidate_cache() -> None:
    """Forget cached liveness (tests, and after this process changed a node)."""
    _live_cache.clear()


