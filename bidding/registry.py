"""Nodes: heartbeats into the store, and which nodes are alive, without asking any worker.

Producers never call ``inspect()`` or ``ping`` (they block for a timeout on every call); they
read the ``bidding_nodes`` table, which each node's worker refreshes every
``bidding_heartbeat_interval`` seconds, and cache the answer for ``bidding_live_cache_seconds``.
"""

from __future__ import annotations

import logging
import socket
import time
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, Table, bindparam, select, update

from bidding.config import Settings
from bidding.periodic import Periodic
from bidding.profile import NodeProfile
from bidding.store import read_session, write_session
from bidding.store.schema import Node

logger = logging.getLogger(__name__)


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


def heartbeat(settings: Settings, profile: NodeProfile, *, hostname: str | None = None,
              started_at: float | None = None, now: float | None = None) -> None:
    """Record that ``profile``'s node is alive now (insert or refresh its row)."""
    now = time.time() if now is None else now
    with write_session(settings.database_url) as session:
        row = session.get(Node, profile.name)
        if row is None:
            row = Node(name=profile.name, started_at=started_at or now)
            session.add(row)
        row.capabilities = list(profile.capabilities)
        row.capacity = profile.capacity
        row.price_per_unit = profile.price_per_unit
        row.latency_ms = profile.latency_ms
        row.trust = profile.trust
        row.description = profile.description
        row.hostname = hostname or socket.gethostname()
        row.status = "online"
        if started_at is not None:
            row.started_at = started_at
        row.last_heartbeat = now
    _live_cache.clear()


_NODES = cast(Table, Node.__table__)
# Core, not ORM: an ORM UPDATE first works out which loaded objects to refresh.
_BEAT = (update(_NODES).where(_NODES.c.name == bindparam("node"))
         .values(status="online", last_heartbeat=bindparam("now")))


def beat(settings: Settings, profile: NodeProfile, now: float | None = None) -> None:
    """The periodic heartbeat: one UPDATE of the node's row (the profile was written by
    ``heartbeat`` when the node started); the full ``heartbeat`` when the row has gone.

    64 idle nodes beating every 2 s are 32 write transactions a second on the store; each is
    now one statement instead of a read and a rewrite of every column (bench/latency.py).
    """
    now = time.time() if now is None else now
    with write_session(settings.database_url) as session:
        moved = cast(CursorResult[Any], session.execute(
            _BEAT, {"node": profile.name, "now": now})).rowcount
    if moved != 1:
        heartbeat(settings, profile, now=now)


def touch(settings: Settings, name: str, now: float | None = None) -> None:
    """Refresh a node's heartbeat time only: it is alive, but not taking new work (draining)."""
    with write_session(settings.database_url) as session:
        session.execute(update(Node).where(Node.name == name)
                        .values(last_heartbeat=time.time() if now is None else now))


def dead_after(settings: Settings, now: float | None = None) -> float:
    """Heartbeats older than this (Unix time) mean the node is dead, not just offline."""
    return (time.time() if now is None else now) - settings.heartbeat_ttl


def mark_offline(settings: Settings, name: str) -> None:
    """Record a clean shutdown: the node stops being a candidate at once."""
    with write_session(settings.database_url) as session:
        session.execute(update(Node).where(Node.name == name).values(status="offline"))
    _live_cache.clear()


_LIVE = (
    select(Node.name, Node.capabilities, Node.capacity, Node.price_per_unit, Node.latency_ms,
           Node.trust, Node.last_heartbeat, Node.attempts, Node.successes)
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
                 last_heartbeat=r.last_heartbeat, attempts=r.attempts, successes=r.successes)
        for r in rows
    ]


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


class Heartbeat:
    """Keeps one node's row fresh while started; restartable.

    A worker's consumer restarts after a lost broker connection, and the node must not look
    alive while it cannot receive bid requests.
    """

    def __init__(self, settings: Settings, profile: NodeProfile) -> None:
        self.settings = settings
        self.profile = profile
        self.started_at = time.time()
        self._registered = False
        self._loop = Periodic(f"bidding-heartbeat-{profile.name}", settings.heartbeat_interval,
                              self._beat)
        # After stop (a warm shutdown, or a lost broker connection) the pool may still be
        # finishing tasks: the node is offline for new work but not dead, and watchdogs must
        # not hand its running tasks to someone else.
        self._draining = Periodic(f"bidding-draining-{profile.name}",
                                  settings.heartbeat_interval,
                                  lambda: touch(settings, profile.name))

    def start(self) -> None:
        """Beat once now (the node is a candidate from this moment), then periodically."""
        self._draining.stop()
        self._registered = False
        try:
            self._beat()
        except Exception:
            # A store busy for longer than the lock timeout (seen with 64 nodes starting at
            # once on 2 cores) must not kill the worker: the loop registers it on its next beat.
            logger.exception("first heartbeat of node %s failed; retrying every %gs",
                             self.profile.name, self.settings.heartbeat_interval)
        self._loop.start()

    def _beat(self) -> None:
        # The full row (this run's profile) until it is written once, then one UPDATE.
        if self._registered:
            beat(self.settings, self.profile)
        else:
            heartbeat(self.settings, self.profile, started_at=self.started_at)
            self._registered = True

    def stop(self) -> None:
        """Stop taking new work: mark the node offline, keep proving it is alive until exit."""
        self._loop.stop()
        try:
            mark_offline(self.settings, self.profile.name)
        except Exception:  # shutting down: the TTL will expire the node anyway
            logger.exception("could not mark node %s offline", self.profile.name)
        self._draining.start()
