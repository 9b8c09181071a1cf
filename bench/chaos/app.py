"""The Celery app of the chaos soak; its node workers load it with ``-A bench.chaos.app``.

Configured from the environment the soak sets: SOAK_BROKER (broker and result backend),
SOAK_RUNS_DIR (where bodies record their runs) and BIDDING_* settings. The task sleeps for
the time it is given and returns ``{"i": i, "square": i * i}``, or raises ``ValueError`` for
the indexes the soak marks as failing: those are retried once (on another node), then end
FAILED with that error, in the store and at the caller.

The failing ones are a task type of their own (``soak-failing``) with ``min_confidence`` 0,
the one setting that differs from the library's defaults, and why: a task that fails on
purpose every time teaches every node that it fails that type. In the same type as the others
(a long soak showed it), its retries, which go to another node than the one that failed it,
drag that node's confidence below the default ``min_confidence`` (0.5), and tasks that would
have succeeded then end "No bids met minimum confidence" when the better nodes are being
restarted. As a type of its own, at the default, it would itself end so rather than with its
own error after its retry, which is what the soak checks.
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

import bidding
from bench.chaos.runs import record
from bidding.config import celery_conf

BROKER = os.environ.get("SOAK_BROKER", "redis://127.0.0.1:6379/9")
#: The skill every soak node offers and the task requires.
SKILL = "soak"

app = Celery("bidding_soak")
app.conf.update(**celery_conf(BROKER), worker_hijack_root_logger=False)
bidding.install(app)


def expected(i: int, fails: bool) -> dict[str, int] | str:
    """The right outcome of task ``i``: its value, or the text of its error."""
    return f"task {i} fails on purpose" if fails else {"i": i, "square": i * i}


def _body(task: Any, i: int, seconds: float, fails: bool) -> dict[str, int]:
    node = str(task.request.hostname).split("@")[0]
    record("start", task.request.id, node)
    time.sleep(seconds)
    record("end", task.request.id, node)
    if fails:
        raise ValueError(expected(i, fails))
    return {"i": i, "square": i * i}


@app.task(  # type: ignore[untyped-decorator]  # Celery is untyped
    base=bidding.BiddingTask, bind=True, task_type="soak", required_skills=[SKILL],
    retry_policy=bidding.RetryPolicy(max_retries=1, base_ms=200))
def work(self: Any, i: int, seconds: float, fails: bool = False) -> dict[str, int]:
    """Sleep ``seconds`` (the work), then return task ``i``'s value."""
    return _body(self, i, seconds, fails)


@app.task(  # type: ignore[untyped-decorator]  # Celery is untyped
    base=bidding.BiddingTask, bind=True, task_type="soak-failing", required_skills=[SKILL],
    retry_policy=bidding.RetryPolicy(max_retries=1, base_ms=200),
    bidding={"min_confidence": 0.0})
def failing_work(self: Any, i: int, seconds: float, fails: bool = True) -> dict[str, int]:
    """Sleep ``seconds``, then raise task ``i``'s error (see the module: its own type)."""
    return _body(self, i, seconds, fails)
