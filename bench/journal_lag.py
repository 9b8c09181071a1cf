"""How long an award written behind (``bidding_award_journal``) takes to reach the store.

    .venv/bin/python bench/journal_lag.py [--store sqlite|postgres|URL] [--nodes 16] [--samples 200]
                                          [--writers 2] [--burst 500]

It registers ``--nodes`` node rows in a fresh store and starts ``--writers`` writer processes
(the loop every node worker runs, ``writebehind.Writer``, and nothing else: no task runs, so no
winner writes its own entry first). Then, in "auto" bid mode with the journal on:

- ``--samples`` sequential ``.delay()``s, one every 20 ms: for each, the time from ``.delay()``
  returning to its announcement row being readable in the store (polled every 0.5 ms), and the
  caller's wall time per ``.delay()``;
- a burst of ``--burst`` ``.delay()``s as fast as one caller goes: the callers' rate, and how
  long the writers take to empty the journal after the last one (their rate).

Executions go to queues nobody consumes (the broker's db 9 is flushed before and after).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bidding.context import Context

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    """Run the measurement and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", default="sqlite")
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--burst", type=int, default=500)
    parser.add_argument("--broker", default="redis://127.0.0.1:6379/9")
    parser.add_argument("--writer", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.writer:
        write_forever(args.writer, args.broker)
        return
    from bench.common.postgres import scratch_store

    with scratch_store(args.store, "bidding_journal_lag") as url:
        run(args, url)


def make_app(url: str, broker: str) -> Any:
    """The benchmark's app: the journal on, a no-op task."""
    os.environ["BIDDING_DATABASE_URL"] = url
    os.environ["BIDDING_AWARD_JOURNAL"] = "1"
    from celery import Celery

    import bidding
    from bidding.config import celery_conf

    app = Celery("lag")
    app.conf.update(**celery_conf(broker), bidding_database_url=url)
    bidding.install(app)
    def noop() -> None:
        return None

    app.task(name="lag.noop", base=bidding.BiddingTask, task_type="lag",
             required_skills=["lag"])(noop)
    return app


def write_forever(url: str, broker: str) -> None:
    """A writer process: the node workers' journal loop, until killed."""
    from bidding.auction.writebehind import Writer
    from bidding.config import get_settings

    app = make_app(url, broker)
    writer = Writer(get_settings(app), app)
    while True:
        writer.run()


def run(args: argparse.Namespace, url: str) -> None:
    """Measure on the store at ``url``."""
    import redis
    from sqlalchemy import select

    from bidding.auction.writebehind import get_journal
    from bidding.config import get_settings
    from bidding.nodes.heartbeat import beat
    from bidding.nodes.profile import NodeProfile
    from bidding.store import ensure_schema, read_session
    from bidding.store.schema import AnnouncementRow

    redis.Redis.from_url(args.broker).flushdb()
    app = make_app(url, args.broker)
    noop = app.tasks["lag.noop"]
    settings = get_settings(app)
    ensure_schema(url)
    profiles = [NodeProfile(name=f"node{i:04d}", capabilities=["lag"])
                for i in range(args.nodes)]
    for profile in profiles:
        beat(settings, profile)
    journal = get_journal(Context(settings, app))
    assert journal is not None
    writers = [subprocess.Popen([sys.executable, __file__, "--writer", url, "--broker",
                                 args.broker], cwd=ROOT) for _ in range(args.writers)]
    try:
        time.sleep(3.0)  # the writers import and connect
        last_beat = time.monotonic()

        def beat_now() -> None:
            nonlocal last_beat
            if time.monotonic() - last_beat > 1.0:  # keep the nodes alive, outside timing
                for profile in profiles:
                    beat(settings, profile)
                last_beat = time.monotonic()

        lags, walls = [], []
        cpu_before = sum(cpu_seconds(w.pid) for w in writers)
        caller_before = time.process_time()
        for i in range(args.samples + 20):
            beat_now()
            start = time.perf_counter()
            task_id = noop.delay().id
            returned = time.perf_counter()
            q = select(AnnouncementRow.task_id).where(AnnouncementRow.task_id == task_id)
            while True:
                with read_session(url) as session:
                    if session.execute(q).first() is not None:
                        break
                time.sleep(0.0005)
            if i >= 20:
                walls.append((returned - start) * 1e3)
                lags.append((time.perf_counter() - returned) * 1e3)
            time.sleep(0.02)
        writers_cpu = sum(cpu_seconds(w.pid) for w in writers) - cpu_before
        caller_cpu = time.process_time() - caller_before
        beat_now()
        begun = time.perf_counter()
        for _ in range(args.burst):
            noop.delay()
        submitted = time.perf_counter() - begun
        while journal.backlog():
            time.sleep(0.005)
        drained = time.perf_counter() - begun
        print(f"{store_of(url)}: {args.nodes} nodes, {args.writers} writer process(es)")
        print(f"  sequential: .delay() wall p50 {pct(walls, 50):.2f} p99 {pct(walls, 99):.2f}"
              f" ms; award -> row in the store p50 {pct(lags, 50):.2f} p99 "
              f"{pct(lags, 99):.2f} max {max(lags):.2f} ms ({len(lags)} awards)")
        count = args.samples + 20
        print(f"  CPU per award: writers {writers_cpu / count * 1e3:.2f} ms; the caller "
              f"{caller_cpu / count * 1e3:.2f} ms (its polling of the store included)")
        print(f"  burst of {args.burst}: callers {args.burst / submitted:.0f}/s; journal empty "
              f"{(drained - submitted) * 1e3:.0f} ms after the last .delay() "
              f"(writers {args.burst / drained:.0f}/s over the whole burst)")
    finally:
        for writer in writers:
            writer.kill()
            writer.wait()
        redis.Redis.from_url(args.broker).flushdb()


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: int) -> float:
    """The ``q``-th percentile (nearest rank)."""
    ordered = sorted(values)
    if q == 50:
        return statistics.median(ordered)
    return ordered[min(len(ordered) - 1, int(q / 100 * len(ordered)))]


def store_of(url: str) -> str:
    """"sqlite" or "postgresql"."""
    return "sqlite" if url.startswith("sqlite") else "postgresql"


if __name__ == "__main__":
    main()
