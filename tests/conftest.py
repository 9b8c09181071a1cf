"""Shared test helpers: services are required under CI=true and skipped (with the reason) else."""

from __future__ import annotations

import os

import pytest

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
