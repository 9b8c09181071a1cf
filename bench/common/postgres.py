"""A scratch PostgreSQL database for one benchmark run, dropped afterwards."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator

import sqlalchemy as sa

#: The local PostgreSQL server the tests and benchmarks use by default.
LOCAL_SERVER = os.environ.get("BIDDING_TEST_POSTGRES",
                              "postgresql+psycopg://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str) -> Iterator[str]:
    """A new, empty database ``<prefix>_<hex>`` on ``server_url``'s server; yields its URL.

    It is dropped on exit (``WITH (FORCE)``: a worker the benchmark failed to stop must not
    keep it alive), after the process's own engines are disposed of.
    """
    # Imported here: bench/latency.py puts the benchmarked bidding on sys.path after start-up.
    from bidding.store.engine import dispose_all, normalize_url

    admin_url = sa.engine.make_url(normalize_url(server_url))
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    # pool_pre_ping: the soak restarts the server, and the drop must not use a dead connection.
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT", pool_pre_ping=True)
    with admin.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        dispose_all()
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextlib.contextmanager
def scratch_store(store: str, prefix: str) -> Iterator[str]:
    """A fresh store for one run: ``"sqlite"`` (a file in a temporary folder), ``"postgres"``
    (a scratch database on the local server) or a PostgreSQL server URL; yields its URL."""
    if store == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/{prefix}.db"
        return
    with scratch_database(LOCAL_SERVER if store in ("postgres", "postgresql") else store,
                          prefix) as url:
        yield url
