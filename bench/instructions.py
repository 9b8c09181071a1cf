"""Instructions per auction, counted by valgrind: an A/B measure that a busy machine cannot blur.

    .venv/bin/python bench/instructions.py [--store sqlite|postgres|URL] [--nodes 4]
        [--root PATH ...]

Wall and CPU times on a shared two-core machine move by 10-20% between runs of the same code
(bench/latency.py's figures), so a change worth 5% cannot be told from the noise there.
Instructions can: ``valgrind --tool=callgrind`` counts every instruction the process runs,
the same count for the same code and inputs whatever else the machine does.

In one process, with no worker: ``--nodes`` node rows (heartbeats) in a fresh store, then per
auction a ``.delay()`` of a no-op bidding task in "auto" bid mode (proxy bids, the award in
the caller's transaction, its execution published to the winner's queue, which nobody
consumes: the broker's db 9 is flushed before and after), the winner's start
(``attempt.begin``), its completion (``attempt.complete``) and its history version's bump,
as the node's worker does them. Run twice, ``--short`` and ``--long`` auctions, under
callgrind: the difference divided by the difference in auctions is the instructions of one
auction, start-up and imports cancelled out. The histories grow over the run (up to
``episodes_read`` episodes per node and type), as a live federation's are.

``--root`` names checkouts to measure (default: this one), each through ``PYTHONPATH``; give
two for an A/B. What it does not count: the database server's work (PostgreSQL), Redis's, and
Celery's own handling of the message in a worker; bench/latency.py measures those.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BROKER = "redis://127.0.0.1:6379/9"


def main() -> None:
    """Measure each ``--root`` and print instructions per auction."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="sqlite")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--short", type=int, default=40)
    parser.add_argument("--long", type=int, default=200)
    parser.add_argument("--root", action="append", default=[])
    parser.add_argument("--inner", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner is not None:
        run_auctions(args.store, args.nodes, args.inner)
        return
    if shutil.which("valgrind") is None:
        sys.exit("valgrind is not installed: apt-get install valgrind")
    for root in args.root or [str(ROOT)]:
        started = time.monotonic()
        short = count(root, args, args.short)
        long = count(root, args, args.long)
        per = (long - short) / (args.long - args.short)
        print(f"{root}: {args.store}, {args.nodes} nodes: {per / 1e6:.2f}M instructions per "
              f"auction ({time.monotonic() - started:.0f} s)", flush=True)


def count(root: str, args: argparse.Namespace, auctions: int) -> int:
    """Instructions of one run of ``auctions`` auctions with the checkout at ``root``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = {**os.environ, "PYTHONPATH": root}
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
             str(Path(__file__).resolve()), "--inner", str(auctions), "--store", args.store,
             "--nodes", str(args.nodes)],
            env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.exit(f"the run under valgrind failed:\n{done.stdout}\n{done.stderr[-3000:]}")
        found = re.search(r"^(?:summary|totals):\s+(\d+)", out.read_text(), re.M)
        if found is None:
            sys.exit("callgrind wrote no total")
        return int(found.group(1))


def run_auctions(store: str, nodes: int, auctions: int) -> None:
    """``auctions`` auctions, started and completed in this process (the measured part)."""
    # After PYTHONPATH (the checkout measured), for ``bench.common`` when it lacks one.
    sys.path.append(str(ROOT))
    import bidding as measured
    from bench.common.postgres import scratch_store

    print(f"measuring {Path(measured.__file__).parent}", file=sys.stderr)

    with scratch_store(store, "bidding_instructions") as url:
        os.environ["BIDDING_DATABASE_URL"] = url
        import redis
        from celery import Celery

        import bidding
        from bidding.auction.history import history_changed
        from bidding.config import celery_conf, get_settings
        from bidding.context import Context
        from bidding.execution import attempt
        from bidding.nodes.heartbeat import beat
        from bidding.nodes.profile import NodeProfile
        from bidding.store import ensure_schema, read_session
        from bidding.store.schema import AnnouncementRow

        redis.Redis.from_url(BROKER).flushdb()
        app = Celery("instructions")
        app.conf.update(**celery_conf(BROKER), bidding_database_url=url)
        bidding.install(app)

        @app.task(name="instructions.noop", base=bidding.BiddingTask, task_type="noop",
                  required_skills=["noop"])  # type: ignore[untyped-decorator]
        def noop() -> None:
            return None

        settings = get_settings(app)
        ctx = Context(settings, app)
        ensure_schema(url)
        profiles = [NodeProfile(name=f"node{i:04d}", capabilities=["noop"])
                    for i in range(nodes)]
        for i in range(auctions):
            if i % 50 == 0:  # by count, not by time: the same work at any speed
                for profile in profiles:
                    beat(settings, profile)
            result = noop.delay()
            with read_session(url) as session:
                row = session.get(AnnouncementRow, result.id)
                assert row is not None and row.assigned_node is not None
                node = row.assigned_node
            run = attempt.begin(settings, result.id, 1, node, 0.0, redelivered=False,
                                starter=attempt.Starter("instructions@bench", "boot", None))
            attempt.complete(settings, run, None)
            history_changed(ctx, node)
        redis.Redis.from_url(BROKER).flushdb()


if __name__ == "__main__":
    main()
