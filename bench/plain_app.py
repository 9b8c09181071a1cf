"""A plain Celery app, bidding not installed: the idle benchmark's baseline workers load it
with -A (``bench/idle.py --plain``). Configured from BENCH_BROKER (broker and result backend),
with the same JSON-only settings as the benchmark's bidding app.
"""

from __future__ import annotations

import os

from celery import Celery

from bidding.config import celery_conf

BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/9")

app = Celery("bench_plain")
app.conf.update(**celery_conf(BROKER), worker_hijack_root_logger=False)


@app.task(name="bench.plain_app.noop")  # type: ignore[untyped-decorator]  # Celery is untyped
def noop() -> None:
    """Does nothing: the workers are measured idle."""
