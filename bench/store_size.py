"""What one task leaves in the store: the figure to size ``bidding_retention_days`` by.

    .venv/bin/python bench/store_size.py [--store postgres|sqlite|URL] [--nodes 4] [--tasks 2000]
                                         [--arg-bytes 0]

It starts ``--nodes`` node workers (the library's defaults, "auto" bid mode) on a fresh store
and a Redis server of its own, runs 50 tasks to warm up, then ``--tasks`` more (in bursts of
100, each ``.delay()``ed then ``.get()``), and measures the store before and after those:
the bytes on disk (PostgreSQL: ``pg_total_relation_size`` of each table with its indexes and
TOAST; SQLite: the database file with its WAL, after a checkpoint) and the rows added, per
table. Each task's argument is a string of ``--arg-bytes`` characters and it returns it, so the
fixed cost (``--arg-bytes 0``) and what arguments and results add can be read apart.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.common.nodes import WORKER_FLAGS, node_federation, write_profiles  # noqa: E402
from bench.common.postgres import scratch_store  # noqa: E402
from bench.common.redis_server import PrivateRedis  # noqa: E402

#: The tables a task leaves rows in (the nodes' own tables grow with the nodes, not the tasks).
TABLES = ("bidding_announcements", "bidding_bids", "bidding_messages", "bidding_ledger",
          "bidding_episodes", "bidding_graphs", "bidding_graph_steps")
WARM_UP = 50
BURST = 100


def main() -> None:
    """Measure and print the bytes and rows per task."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="postgres")
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--arg-bytes", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, scratch_store(args.store, "bidding_size") as url:
        broker = PrivateRedis(Path(tmp) / "redis")
        broker.start()
        try:
            measured = _measure(url, broker.url, Path(tmp), args)
        finally:
            broker.stop()
    _report(args, measured)


def _measure(url: str, broker_url: str, tmp: Path, args: argparse.Namespace
             ) -> dict[str, tuple[int, int]]:
    os.environ.update({"BENCH_BROKER": broker_url, "BIDDING_DATABASE_URL": url})
    from bench.app import app, auction_noop
    from bidding.config import get_settings

    settings = get_settings(app)
    names = [f"size-{k}" for k in range(args.nodes)]
    profiles = write_profiles(tmp / "profiles", names, skill="bench", capacity=4)
    env = {"BENCH_BROKER": broker_url, "BIDDING_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    federation = node_federation("bench.app", env, tmp / "logs", ROOT,
                                 WORKER_FLAGS)
    federation.start(profiles)
    try:
        federation.wait_live(settings, names)
        value = "x" * args.arg_bytes
        _run(auction_noop, value, WARM_UP)
        before = _sizes(url)
        started = time.monotonic()
        _run(auction_noop, value, args.tasks)
        print(f"{args.tasks} tasks in {time.monotonic() - started:.0f} s", file=sys.stderr)
        after = _sizes(url)
    finally:
        federation.stop()
    return {t: (after[t][0] - before[t][0], after[t][1] - before[t][1]) for t in after}


def _run(task: Any, value: str, count: int) -> None:
    for start in range(0, count, BURST):
        results = [task.delay(value) for _ in range(min(BURST, count - start))]
        for result in results:
            result.get(timeout=60)


def _sizes(url: str) -> dict[str, tuple[int, int]]:
    """Per table: (bytes on disk, rows); under "all", the whole store's bytes."""
    from sqlalchemy import text

    from bidding.store import read_session
    from bidding.store.engine import dispose_all

    time.sleep(3)  # the last outcomes' bookkeeping (ledger, episode) lands
    sizes: dict[str, tuple[int, int]] = {}
    with read_session(url) as session:
        postgres = session.get_bind().dialect.name == "postgresql"
        if not postgres:
            session.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
        for table in TABLES:
            rows = int(session.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
            size = (int(session.execute(text("SELECT pg_total_relation_size(:t)"),
                                        {"t": table}).scalar_one()) if postgres else 0)
            sizes[table] = (size, rows)
        total = (int(session.execute(text("SELECT pg_database_size(current_database())"))
                     .scalar_one()) if postgres else 0)
    if not postgres:
        dispose_all()
        path = Path(url.split(":///", 1)[1])
        total = sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())
    sizes["all"] = (total, sum(rows for _, rows in sizes.values()))
    return sizes


def _report(args: argparse.Namespace, grown: dict[str, tuple[int, int]]) -> None:
    print(f"store {args.store}, {args.nodes} nodes, {args.tasks} tasks, arguments and results "
          f"of {args.arg_bytes} characters")
    print("| table | rows per task | bytes per task |")
    print("|---|---:|---:|")
    for table, (size, rows) in grown.items():
        per = f"{size / args.tasks:,.0f}" if size or table == "all" else "-"
        print(f"| {table.removeprefix('bidding_')} | {rows / args.tasks:.2f} | {per} |")


if __name__ == "__main__":
    main()
