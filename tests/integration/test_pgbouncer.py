"""A federation whose store is reached through PgBouncer in transaction mode, through real
worker processes.

PgBouncer (Debian's package) runs as a process of the test's own, in front of the PostgreSQL
server the other tests use, with ``pool_mode = transaction`` and four server connections for
the federation's database. The nodes and this process run with
``bidding_db_transaction_pooler`` on, as the deployment guide says to: no server-side prepared
statements. What is shown: the schema is migrated through it, tasks run and retry through it,
and the server holds no more connections than the pool's four while the nodes hold many more
client connections to PgBouncer.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from bench.common.redis_server import free_port
from bidding.store.engine import dispose_all
from tests.conftest import POSTGRES_URL, require
from tests.integration.app import failing, shared, slow
from tests.integration.conftest import (
    NODES,
    Cluster,
    _postgres_database,
    running_cluster,
    wait_for,
)

pytestmark = pytest.mark.integration

#: Server connections PgBouncer may open for the federation's database.
POOL = 4


@dataclass
class Bouncer:
    """A PgBouncer process of this module's own."""

    port: int
    log: Path
    #: The command that starts it with its configuration.
    command: list[str]
    process: subprocess.Popen[bytes] | None = None

    def answers(self) -> bool:
        """Whether a query through it gets its answer now."""
        engine = sa.create_engine(self.url(POSTGRES_URL), poolclass=sa.NullPool,
                                  connect_args={"prepare_threshold": None, "connect_timeout": 2})
        try:
            with engine.connect() as conn:
                return conn.execute(sa.text("SELECT 1")).scalar() == 1
        except sa.exc.OperationalError:
            return False

    def stop(self) -> None:
        """Shut it down (SIGINT: at once, every client connection dropped)."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def start(self) -> None:
        """Start it (again) on its port with its configuration, and wait until it answers."""
        with (self.log.parent / "output.txt").open("ab") as output:
            process = subprocess.Popen(self.command, stdout=output, stderr=subprocess.STDOUT)
        self.process = process
        if not wait_for(lambda: process.poll() is None and self.answers(), timeout=15):
            process.kill()
            text = "".join(p.read_text() for p in (self.log, self.log.parent / "output.txt")
                           if p.exists())
            shutil.rmtree(self.log.parent, ignore_errors=True)
            pytest.fail(f"PgBouncer did not start (exit {process.poll()}):\n"
                        f"{text[-2000:]}")

    def url(self, database_url: str) -> str:
        """``database_url`` (on the PostgreSQL server) through this PgBouncer."""
        return sa.engine.make_url(database_url).set(
            host="127.0.0.1", port=self.port).render_as_string(False)

    def clients(self, database: str) -> int:
        """Client connections PgBouncer holds for ``database`` (its console's SHOW CLIENTS)."""
        import psycopg

        server = sa.engine.make_url(POSTGRES_URL)
        # The console answers its own commands only (SQLAlchemy's first query would be refused).
        with psycopg.connect(host="127.0.0.1", port=self.port, dbname="pgbouncer",
                             user=server.username, autocommit=True,
                             prepare_threshold=None) as conn:
            cursor = conn.execute("SHOW CLIENTS")
            columns = [c.name for c in cursor.description or ()]
            rows = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
        return sum(1 for r in rows if r["database"] == database)


def start_bouncer() -> Bouncer:
    """PgBouncer in transaction mode on a free port, in front of POSTGRES_URL's server; its
    files in a folder of its own under the system's temporary folder (run as root, PgBouncer
    drops to the postgres user, who cannot enter pytest's private folders)."""
    binary = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if Path(p).exists()), None)
    require("PgBouncer", binary is not None,
            "no pgbouncer binary (Debian's package: apt-get install pgbouncer)")
    assert binary is not None
    server = sa.engine.make_url(POSTGRES_URL)
    port = free_port()
    directory = Path(tempfile.mkdtemp(prefix="bidding-pgbouncer-"))
    directory.chmod(0o777)
    (directory / "users.txt").write_text(f'"{server.username}" ""\n')
    settings = [
        "[databases]",
        f"* = host={server.host} port={server.port or 5432}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = trust",
        f"auth_file = {directory / 'users.txt'}",
        f"admin_users = {server.username}",
        "pool_mode = transaction",
        f"default_pool_size = {POOL}",
        "max_client_conn = 1000",
        f"logfile = {directory / 'pgbouncer.log'}",
        # psycopg sends these at connect; PgBouncer refuses unknown startup parameters.
        "ignore_startup_parameters = extra_float_digits,options",
    ]
    if os.geteuid() == 0:
        # PgBouncer refuses to run as root.
        settings.append("user = postgres")
    ini = directory / "pgbouncer.ini"
    ini.write_text("\n".join(settings) + "\n")
    bouncer = Bouncer(port, directory / "pgbouncer.log", [binary, str(ini)])
    bouncer.start()
    return bouncer


