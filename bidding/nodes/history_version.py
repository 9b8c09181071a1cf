"""A node's history version: a number that changes whenever the node finishes an attempt.

A bid reads the node's history (experience, recent failures, in-flight work, its record) from a
per-process cache, valid while the node's version is unchanged (``auction.history``); so do the
announcer's proxy bids. The versions are counters in one Redis hash, ``bidding:history``, kept
in the bid board's Redis because that is the Redis every node and caller share. Where the board
is the store (RabbitMQ) there is no Redis and no version (None): nothing says when a node's
record changed, so every bid reads it afresh.

A version is a cache's counter, not a record: if Redis loses it, it starts again at 0, and a
history cached under an old version still expires by age (``bidding_history_cache_seconds``).
"""

from __future__ import annotations

from collections.abc import Sequence

import redis
from redis.client import Pipeline

#: Hash of every node's history version (finished attempts, as counted here).
KEY = "bidding:history"


def read(client: redis.Redis[bytes] | None, nodes: Sequence[str]) -> dict[str, int | None]:
    """Each node's version, in one round trip (0 before its first finished attempt); None for
    each without a Redis (``client`` None)."""
    if client is None:
        return dict.fromkeys(nodes)
    if not nodes:
        return {}
    raw = client.hmget(KEY, list(nodes))
    return {node: version_of(v) for node, v in zip(nodes, raw, strict=True)}


def bump(client: redis.Redis[bytes] | None, node: str) -> None:
    """``node`` finished an attempt: cached histories of it are stale (nothing without a
    Redis)."""
    if client is not None:
        client.hincrby(KEY, node, 1)


def read_after(pipe: Pipeline[bytes], node: str) -> None:
    """Queue the read of ``node``'s version on ``pipe``, whose reply ``version_of`` reads: the
    bid board reads it in the round trip that hands the node a bid request."""
    pipe.hget(KEY, node)


def version_of(raw: bytes | str | None) -> int:
    """A version from its reply (0 when the node has none yet)."""
    return int(raw) if raw is not None else 0
