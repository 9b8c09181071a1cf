"""The soak's driver of faults: it SIGKILLs a random node worker every few seconds and starts
it again a second later under the same name (as systemd or Kubernetes would), and restarts
the broker and the store at set moments; every fault goes in its log with its time."""

from __future__ import annotations

import random
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import sqlalchemy as sa

from bench.common.log import log
from bench.common.redis_server import PrivateRedis


@dataclass
class Fault:
    """One fault the driver caused."""

    kind: str  # "kill", "broker", "store"
    at: float
    node: str = ""
    detail: str = ""


@dataclass
class Plan:
    """When the faults happen, in seconds from the start of the soak."""

    kill_every: float
    kills: int
    pause: float
    broker_at: list[float]
    broker_down: float
    store_at: list[float]
    store_down: float
    #: "server" restarts PostgreSQL itself (pg_ctlcluster, as root); "database" makes the
    #: soak's database refuse connections and ends the open ones (no other database is touched).
    store_mode: str
    #: Seconds between severings of every connection to the soak's database
    #: (``pg_terminate_backend``, new connections still accepted: what a failover, a PgBouncer
    #: restart or an idle timeout does to a pool); 0 = never.
    sever_every: float = 0.0
    #: Nodes never killed (a long soak measures their memory over the whole run).
    spare: tuple[str, ...] = ()


@dataclass
class Chaos:
    """Runs a :class:`Plan` in a thread against the federation, the broker and the store."""

    plan: Plan
    restart_node: Callable[[str, float], float]
    nodes: list[str]
    broker: PrivateRedis
    database_url: str
    admin_url: str
    seed: int = 0
    #: Starts a worker again if it exited on its own, as systemd's ``Restart=always`` or
    #: Kubernetes would (True when it did): a Celery worker can die of a broker restart
    #: ("Unrecoverable error" in kombu's Redis transport), and a supervisor is part of every
    #: production setup.
    revive: Callable[[str], bool] | None = None
    faults: list[Fault] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _severer: threading.Thread | None = None
    _supervisor: threading.Thread | None = None

    def start(self) -> None:
        """Start causing faults, on the plan's clock from now."""
        self._thread = threading.Thread(target=self._run, name="soak-chaos", daemon=True)
        self._thread.start()
        if self.plan.sever_every > 0:
            self._severer = threading.Thread(target=self._sever, name="soak-sever", daemon=True)
            self._severer.start()
        if self.revive is not None:
            self._supervisor = threading.Thread(target=self._supervise, name="soak-supervisor",
                                                daemon=True)
            self._supervisor.start()

    def stop(self) -> None:
        """Stop before the next fault, and wait for the current one to end."""
        self._stop.set()
        for thread in (self._thread, self._severer, self._supervisor):
            if thread is not None:
                thread.join(timeout=120)

    def severed(self) -> int:
        """How many connections the severer ended."""
        return sum(int(f.detail) for f in self.faults if f.kind == "sever")

    def _sever(self) -> None:
        """End every connection to the soak's database every ``sever_every`` seconds."""
        name = sa.engine.make_url(self.database_url).database
        admin = sa.create_engine(self.admin_url, isolation_level="AUTOCOMMIT",
                                 pool_pre_ping=True)
        try:
            while not self._stop.wait(self.plan.sever_every):
                try:
                    with admin.connect() as conn:
                        ended = conn.execute(sa.text(
                            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                            "WHERE datname = :name AND pid <> pg_backend_pid()"),
                            {"name": name}).scalar_one()
                    self.faults.append(Fault("sever", time.time(), detail=str(ended)))
                except Exception as exc:  # reported, and the next severing is tried
                    self.errors.append(f"sever: {type(exc).__name__}: {exc}")
        finally:
            admin.dispose()

    def kills(self) -> list[tuple[str, float]]:
        """(node, when) of every kill, and of every worker that died on its own."""
        return [(f.node, f.at) for f in self.faults if f.kind in ("kill", "crash")]

    def _supervise(self) -> None:
        """Start again, a second later, any worker that exited on its own."""
        assert self.revive is not None
        while not self._stop.wait(self.plan.pause):
            for node in self.nodes:
                try:
                    if self.revive(node):
                        self.faults.append(Fault("crash", time.time(), node))
                        log(f"chaos: {node} exited on its own; started again")
                except Exception as exc:
                    self.errors.append(f"revive {node}: {type(exc).__name__}: {exc}")

    def _schedule(self) -> list[tuple[float, str]]:
        events = [(self.plan.kill_every * (k + 1), "kill") for k in range(self.plan.kills)]
        events += [(at, "broker") for at in self.plan.broker_at]
        events += [(at, "store") for at in self.plan.store_at]
        return sorted(events)

    def _run(self) -> None:
        rng = random.Random(self.seed)
        start = time.monotonic()
        for offset, kind in self._schedule():
            if self._stop.wait(max(0.0, start + offset - time.monotonic())):
                return
            try:
                if kind == "kill":
                    node = rng.choice([n for n in self.nodes if n not in self.plan.spare]
                                      or self.nodes)
                    self.faults.append(Fault("kill", time.time(), node))
                    log(f"chaos: SIGKILL {node}, restarted {self.plan.pause:g}s later")
                    self.restart_node(node, self.plan.pause)
                elif kind == "broker":
                    self.faults.append(Fault("broker", time.time(),
                                             detail=f"down {self.plan.broker_down:g}s"))
                    log(f"chaos: broker restart ({self.plan.broker_down:g}s down)")
                    self.broker.restart(self.plan.broker_down)
                else:
                    self.faults.append(Fault("store", time.time(), detail=self.plan.store_mode))
                    log(f"chaos: store restart ({self.plan.store_mode})")
                    restart_store(self.plan.store_mode, self.database_url, self.admin_url,
                                  self.plan.store_down)
            except Exception as exc:  # a fault that could not be caused is reported, not fatal
                self.errors.append(f"{kind} at +{offset:g}s: {type(exc).__name__}: {exc}")
                log(f"chaos: {kind} failed: {exc}")


def restart_store(mode: str, database_url: str, admin_url: str, down: float) -> None:
    """Restart PostgreSQL (``server``), or take the soak's database away for ``down`` seconds
    (``database``)."""
    if mode == "server":
        version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[0]
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "stop",
                        "-m", "fast"], check=True, capture_output=True, timeout=60)
        time.sleep(down)
        subprocess.run(["pg_ctlcluster", "--skip-systemctl-redirect", version, "main",
                        "start"], check=True, capture_output=True, timeout=60)
        return
    name = sa.engine.make_url(database_url).database
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            conn.execute(sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                 "WHERE datname = :name AND pid <> pg_backend_pid()"),
                         {"name": name})
        time.sleep(down)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        admin.dispose()
