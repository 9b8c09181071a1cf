"""What an idle federation costs, with the library's defaults: CPU, memory, store connections
and store transactions, as nodes are added.

Starts N ``bidding worker`` processes (each with the pool its profile's capacity asks for),
waits until they are live and a warm-up has passed, then measures for ``--seconds`` while no
task runs:

- CPU: every process of every node worker (its main process and its pool), from /proc, and on
  PostgreSQL the server's backends that serve this benchmark's database;
- memory: RSS of the main processes (their mean and the largest) and of the pool processes
  (their mean), separately;
- connections: the store connections the nodes hold (PostgreSQL's ``pg_stat_activity`` for
  the benchmark's database);
- transactions per second on the store (``pg_stat_database``: commits and rollbacks);
- store errors: the lines of the node workers' logs, from their start to the end of the
  measurement, that say the store was locked or refused a connection ("database is locked",
  "too many clients"), apart from those of a write that waited and tried again (counted as
  waits): the nodes start all at once, as a supervisor starts them.

No setting is changed from its default (the broker is a Redis database of its own).

With ``--plain``, as many idle plain Celery workers of the same shape (prefork, 4 processes,
``-E``, no gossip) are measured after each federation, on the same broker: what Celery itself
costs idle, the floor under the nodes' figure.

Run: ``.venv/bin/python bench/idle.py --nodes 4,16 --seconds 30 [--store postgresql] [--plain]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).absolute().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").absolute() != BENCH_DIR]
if str(BENCH_DIR.parent) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR.parent))

import redis  # noqa: E402
import sqlalchemy as sa  # noqa: E402

from bidding.config import Settings  # noqa: E402
from bidding.nodes.federation import Federation, descendants  # noqa: E402
from bidding.store.migrate import upgrade  # noqa: E402

POSTGRES = os.environ.get("BIDDING_BENCH_POSTGRES", "postgresql+psycopg://postgres@127.0.0.1/test")
BROKER = os.environ.get("BENCH_BROKER", "redis://127.0.0.1:6379/9")
TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    """User and system CPU seconds of ``pid`` so far (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


def rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` in MB."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE / 2**20
    except OSError:
        return 0.0


def profile(directory: Path, name: str) -> Path:
    path = directory / f"{name}.toml"
    path.write_text(f'name = "{name}"\ncapabilities = ["bench"]\ncapacity = 4\n')
    return path


def server_pids(engine: sa.Engine, database: str) -> list[int]:
    with engine.connect() as conn:
        return [int(p) for p in conn.execute(sa.text(
            "SELECT pid FROM pg_stat_activity WHERE datname = :d AND pid <> pg_backend_pid()"),
            {"d": database}).scalars()]


def transactions(engine: sa.Engine, database: str) -> int:
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_clear_snapshot()"))
        return int(conn.execute(sa.text(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = :d"),
            {"d": database}).scalar_one())


def sample(count: int, mains: list[int], seconds: float,
           servers: list[int] | None = None) -> dict[str, float]:
    """CPU (per process kind, % of a core) over ``seconds`` and RSS of ``count`` workers whose
    main processes are ``mains`` (their pools are their children), and of the store's server
    backends ``servers`` when there are any."""
    pools = [p for m in mains for p in descendants(m)]
    servers = servers or []
    every = mains + pools + servers
    before = {p: cpu_seconds(p) for p in every}
    started = time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - started
    used = {p: cpu_seconds(p) - before[p] for p in every}
    return {
        "nodes": count,
        "seconds": took,
        "cpu_nodes_pct": 100 * sum(used[p] for p in mains + pools) / took,
        "cpu_main_pct": 100 * sum(used[p] for p in mains) / took,
        "cpu_server_pct": 100 * sum(used[p] for p in servers) / took if servers else 0.0,
        "rss_main_mb": sum(rss_mb(p) for p in mains) / len(mains),
        "rss_main_max_mb": max(rss_mb(p) for p in mains),
        "rss_pool_mb": sum(rss_mb(p) for p in pools) / max(1, len(pools)),
        "connections": float("nan"),
        "transactions_per_s": float("nan"),
    }


#: What a node worker's log says when the store turned it away.
STORE_ERRORS = re.compile(r"database is locked|too many clients|remaining connection slots")
#: ... and when it then waited and tried again (``store.outage``): not an error.
WAITED = "trying again"


def store_errors(directory: Path) -> tuple[int, int]:
    """Lines of the node workers' logs in ``directory`` that say the store turned them away:
    (errors, waits that were tried again)."""
    errors = waits = 0
    for log in directory.glob("*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if STORE_ERRORS.search(line):
                if WAITED in line:
                    waits += 1
                else:
                    errors += 1
    return errors, waits


def thread_cpu(mains: list[int], seconds: float) -> dict[str, float]:
    """CPU (% of a core) over ``seconds`` of every thread of the processes ``mains``,
    summed by thread name (``py-spy dump`` names them; a node's name and numbers in a name
    are dropped, so that the 16 nodes' heartbeats are one line). Threads py-spy cannot name
    (Celery's, before they run Python) count as "(unnamed)"."""
    spy = Path(sys.executable).with_name("py-spy")
    names: dict[tuple[int, int], str] = {}
    for pid in mains:
        dump = subprocess.run([str(spy), "dump", "--pid", str(pid)], capture_output=True,
                              text=True, timeout=30).stdout
        for line in dump.splitlines():
            if line.startswith("Thread ") and '"' in line:
                tid = int(line.split()[1], 0)
                names[(pid, tid)] = line.split('"')[1]

    def ticks() -> dict[tuple[int, int], float]:
        out = {}
        for pid in mains:
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(OSError):
                    fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
                    out[(pid, int(task.name))] = (int(fields[11]) + int(fields[12])) / TICKS
        return out

    before = ticks()
    started = time.monotonic()
    time.sleep(seconds)
    took = time.monotonic() - started
    after = ticks()
    by_name: dict[str, float] = {}
    for key, used in after.items():
        name = names.get(key, "(unnamed)")
        name = re.sub(r"idle-\d+", "NODE", name)
        name = re.sub(r"\d+", "N", name)
        by_name[name] = by_name.get(name, 0.0) + 100 * (used - before.get(key, 0.0)) / took
    return dict(sorted(by_name.items(), key=lambda kv: -kv[1]))


def measure(nodes: int, seconds: float, store: str, directory: Path,
            worker_args: tuple[str, ...] = (), threads: bool = False) -> dict[str, Any]:
    """Start ``nodes`` idle node workers and measure them for ``seconds``."""
    admin = sa.create_engine(POSTGRES, isolation_level="AUTOCOMMIT")
    database = ""
    if store == "postgresql":
        database = f"bidding_idle_{uuid.uuid4().hex[:8]}"
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{database}"'))
        url = POSTGRES.rsplit("/", 1)[0] + f"/{database}"
    else:
        url = f"sqlite:///{directory}/idle-{nodes}.db"
    upgrade(url)
    redis.Redis.from_url(BROKER).flushdb()
    env = {"BIDDING_DATABASE_URL": url, "BENCH_BROKER": BROKER}
    os.environ.update(env)
    logs = directory / f"{store}-{nodes}"  # this run's node logs, apart from another size's
    federation = Federation(app="bench.app", env=env, log_dir=logs, concurrency=4,
                            cwd=BENCH_DIR.parent, extra_args=worker_args)
    try:
        federation.start(profile(directory, f"idle-{i}") for i in range(nodes))
        federation.wait_live(Settings(database_url=url), timeout=120)
        live_at = time.monotonic()
        time.sleep(10)  # warm-up: imports done, first sweeps and heartbeats past
        mains = [n.process.pid for n in federation.nodes.values()]
        row: dict[str, Any]
        if not database:
            row = sample(nodes, mains, seconds)
        else:
            xact0 = transactions(admin, database)
            row = sample(nodes, mains, seconds, server_pids(admin, database))
            row["transactions_per_s"] = (transactions(admin, database) - xact0) / row["seconds"]
            row["connections"] = len(server_pids(admin, database))
            row["connections_after_s"] = time.monotonic() - live_at
        if threads:
            row = {**row, "threads": thread_cpu(mains, seconds)}
        row["store_errors"], row["store_waits"] = store_errors(logs)
        return row
    finally:
        federation.stop()
        if database:
            admin.dispose()
            with sa.create_engine(POSTGRES, isolation_level="AUTOCOMMIT").connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)'))


def measure_plain(workers: int, seconds: float, directory: Path) -> dict[str, float]:
    """The baseline: ``workers`` idle plain Celery workers of the same shape (prefork, 4
    processes, task events on as ``bidding worker`` has them, gossip off as it has it) on the
    same broker, measured as ``measure`` measures the nodes."""
    redis.Redis.from_url(BROKER).flushdb()
    env = {**os.environ, "BENCH_BROKER": BROKER, "PYTHONPATH": str(BENCH_DIR.parent)}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i in range(workers):
            log = (directory / f"plain-{i}.log").open("ab")
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "bench.plain_app", "worker", "-c", "4",
                 "-Q", f"plain-{i}", "-n", f"plain-{i}@%h", "-E", "--without-gossip",
                 "-l", "WARNING"],
                cwd=BENCH_DIR.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
            log.close()
        # Up once each has its pool (the same warm-up as the nodes' after they are live).
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and any(
                len(descendants(p.pid)) < 4 for p in procs):
            time.sleep(0.5)
        time.sleep(10)
        return sample(workers, [p.pid for p in procs], seconds)
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="4,16", help="node counts (default 4,16)")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--store", choices=("postgresql", "sqlite"), default="postgresql")
    parser.add_argument("--worker-args", default="",
                        help="more arguments for every `bidding worker` (a setting that "
                             "differs from the defaults: say so with the figures)")
    parser.add_argument("--threads", action="store_true",
                        help="then, over as many seconds again, the nodes' main processes' "
                             "CPU per thread (named with py-spy, which must be installed)")
    parser.add_argument("--plain", action="store_true",
                        help="also measure as many idle plain Celery workers of the same shape "
                             "(the baseline: what Celery itself costs idle)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bidding-idle-") as folder:
        rows = []
        for n in args.nodes.split(","):
            rows.append({"kind": "bidding", **measure(int(n), args.seconds, args.store,
                                                      Path(folder),
                                                      tuple(args.worker_args.split()),
                                                      args.threads)})
            if args.plain:
                rows.append({"kind": "plain", **measure_plain(int(n), args.seconds,
                                                            Path(folder))})
    print(f"store {args.store}, {args.seconds:g} s idle, the library's defaults")
    print(f"{'kind':>7} {'nodes':>5} {'CPU nodes %':>11} {'of it main %':>12} {'server %':>8} "
          f"{'RSS main MB':>11} {'max':>5} {'RSS pool MB':>11} {'conns':>5} {'xact/s':>7} "
          f"{'store errors / waits':>20}")
    for r in rows:
        print(f"{r['kind']:>7} {r['nodes']:>5} {r['cpu_nodes_pct']:>11.1f} "
              f"{r['cpu_main_pct']:>12.1f} "
              f"{r['cpu_server_pct']:>8.1f} {r['rss_main_mb']:>11.0f} {r['rss_main_max_mb']:>5.0f} "
              f"{r['rss_pool_mb']:>11.0f} "
              f"{r['connections']:>5} {r['transactions_per_s']:>7.1f} "
              f"{r.get('store_errors', '-'):>10} / {r.get('store_waits', '-'):<7}")
    for r in rows:
        if "connections_after_s" in r:
            # A node closes its process's connections unused for a minute, at most every 15 s
            # (decision 0037): read earlier, the count still has the start-up's.
            print(f"connections of {r['nodes']} nodes read {r['connections_after_s']:.0f} s "
                  "after they were live; unused ones are closed after a minute (checked every "
                  "15 s): with --seconds under about 65 the count still includes those "
                  "opened at start-up")
    for r in rows:
        if "threads" in r:
            print(f"per thread, {r['nodes']} nodes' main processes (% of a core):")
            for name, pct in r["threads"].items():
                if pct >= 0.05:
                    print(f"  {pct:5.2f}  {name}")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
