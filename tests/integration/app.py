"""The Celery app of the integration tests; worker subprocesses load it with -A."""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

import bidding

BROKER = os.environ.get("BIDDING_IT_BROKER", "redis://127.0.0.1:6379/11")
BACKEND = os.environ.get("BIDDING_IT_BACKEND", BROKER)
#: Where task bodies count their executions (a separate Redis db from the broker's).
COUNTERS = os.environ.get("BIDDING_IT_COUNTERS", "redis://127.0.0.1:6379/12")

app = Celery("bidding_it")
app.conf.update(
    broker_url=BROKER,
    result_backend=BACKEND,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_accept_content=["json"],
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    bidding_window=float(os.environ.get("BIDDING_IT_WINDOW", "1.0")),
)
bidding.install(app)

_counters: redis.Redis | None = None


def counters() -> redis.Redis:
    """The Redis client task bodies record executions with."""
    global _counters
    if _counters is None:
        _counters = redis.Redis.from_url(COUNTERS)
    return _counters


def _run(task: Any, value: Any, seconds: float) -> dict[str, Any]:
    counters().incr(f"exec:{task.request.id}")
    if seconds:
        time.sleep(seconds)
    return {"node": str(task.request.hostname).split("@")[0], "value": value}


@app.task(base=bidding.BiddingTask, bind=True, task_type="shared_work",
          required_skills=["shared"])
def shared(self: Any, value: Any, seconds: float = 0.0) -> dict[str, Any]:
    """Work every test node can do."""
    return _run(self, value, seconds)


@app.task(base=bidding.BiddingTask, bind=True, task_type="gpu_work", required_skills=["gpu"])
def gpu(self: Any, value: Any) -> dict[str, Any]:
    """Work only the gpu node can do."""
    return _run(self, value, 0.0)


@app.task(base=bidding.BiddingTask, bind=True, task_type="phantom_work",
          required_skills=["phantom"])
def phantom(self: Any, value: Any) -> dict[str, Any]:
    """Work only a node without a consumer (the ghost) claims to do."""
    return _run(self, value, 0.0)


@app.task(base=bidding.BiddingTask, bind=True, task_type="failing", required_skills=["shared"])
def failing(self: Any, message: str) -> None:
    """Raises on the node: the failure reaches the caller and is recorded."""
    counters().incr(f"exec:{self.request.id}")
    raise ValueError(message)
