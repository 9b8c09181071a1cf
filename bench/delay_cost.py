"""What one ``.delay()`` of a bidding task costs its caller, per store, with no worker running.

    .venv/bin/python bench/delay_cost.py [--store sqlite|postgres|URL] [--nodes 16] [--samples 300]

It registers ``--nodes`` node rows (heartbeats, published profiles) in a fresh store, then
announces ``--samples`` no-op tasks in "auto" bid mode: each is bid for by proxy and awarded in
the caller's transaction, and its execution published to the winner's queue (nobody consumes
it; the broker's db 9 is flushed before and after). It prints the caller's wall and CPU time
per ``.delay()`` (median, p99) and the SQL statements per auction: the store's share of the
hot path, without the noise of node workers on the same cores.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    """Run the measurement and print one line per store."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="sqlite")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--samples", type=int, default=300)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/9")
    args = parser.parse_args()
    from bench.common.postgres import scratch_store

    with scratch_store(args.store, "bidding_delay_cost") as url:
        run(args, url)


def run(args: argparse.Namespace, url: str) -> None:
    """Measure ``args.samples`` auctions on the store at ``url``."""
    os.environ["BIDDING_DATABASE_URL"] = url
    import redis
    from celery import Celery
    from sqlalchemy import event

    import bidding
    from bidding.config import celery_conf, get_settings
    from bidding.nodes.heartbeat import beat
    from bidding.nodes.profile import NodeProfile
    from bidding.store import ensure_schema
    from bidding.store.engine import get_engine

    redis.Redis.from_url(args.broker).flushdb()
    app = Celery("micro")
    app.conf.update(**celery_conf(args.broker), bidding_database_url=url)
    bidding.install(app)

    @app.task(name="micro.noop", base=bidding.BiddingTask, task_type="micro",
              required_skills=["micro"])  # type: ignore[untyped-decorator]
    def noop() -> None:
        return None

    settings = get_settings(app)
    ensure_schema(url)
    profiles = [NodeProfile(name=f"node{i:04d}", capabilities=["micro"])
                for i in range(args.nodes)]
    last_beat = 0.0
    statements = [0]

    @event.listens_for(get_engine(url), "before_cursor_execute")
    def _count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
        statements[0] += 1
        if os.environ.get("DELAY_COST_SQL") and len(walls) == 5:
            print("  SQL:", " ".join(statement.split())[:150])

    # psycopg's own commands (BEGIN, COMMIT, ROLLBACK) are round trips that SQLAlchemy's
    # statement events do not see: counted where psycopg sends them.
    commands = [0]
    if store_of(url) == "postgresql":
        from psycopg._connection_base import BaseConnection

        send = BaseConnection._exec_command

        def _exec_command(self: Any, command: Any, *a: Any, **k: Any) -> Any:
            commands[0] += 1
            if os.environ.get("DELAY_COST_SQL") and len(walls) == 5:
                print("  CMD:", bytes(command).decode())
            return send(self, command, *a, **k)

        BaseConnection._exec_command = _exec_command  # type: ignore[method-assign]

    walls, cpus = [], []
    for i in range(args.samples + 30):
        if time.monotonic() - last_beat > 1.0:  # keep the nodes alive, outside the timing
            for profile in profiles:
                beat(settings, profile)
            last_beat = time.monotonic()
        if i == 30:
            statements[0] = commands[0] = 0
        w, c = time.perf_counter(), time.process_time()
        noop.delay()
        if i >= 30:
            walls.append((time.perf_counter() - w) * 1e3)
            cpus.append((time.process_time() - c) * 1e3)
    walls.sort()
    cpus.sort()
    p99 = walls[min(len(walls) - 1, int(0.99 * len(walls)))]
    store = store_of(url)
    trips = (f", {(statements[0] + commands[0]) / args.samples:.1f} round trips "
             f"(BEGIN/COMMIT/ROLLBACK {commands[0] / args.samples:.1f})"
             if store == "postgresql" else "")
    print(f"{store}: {args.nodes} nodes, delay() wall p50 {statistics.median(walls):.2f} "
          f"p99 {p99:.2f} ms, CPU p50 {statistics.median(cpus):.2f} ms, "
          f"{statements[0] / args.samples:.1f} statements per auction{trips}")
    redis.Redis.from_url(args.broker).flushdb()


def store_of(url: str) -> str:
    """"sqlite" or "postgresql"."""
    return "sqlite" if url.startswith("sqlite") else "postgresql"


if __name__ == "__main__":
    main()
