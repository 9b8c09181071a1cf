"""Chaos soak: tasks stream into a federation of node workers while a driver SIGKILLs a random
worker every few seconds (restarting it a second later under the same name), restarts the
broker and restarts the store; at the end every accepted task must be in its right final state
in the store and at its caller, and every body that ran twice must be explained by a kill.

    python bench/soak.py                       # 1,000 tasks, 5 nodes, PostgreSQL + Redis
    python bench/soak.py --tasks 100 --kills 3 --store-restarts 0   # the CI-sized run
    python bench/soak.py --minutes 30 --retention-seconds 120 --kill-every 30 \
        --broker-restarts 2 --store-restarts 0 --sever-every 2     # the long one

A timed soak (``--minutes``) spares one node from the kills and samples every worker's memory
and the store's row counts; with ``--retention-seconds`` the nodes prune what finished that
long ago as they go (``bidding_retention_days``), so each task's outcome in the store is read
as soon as it is final.

The broker is a Redis server of the soak's own with an append-only file (a production broker
keeps what it queued across a restart); the store is a scratch PostgreSQL database (or
``--store sqlite``). It stops by itself: bounded in tasks and in time (``--timeout``). Exit 0
when the verdict holds, 1 when it does not, printing each problem.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root on the path
    sys.path.insert(0, str(Path(__file__).absolute().parent.parent))

from bench.chaos.chaos import Chaos, Plan
from bench.chaos.runs import RUNS_ENV, read_runs
from bench.chaos.verdict import Submitted, Verdict, judge
from bench.chaos.watch import SAMPLE_EVERY, OutcomeWatcher, Sampler
from bench.common.log import log
from bench.common.paths import ROOT
from bench.common.postgres import LOCAL_SERVER, scratch_database
from bench.common.redis_server import PrivateRedis
from bidding.context import Context
from bidding.observe.logcheck import CheckReport, check_log

POSTGRES = LOCAL_SERVER


@dataclass
class SoakConfig:
    """The size and the faults of one soak."""

    tasks: int = 1000
    nodes: int = 5
    rate: float = 6.0
    body_min: float = 0.2
    body_max: float = 1.0
    #: Every n-th task fails on purpose (retried once, then FAILED with its own error).
    fail_every: int = 10
    kill_every: float = 4.0
    kills: int | None = None  # None: as many as fit while tasks are submitted
    pause: float = 1.0
    broker_restarts: int = 1
    broker_down: float = 2.0
    store_restarts: int = 1
    store_down: float = 3.0
    store_mode: str = "database"
    #: Seconds between severings of every connection to the store (PostgreSQL only); 0 = never.
    sever_every: float = 0.0
    store: str = "postgresql"
    timeout: float = 900.0
    seed: int = 1
    concurrency: int = 2
    #: 1: awards go through the write-behind journal (``bidding_award_journal``).
    award_journal: int = 0
    #: Minutes of submission at ``rate`` (0: ``tasks`` tasks); a timed soak spares one node
    #: from the kills and samples memory and the store's size.
    minutes: float = 0.0
    #: The nodes' retention in seconds (``bidding_retention_days``; 0: the library's 30 days).
    retention_seconds: float = 0.0
    #: Seconds between two samples of memory and row counts (timed soaks only).
    sample_every: float = SAMPLE_EVERY

    @property
    def count(self) -> int:
        """How many tasks it submits."""
        return int(self.rate * self.minutes * 60) if self.minutes > 0 else self.tasks

    @property
    def submit_seconds(self) -> float:
        """How long the submission lasts."""
        return self.count / self.rate


@dataclass
class SoakResult:
    """The verdict, the faults and the timings of a soak."""

    config: SoakConfig
    verdict: Verdict
    faults: list[str] = field(default_factory=list)
    chaos_errors: list[str] = field(default_factory=list)
    #: The protocol checker's verdict over the log of every task in the store.
    protocol: CheckReport | None = None
    seconds: float = 0.0
    settle_seconds: float = 0.0
    #: Awards the callers appended to the write-behind journal (its stream's entries-added).
    journaled: int | None = None
    #: Per worker process alive from the warm-up to the end: (node, pid, KiB after the
    #: warm-up, KiB at the end, growth %); and the largest row count of each table.
    memory: list[tuple[str, int, int, int, float]] = field(default_factory=list)
    most_rows: dict[str, int] = field(default_factory=dict)
    #: Prunes the retention job ran (its runs seen in the store's jobs table).
    prunes: int = 0


@contextmanager
def _store(config: SoakConfig, folder: Path) -> Iterator[str]:
    if config.store == "sqlite":
        yield f"sqlite:///{folder / 'store.db'}"
        return
    with scratch_database(POSTGRES, "bidding_soak") as url:
        yield url


def run(config: SoakConfig, folder: Path | None = None) -> SoakResult:
    """Run one soak in ``folder`` (a temporary one by default) and judge it."""
    if folder is None:
        with tempfile.TemporaryDirectory(prefix="bidding-soak-") as tmp:
            return run(config, Path(tmp))
    folder.mkdir(parents=True, exist_ok=True)
    broker = PrivateRedis(folder / "redis")
    broker.start()
    try:
        with _store(config, folder) as database_url:
            return _soak(config, folder, broker, database_url)
    finally:
        broker.stop()


def _soak(config: SoakConfig, folder: Path, broker: PrivateRedis,
          database_url: str) -> SoakResult:
    # The soak's app reads these as it is imported and as its settings load; they are put back
    # afterwards (a test process goes on with other stores).
    soak_env = {"SOAK_BROKER": broker.url, RUNS_ENV: str(folder),
                "BIDDING_DATABASE_URL": database_url,
                "BIDDING_AWARD_JOURNAL": "1" if config.award_journal else "0"}
    saved = {k: os.environ.get(k) for k in soak_env}
    os.environ.update(soak_env)
    try:
        return _soak_in_env(config, folder, broker, database_url)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _soak_in_env(config: SoakConfig, folder: Path, broker: PrivateRedis,
                 database_url: str) -> SoakResult:
    from bench.chaos.app import app, expected, failing_work, work
    from bidding.config import get_settings, reset_settings
    from bidding.nodes.federation import Federation
    from bidding.store import upgrade

    app.conf.broker_url = app.conf.result_backend = broker.url
    reset_settings(app)
    upgrade(database_url)
    settings = get_settings(app)
    names = [f"soak-{k}" for k in range(config.nodes)]
    profiles = []
    for name in names:
        path = folder / f"{name}.toml"
        path.write_text(f'name = "{name}"\ncapabilities = ["soak"]\ncapacity = '
                        f'{config.concurrency}\nprice_per_unit = 0.01\nlatency_ms = 50\n'
                        "trust = 70\n")
        profiles.append(path)
    node_env = {"SOAK_BROKER": broker.url, RUNS_ENV: str(folder),
                "BIDDING_DATABASE_URL": database_url, "PYTHONPATH": str(ROOT)}
    if config.retention_seconds > 0:
        node_env["BIDDING_RETENTION_DAYS"] = repr(config.retention_seconds / 86_400)
    federation = Federation(
        app="bench.chaos.app", log_dir=folder / "logs", concurrency=config.concurrency,
        cwd=ROOT, env=node_env)
    window = config.submit_seconds
    kills = config.kills if config.kills is not None else max(0, int(window // config.kill_every))
    plan = Plan(kill_every=config.kill_every, kills=kills, pause=config.pause,
                broker_at=_spread(config.broker_restarts, window, 0.4),
                broker_down=config.broker_down,
                store_at=(_spread(config.store_restarts, window, 0.7)
                          if config.store == "postgresql" else []),
                store_down=config.store_down, store_mode=config.store_mode,
                sever_every=config.sever_every if config.store == "postgresql" else 0.0,
                spare=(names[0],) if config.minutes > 0 else ())
    lock = threading.Lock()

    def restart(node: str, pause: float) -> float:
        with lock:  # one restart at a time: Federation's process table is not thread-safe
            return federation.restart(node, pause=pause)

    def revive(node: str) -> bool:
        with lock:
            if federation.nodes[node].process.poll() is None:
                return False
            federation.restart(node, pause=0.0)
            return True

    chaos = Chaos(plan, restart, names, broker, database_url, POSTGRES, seed=config.seed,
                  revive=revive)
    watcher = OutcomeWatcher(database_url)
    sampler = Sampler(database_url, lambda: {
        n: p.process.pid for n, p in federation.nodes.items() if p.process.poll() is None},
        every=config.sample_every if config.minutes > 0 else 1e9,
        retention=config.retention_seconds if config.retention_seconds > 0 else None,
        overdue_after=(overdue_after(config.retention_seconds)
                       if config.retention_seconds > 0 else 0.0))
    started = time.time()
    try:
        federation.start(profiles)
        federation.wait_live(settings, timeout=120)
        log(f"soak: {len(names)} nodes live; {config.count} tasks at {config.rate:g}/s, "
            f"{kills} kills, {len(plan.broker_at)} broker and {len(plan.store_at)} store "
            "restart(s)" + (f", retention {config.retention_seconds:g}s"
                            if config.retention_seconds else ""))
        chaos.start()
        watcher.start()
        sampler.start()
        refusals: Counter[str] = Counter()
        submitted, refused = _submit(config, (work, failing_work), refusals, watcher)
        chaos.stop()
        log(f"soak: submitted {len(submitted)} (refused {refused}); waiting for the outcomes")
        settle = time.time()
        watcher.finish(started + config.submit_seconds + config.timeout)
        settle_seconds = time.time() - settle
        sampler.stop()
        sampler.save(folder / "samples.jsonl")
        store, caller = watcher.store, watcher.caller
        journal, unfinished = _read_store(database_url, [s.task_id for s in submitted])
        protocol = check_log(database_url)
        journaled = _journaled(settings, app)
        prunes = _prunes(database_url)
    finally:
        chaos.stop()
        sampler.stop()
        federation.stop()
        reset_settings(app)
    verdict = judge(submitted, refused, store, caller, read_runs(folder), chaos.kills(),
                    journal, expected)
    verdict.refusals = refusals
    # A .delay() that raised must leave nothing half-recorded: any row it wrote is final.
    verdict.problems += [f"task {t} was refused by .delay() but its row is left {state}"
                         for t, state in unfinished]
    # Every task's log keeps the protocol, faults and all (seed 002's independent check).
    verdict.problems += [f"protocol: {v.line()}" for v in protocol.violations]
    return SoakResult(config, verdict, protocol=protocol,
                      faults=[f"{f.kind} {f.node or f.detail} at +{f.at - started:.1f}s"
                              for f in chaos.faults],
                      chaos_errors=chaos.errors, seconds=time.time() - started,
                      settle_seconds=settle_seconds, journaled=journaled,
                      memory=(sampler.memory_growth(WARM_UP, _lived(config))
                              if config.minutes > 0 else []),
                      most_rows=sampler.most_rows(), prunes=prunes)


#: Seconds after a worker process starts before its memory should stay flat (imports,
#: caches, pools filled).
WARM_UP = 120.0


def _lived(config: SoakConfig) -> float:
    """How long after its warm-up a worker must have lived to have its memory reported: a
    third of the run (the kills and the broker's restarts end most workers sooner)."""
    return config.submit_seconds / 3


def overdue_after(retention_seconds: float) -> float:
    """Seconds a task may stay in the store once a prune could delete it: three prune
    intervals (the nodes look every interval, give or take a quarter, and a prune may be lost
    with the node killed while it ran)."""
    return 3 * prune_every_seconds(retention_seconds)


def prune_every_seconds(retention_seconds: float) -> float:
    """The nodes' prune interval for a retention of ``retention_seconds``."""
    from bidding.config import Settings
    from bidding.lifecycle.retention import prune_every

    every = prune_every(Settings(retention_days=retention_seconds / 86_400))
    assert every is not None
    return every


def _prunes(database_url: str) -> int:
    """How many times the retention job ran."""
    from sqlalchemy import text

    from bidding.store import read_session

    with read_session(database_url) as session:
        return int(session.execute(text(
            "SELECT coalesce(sum(runs), 0) FROM bidding_jobs WHERE name = 'retention'"
        )).scalar_one())


def _journaled(settings: Any, app: Any) -> int | None:
    """How many awards entered the write-behind journal (None when it is off)."""
    from bidding.auction.writebehind import get_journal

    journal = get_journal(Context(settings, app))
    if journal is None:
        return None
    try:
        info = journal.client.xinfo_stream(journal.stream)
    except Exception:  # no stream: nothing was ever journaled
        return 0
    return int(info.get("entries-added", 0))


def _spread(count: int, window: float, first: float) -> list[float]:
    """``count`` moments in ``window`` seconds, the first at fraction ``first`` of it."""
    if count <= 0:
        return []
    step = (1.0 - first) / count
    return [window * (first + k * step) for k in range(count)]


def _submit(config: SoakConfig, tasks: tuple[Any, Any], refusals: Counter[str],
            watcher: OutcomeWatcher) -> tuple[list[Submitted], int]:
    """Submit the tasks at the configured rate; a ``.delay()`` the broker refuses (it is
    down past Celery's publish retries) is counted, not retried: the caller saw the error."""
    rng = random.Random(config.seed)
    submitted: list[Submitted] = []
    refused = 0
    start = time.monotonic()
    for i in range(config.count):
        time.sleep(max(0.0, start + i / config.rate - time.monotonic()))
        fails = config.fail_every > 0 and i % config.fail_every == config.fail_every - 1
        try:
            task = tasks[1] if fails else tasks[0]
            result = task.apply_async((i, round(rng.uniform(config.body_min, config.body_max),
                                                3), fails))
        except Exception as exc:
            refused += 1
            refusals[type(exc).__name__] += 1
            log(f"soak: task {i} refused by .delay(): {type(exc).__name__}: {exc}")
            continue
        submitted.append(Submitted(result.id, i, fails, 2 if fails else 1))
        watcher.add(result.id, result)
    return submitted, refused


def _read_store(database_url: str, task_ids: list[str]
                ) -> tuple[Counter[str], list[tuple[str, str]]]:
    """The journal's message kinds (of the tasks still in the store), and the rows of refused
    calls that are not final (none, when nothing is left half-recorded)."""
    from sqlalchemy import select

    from bidding.store import read_session
    from bidding.store.schema import AnnouncementRow, Message

    journal: Counter[str] = Counter()
    accepted = set(task_ids)
    unfinished: list[tuple[str, str]] = []
    with read_session(database_url) as session:
        for row in session.execute(select(AnnouncementRow.task_id, AnnouncementRow.state)):
            if row.task_id not in accepted and row.state not in ("SUCCESS", "FAILED",
                                                                 "ESCALATED"):
                unfinished.append((row.task_id, row.state))
        for kind, in session.execute(select(Message.kind)):
            journal[kind] += 1
    return journal, unfinished


def report(result: SoakResult) -> str:
    """The soak's figures as markdown."""
    c, v = result.config, result.verdict
    lines = [
        f"### Chaos soak: {c.count} tasks"
        + (f" over {c.minutes:g} min" if c.minutes else "")
        + f", {c.nodes} nodes, store {c.store}"
        + (f", retention {c.retention_seconds:g} s" if c.retention_seconds else ""),
        "",
        f"- {v.accepted} accepted by `.delay()`, {v.refused} refused ("
        + (", ".join(f"{n} {k}" for k, n in v.refusals.most_common()) or "none") + "); "
        f"{v.succeeded} SUCCESS and {v.failed_as_meant} FAILED as meant "
        f"(every {c.fail_every}th fails on purpose, retried once)",
        f"- faults: {_fault_counts(result.faults)}; first: {', '.join(result.faults[:4])}",
        f"- bodies run twice: {v.duplicates}, explained by a kill between a body's end and "
        f"its recorded completion: {v.duplicates_explained}; runs cut short by a kill: "
        f"{v.interrupted_runs}",
        "- journal: " + ", ".join(f"{k} {v.journal[k]}" for k in (
            "REAWARDED", "RETRYING", "WORKER_LOST", "RESENT", "SEND_FAILED", "DEFERRED")),
        *([] if result.journaled is None else [
            f"- awards written behind (bidding_award_journal): {result.journaled} went "
            "through the journal's stream"]),
        f"- took {result.seconds:.0f} s ({c.submit_seconds:.0f} s of submission at "
        f"{c.rate:g}/s; the last outcome {result.settle_seconds:.1f} s after it)",
        f"- protocol checker: {_protocol(result.protocol)}",
        *([] if not result.most_rows else [
            "- the store's largest row counts: " + ", ".join(
                f"{t.removeprefix('bidding_')} {n}" for t, n in result.most_rows.items()
                if t not in ("bytes", "overdue"))
            + (f"; its size at most {result.most_rows['bytes'] / 2**20:.1f} MiB"
               if "bytes" in result.most_rows else "")
            + f"; the retention job ran {result.prunes} time(s)"
            + (f"; at most {result.most_rows['overdue']} task(s) left"
               f" {overdue_after(c.retention_seconds):g} s after a prune could delete them"
               if "overdue" in result.most_rows else "")]),
        *([] if not result.memory else [
            f"- memory of the workers that lived {_lived(c) / 60:.0f} min or more past their "
            "two-minute warm-up (RSS, with their pool processes): " + "; ".join(
                f"{node} {first / 1024:.0f} -> {last / 1024:.0f} MiB ({growth:+.1f}%)"
                for node, _, first, last, growth in result.memory)]),
        f"- verdict: {'held' if v.ok else 'FAILED'}"
        + ("" if v.ok else f" ({len(v.problems)} problems)"),
    ]
    lines += [f"  - {p}" for p in v.problems[:50]]
    lines += [f"  - chaos error: {e}" for e in result.chaos_errors]
    return "\n".join(lines) + "\n"


def _protocol(protocol: CheckReport | None) -> str:
    if protocol is None:
        return "not run"
    if protocol.ok:
        return f"{protocol.tasks} task logs checked, every one keeps the protocol"
    rules = ", ".join(f"{rule} {n}" for rule, n in protocol.by_rule().items())
    return (f"{protocol.tasks} task logs checked, {len(protocol.violations)} violation(s) in "
            f"{len(protocol.offending())} ({rules})")


def _fault_counts(faults: list[str]) -> str:
    counts = Counter(f.split()[0] for f in faults)
    names = {"kill": "SIGKILL + restart", "broker": "broker restart", "store": "store restart",
             "sever": "severing of every store connection",
             "crash": "worker that exited on its own, started again"}
    return ", ".join(f"{n} {names.get(k, k)}" for k, n in counts.items()) or "none"


def main(argv: list[str] | None = None) -> int:
    """Command line: run one soak, print its report; exit 1 when the verdict fails."""
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = SoakConfig()
    for name, value in vars(defaults).items():
        kind = type(value) if value is not None else int
        parser.add_argument(f"--{name.replace('_', '-')}", type=kind, default=value)
    parser.add_argument("--folder", type=Path, default=None,
                        help="keep the logs and the run records here")
    args = vars(parser.parse_args(argv))
    folder = args.pop("folder")
    result = run(SoakConfig(**args), folder)
    print(report(result))
    return 0 if result.verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
