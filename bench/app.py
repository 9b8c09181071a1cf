"""The Celery app of the speed benchmark; node workers and the plain worker load it with -A.

Configured from the environment (set by ``bench/latency.py`` before anything imports it):
BENCH_BROKER (broker and result backend) and BIDDING_* for the bidding settings.

Two no-op tasks, the same body: ``noop`` is a plain Celery task (queue ``plain``, served by
one plain worker), ``auction_noop`` is a BiddingTask every benchmark node can bid on.

With BENCH_TRACE=<directory>, every process that imports this module also times the phases of
an auction (bid, record bid, award, send, execution bookkeeping) and counts SQL statements,
transactions and connections, and writes the totals to ``<directory>/<pid>.json`` when asked
(``bench/latency.py --profile`` does). It wraps module attributes of ``bidding`` at import
time; the package's files are not touched.
"""

from __future__ import annotations

import os
from typing import Any

from celery import Celery

import bidding
from bidding.config import celery_conf

BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/9")
#: The skill every benchmark node has and the bidding task requires.
SKILL = "bench"
#: The skills of the node with a bidder of its own ("mixed" bid mode), asked for too: two of
#: the three a mixed auction requires, so that its skill match (2/3, the others' 1/3) keeps it
#: among the capped candidates however the others' learned trust grows.
ASKED_SKILLS = ("bench_asked", "bench_asked_too")
#: The queue of the plain worker.
PLAIN_QUEUE = "plain"

app = Celery("bidding_bench")
app.conf.update(
    **celery_conf(BROKER),
    worker_hijack_root_logger=False,
    task_routes={"bench.app.noop": {"queue": PLAIN_QUEUE}},
)
bidding.install(app)


@app.task(name="bench.app.noop")  # type: ignore[untyped-decorator]  # Celery is untyped
def noop(value: Any = None) -> Any:
    """A plain Celery task that does nothing."""
    return value


@app.task(  # type: ignore[untyped-decorator]  # Celery is untyped
    name="bench.app.auction_noop", base=bidding.BiddingTask, task_type="bench_noop",
    required_skills=[SKILL])
def auction_noop(value: Any = None) -> Any:
    """The same no-op, auctioned among the benchmark nodes."""
    return value


def keep_draft(announcement: bidding.Announcement, draft: bidding.Bid) -> None:
    """The bidder of the "mixed" mode's asked node: it keeps the built-in draft, so that what
    is measured is the cost of asking a node, not of a bidder's own work."""
    return None


if os.environ.get("BENCH_TRACE"):
    from bench import phases

    phases.install(os.environ["BENCH_TRACE"])
