"""Shared test helpers: services are required under CI=true and skipped (with the reason) else;
ghost nodes."""

from __future__ import annotations

import os

import pytest

from bidding.config import Settings
from bidding.nodes.heartbeat import heartbeat, mark_offline
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import invalidate_cache

REDIS_URL = os.environ.get("BIDDING_TEST_REDIS", "redis://127.0.0.1:6379")
#: The first of the four Redis dbs the tests use (broker, counters, RabbitMQ's result backend,
#: bid board): two checkouts can run their tests on one Redis at once with different bases.
REDIS_DB = int(os.environ.get("BIDDING_TEST_REDIS_DB", "11"))
POSTGRES_URL = os.environ.get(
    "BIDDING_TEST_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def require(service: str, available: bool, reason: str) -> None:
    """Skip when ``service`` is missing, except under CI=true, where a missing service fails."""
    if available:
        return
    message = f"{service} not available: {reason}"
    if os.environ.get("CI") == "true":
        pytest.fail(f"{message} (required under CI=true)")
    pytest.skip(message)


def ghost(settings: Settings, skills: list[str], name: str = "ghost") -> NodeProfile:
    """Register a live node whose queues nobody consumes (a heartbeat and nothing else): it is
    asked to bid and never answers."""
    profile = NodeProfile(name=name, capabilities=skills, capacity=4, price_per_unit=0.01,
                          latency_ms=50, trust=70)
    heartbeat(settings, profile)
    invalidate_cache()
    return profile


def bury(settings: Settings, name: str = "ghost", status: str = "offline") -> None:
    """Take a ghost out of the candidates again ("stopped": no task waits for it to come
    back; "offline": it counts as reconnecting for ``bidding_liveness_grace``)."""
    mark_offline(settings, name, status=status)
    invalidate_cache()