@pytest.fixture(scope="module")
def pooled_cluster(tmp_path_factory: pytest.TempPathFactory,
                   redis_broker: str) -> Iterator[tuple[Cluster, Bouncer, str]]:
    databases = _postgres_database()
    direct = next(databases)
    bouncer: Bouncer | None = None
    try:
        bouncer = start_bouncer()
        with running_cluster(bouncer.url(direct), tmp_path_factory.mktemp("pooled"),
                             "postgresql",
                             extra_env={"BIDDING_DB_TRANSACTION_POOLER": "true"}) as cluster:
            yield cluster, bouncer, direct
    finally:
        dispose_all()
        if bouncer is not None:
            bouncer.stop()
            shutil.rmtree(bouncer.log.parent, ignore_errors=True)
        for _ in databases:  # drops the database (also when PgBouncer did not start)
            pass


def server_connections(direct: str) -> int:
    """Connections the PostgreSQL server holds to ``direct``'s database."""
    name = sa.engine.make_url(direct).database
    admin = sa.create_engine(POSTGRES_URL, poolclass=sa.NullPool)
    with admin.connect() as conn:
        return int(conn.execute(sa.text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = :d"), {"d": name}).scalar())


def test_tasks_run_and_retry_through_pgbouncer_in_transaction_mode(
    pooled_cluster: tuple[Cluster, Bouncer, str],
) -> None:
    cluster, bouncer, direct = pooled_cluster
    # given three nodes whose store (migrated through PgBouncer) is reached only through it
    # when 40 tasks are called at once, and one that fails and is retried
    results = [shared.delay(i) for i in range(40)]
    retried = failing.apply_async(("pooled",), bidding={"retry_policy": {
        "max_retries": 1, "backoff": "fixed", "base_ms": 0}})
    # then every task returns its value (each auction ran more than five statements of the
    # same text on its connections, which psycopg would have prepared)
    assert [r.get(timeout=90)["value"] for r in results] == list(range(40))
    # and the failing one ends with its own error after its retry
    with pytest.raises(Exception, match="pooled"):
        retried.get(timeout=60)
    # (after two attempts: its first and its one retry)
    assert int(cluster.counters.get(f"exec:{retried.id}") or 0) == 2
    # and the server holds at most the pool's connections, while the nodes hold more
    # connections to PgBouncer than that
    name = sa.engine.make_url(direct).database
    assert server_connections(direct) <= POOL
    assert bouncer.clients(name) > POOL
    # and neither PgBouncer nor a node logged a prepared-statement error
    logs = bouncer.log.read_text() + "".join(cluster.federation.tail(n, 5000) for n in NODES)
    assert "prepared statement" not in logs


def test_tasks_running_while_pgbouncer_restarts_finish_once(
    pooled_cluster: tuple[Cluster, Bouncer, str],
) -> None:
    cluster, bouncer, _ = pooled_cluster
    # given three 2 s tasks running on the nodes
    key = f"bounce-{uuid.uuid4().hex[:8]}"
    running = [slow.apply_async((f"{key}-{i}", 2.0)) for i in range(3)]
    assert wait_for(lambda: all(int(cluster.counters.get(f"started:{key}-{i}") or 0) == 1
                                for i in range(3)), timeout=30)
    # when PgBouncer restarts under them (every store connection of every node dropped, the
    # store unreachable for 2 s), and tasks are called right after it is back
    bouncer.stop()
    time.sleep(2.0)
    bouncer.start()
    after = [shared.delay(i) for i in range(10)]
    # then the running ones finish and reach their callers, each having run once
    assert all(r.get(timeout=90)["node"] in NODES for r in running)
    assert [int(cluster.counters.get(f"started:{key}-{i}") or 0) for i in range(3)] == [1, 1, 1]
    # and the new ones run too
    assert [r.get(timeout=90)["value"] for r in after] == list(range(10))
