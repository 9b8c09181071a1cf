"""The Celery app of ``bench/fifo_vs_bidding.py``; its node workers load it with -A.

Configured from the environment (set by the benchmark before anything imports it): FIFO_BROKER
(broker and result backend) and BIDDING_* for the bidding settings.

Every node has a "true" success probability per task type (``TRUE_P``). Two tasks share one body:
``fifo_work`` is a plain Celery task on the queue ``fifo``, which every node worker also consumes
(added at start-up by the ``celeryd_after_setup`` handler below), so whichever node is free
first takes it; ``bid_work`` is a BiddingTask, auctioned among the nodes, with the task type set
per call (``bidding={"task_type": t}``). The body sleeps 50-100 ms, then succeeds with the
probability of (this node, task type), drawn from ``random.Random(task id)``, else raises.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from celery import Celery
from celery.signals import celeryd_after_setup

import bidding
from bidding.config import celery_conf

BROKER = os.environ.get("FIFO_BROKER", "redis://127.0.0.1:6379/9")
#: The skill every node has and ``bid_work`` requires.
SKILL = "work"
#: The queue of the FIFO baseline, consumed by every node worker.
FIFO_QUEUE = "fifo"
#: Node -> task type -> true probability that a task of that type succeeds there.
TRUE_P: dict[str, dict[str, float]] = {
    "n-good-a": {"a": 0.95, "b": 0.4},
    "n-good-b": {"a": 0.4, "b": 0.95},
    "n-mid": {"a": 0.7, "b": 0.7},
    "n-bad": {"a": 0.3, "b": 0.3},
}

app = Celery("bidding_fifo_bench")
app.conf.update(
    **celery_conf(BROKER),
    worker_hijack_root_logger=False,
    result_extended=True,  # the result meta names the worker, also for failures
    task_routes={"bench.fifo_app.fifo_work": {"queue": FIFO_QUEUE}},
)
bidding.install(app)


@celeryd_after_setup.connect  # type: ignore[untyped-decorator]  # Celery is untyped
def _consume_fifo(sender: Any, instance: Any, **kwargs: Any) -> None:
    """Every node worker also consumes the FIFO queue (besides its exec.<node> queue)."""
    instance.app.amqp.queues.select_add(FIFO_QUEUE)


def _work(task: Any, task_type: str, key: str) -> dict[str, Any]:
    node = str(task.request.hostname).split("@")[0]
    rng = random.Random(task.request.id)
    time.sleep(rng.uniform(0.05, 0.1))
    if rng.random() < TRUE_P.get(node, {}).get(task_type, 0.0):
        return {"node": node, "key": key, "task_type": task_type}
    raise RuntimeError("failed")


@app.task(name="bench.fifo_app.fifo_work", bind=True)  # type: ignore[untyped-decorator]
def fifo_work(self: Any, task_type: str, key: str) -> dict[str, Any]:
    """The work as a plain Celery task (queue ``fifo``: the first free node takes it)."""
    return _work(self, task_type, key)


@app.task(  # type: ignore[untyped-decorator]  # Celery is untyped
    name="bench.fifo_app.bid_work", bind=True, base=bidding.BiddingTask, task_type="work",
    required_skills=[SKILL])
def bid_work(self: Any, task_type: str, key: str) -> dict[str, Any]:
    """The same work, auctioned; call with ``bidding={"task_type": t}``."""
    return _work(self, task_type, key)
