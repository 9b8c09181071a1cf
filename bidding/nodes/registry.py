"""Which nodes are alive, read from the store without asking any worker.

Producers never call ``inspect()`` or ``ping`` (they block for a timeout on every call); they
read the ``bidding_nodes`` table, which each node's worker refreshes every
``bidding_heartbeat_interval`` seconds (``heartbeat``), and cache the answer for
``bidding_live_cache_seconds``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import cast

from sqlalchemy import bindparam, select

from bidding import clock, resources
from bidding.config import Settings
from bidding.nodes.profile import NodeProfile
from bidding.store import covered, read_session
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
    #: Its declared resources (``{"gpu_mem_gb": 24}``); empty: none.
    resources: Mapping[str, float] = field(default_factory=dict)
    #: The items it holds warm.
    warm: tuple[str, ...] = ()

    @property
    def profile(self) -> NodeProfile:
        """The profile this node published with its heartbeat (validated when its worker loaded
        it), as its bids are computed from. Built once per reading of the live nodes, which
        every auction of the next ``bidding_live_cache_seconds`` shares: an announcer bidding
        for its candidates built one per candidate and auction (bench/RESULTS.md). Not to be
        changed by its readers."""
        built = self.__dict__.get("_profile")
        if built is None:
            built = NodeProfile.model_construct(
                name=self.name, capabilities=list(self.capabilities), capacity=self.capacity,
                price_per_unit=self.price_per_unit, latency_ms=self.latency_ms,
                trust=self.trust, resources=dict(self.resources), warm=list(self.warm))
            # Kept beside the (frozen) fields, without a lock: functools.cached_property
            # would take one lock for every node, which a pool process forked while a thread
            # held it could never take; two threads racing here build two equal profiles.
            object.__setattr__(self, "_profile", built)
        return cast(NodeProfile, built)

    @property
    def builtin_bidder(self) -> bool:
        """True when the node bids with the built-in function alone, so that an announcer can
        make its bid for it (``bidding_bid_mode = "auto"``)."""
        return not self.bidder


def dead_after(settings: Settings, now: float | None = None) -> float:
    """Heartbeats older than this (Unix time) mean the node is dead, not just offline."""
    return (clock.now() if now is None else now) - settings.heartbeat_ttl


_LIVE = (
    select(Node.name, Node.capabilities, Node.capacity, Node.price_per_unit, Node.latency_ms,
           Node.trust, Node.last_heartbeat, Node.attempts, Node.successes, Node.bidder,
           Node.resources, Node.warm)
    .where(Node.status == "online", Node.last_heartbeat >= bindparam("cutoff"))
    .order_by(Node.name)
)


def query_live_nodes(settings: Settings, now: float | None = None) -> list[LiveNode]:
    """Nodes whose last heartbeat is within ``bidding_heartbeat_ttl`` seconds."""
    now = clock.now() if now is None else now
    cutoff = now - settings.heartbeat_ttl
    with read_session(settings.database_url) as session:
        rows = session.execute(_LIVE, {"cutoff": cutoff}).all()
    return [
        LiveNode(name=r.name, capabilities=tuple(r.capabilities), capacity=r.capacity,
                 price_per_unit=r.price_per_unit, latency_ms=r.latency_ms, trust=r.trust,
                 last_heartbeat=r.last_heartbeat, attempts=r.attempts, successes=r.successes,
                 bidder=r.bidder or "", resources=dict(r.resources or {}),
                 warm=tuple(r.warm or ()))
        for r in rows
    ]


_COMING_BACK = (
    select(Node.name, Node.capabilities, Node.resources)
    .where(Node.status != "stopped", Node.last_heartbeat >= bindparam("since"))
    .order_by(Node.name)
)


def coming_back(settings: Settings, skills: list[str], now: float | None = None,
                needs: Mapping[str, float] | None = None) -> list[str]:
    """Nodes offering every one of ``skills`` (and whose declared resources cover ``needs``)
    that are not live now but are expected back:
    they did not stop cleanly, and were seen within ``bidding_liveness_grace`` seconds of
    when they stopped being live (a heartbeat TTL after their last heartbeat).

    Whatever source of liveness failed: a worker that lost the broker (it marked its node
    offline and is reconnecting), a node whose heartbeats did not reach the store (its
    connections dropped, the store restarting), or one killed a moment ago and restarted by
    its supervisor. Read afresh, never from the cache."""
    if settings.liveness_grace <= 0:
        return []
    now = clock.now() if now is None else now
    since = now - settings.heartbeat_ttl - settings.liveness_grace
    with read_session(settings.database_url) as session:
        rows = session.execute(_COMING_BACK, {"since": since}).all()
    return [name for name, capabilities, totals in rows if set(skills) <= set(capabilities)
            and resources.shortfall(needs or {}, totals or {}) is None]


_live_cache: dict[str, tuple[float, list[LiveNode]]] = {}


def live_nodes(settings: Settings, *, fresh: bool = False) -> list[LiveNode]:
    """Live nodes, cached per database for ``bidding_live_cache_seconds``; ``fresh``: read
    now (the cache is refreshed with the answer)."""
    now = time.monotonic()
    cached = _live_cache.get(settings.database_url)
    if not fresh and cached is not None and now - cached[0] < settings.live_cache_seconds:
        return cached[1]
    nodes = query_live_nodes(settings)
    _live_cache[settings.database_url] = (now, nodes)
    return nodes


def invalidate_cache() -> None:
    """Forget cached liveness and every cache of reads about nodes (their records, their loads:
    ``store.covered``), in tests and after this process changed a node."""
    _live_cache.clear()
    covered.clear_all()


