"""The Celery app of the chaos soak; its node workers load it with ``-A bench.chaos.app``.

Configured from the environment the soak sets: SOAK_BROKER (broker and result backend),
SOAK_RUNS_DIR (where bodies record their runs) and BIDDING_* settings. The one task sleeps
for the time it is given and returns ``{"i": i, "square": i * i}``, or raises ``ValueError``
for the indexes the soak marks as failing: those are retried once (on another node), then end
FAILED with that error, in the store and at the caller.
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


@app.task(  # type: ignore[untyped-decorator]  # Celery is untyped
    base=bidding.BiddingTask, bind=True, task_type="soak", required_skills=[SKILL],
    retry_policy=bidding.RetryPolicy(max_retries=1, base_ms=200))
def work(self: Any, i: int, seconds: float, fails: bool = False) -> dict[str, int]:
    """Sleep ``seconds`` (the work), then return task ``i``'s value or raise its error."""
    node = str(self.request.hostname).split("@")[0]
    record("start", self.request.id, node)
    time.sleep(seconds)
    record("end", self.request.id, node)
    if fails:
        raise ValueError(expected(i, fails))
    return {"i": i, "square": i * i}
