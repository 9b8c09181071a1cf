"""Fixtures of the unit tests that use a store: a SQLite file in tmp_path, or a new
PostgreSQL database (``settings``, both), no broker."""

from __future__ import annotations

import atexit
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from bidding.config import Settings
from bidding.store import dispose_all, upgrade
from bidding.store.engine import normalize_url
from bidding.store.migrate import forget_schema_checks
from tests.conftest import POSTGRES_URL, require


@pytest.fixture
def fresh_url(tmp_path) -> Iterator[str]:
    """URL of a SQLite file that does not exist yet; engines are closed afterwards."""
    yield f"sqlite:///{tmp_path / 'store.db'}"
    dispose_all()
    forget_schema_checks()


_templates: dict[str, str] = {}


def _sqlite_template() -> Path:
    """A SQLite store migrated to head once per test process: each test's store is a copy
    (a copy takes a millisecond; running every migration again took a tenth of a second, for
    hundreds of tests). The migrations themselves are tested on fresh stores (test_store)."""
    found = _templates.get("sqlite")
    if found is None:
        folder = tempfile.mkdtemp(prefix="bidding-template-")
        atexit.register(shutil.rmtree, folder, True)
        found = _templates["sqlite"] = str(Path(folder) / "store.db")
        upgrade(f"sqlite:///{found}")
        dispose_all()  # closed: the file holds everything (no WAL left beside it)
        forget_schema_checks()
    return Path(found)


@pytest.fixture
def store_url(fresh_url: str) -> str:
    """URL of a SQLite store migrated to head."""
    shutil.copyfile(_sqlite_template(), make_url(fresh_url).database or "")
    return fresh_url


def _postgres_template(admin: Any, server: Any) -> str:
    """A PostgreSQL database migrated to head once per test process, which each test's
    database is made from (``CREATE DATABASE ... TEMPLATE``: 50 ms, against 300 ms to run
    every migration again); dropped when the process ends."""
    found = _templates.get("postgresql")
    if found is None:
        name = f"bidding_ut_template_{uuid.uuid4().hex[:12]}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        upgrade(server.set(database=name).render_as_string(hide_password=False))
        dispose_all()  # a template must have no connection while it is copied
        forget_schema_checks()
        found = _templates["postgresql"] = name

        def drop() -> None:
            engine = create_engine(server, isolation_level="AUTOCOMMIT")
            with engine.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            engine.dispose()

        atexit.register(drop)
    return found


@contextmanager
def postgres_database() -> Iterator[str]:
    """A new, migrated PostgreSQL database, dropped afterwards: its URL (skipped, or failed
    under CI=true, when the server is not there)."""
    server = make_url(normalize_url(POSTGRES_URL))
    name = f"bidding_ut_{uuid.uuid4().hex[:12]}"
    admin = create_engine(server, isolation_level="AUTOCOMMIT")
    try:
        template = _postgres_template(admin, server)
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    except OperationalError as exc:
        admin.dispose()
        require("PostgreSQL", False, str(exc).splitlines()[0])
    url = server.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        dispose_all()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def settings(request: pytest.FixtureRequest, store_url: str) -> Iterator[Settings]:
    """A migrated store: the SQLite file of ``store_url``, or a new PostgreSQL database."""
    if request.param == "sqlite":
        yield Settings(database_url=store_url, auto_migrate=False)
        return
    with postgres_database() as url:
        yield Settings(database_url=url, auto_migrate=False)


def end_server_session(url: str, pid: int) -> None:
    """End the PostgreSQL server session ``pid`` (a restart, an administrator's
    ``pg_terminate_backend``), from a connection of its own: not the pool's, whose connection
    is the one to end."""
    admin = create_engine(normalize_url(url))
    try:
        with admin.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid})
            other.commit()
    finally:
        admin.dispose()


def psycopg_commands(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool]]:
    """psycopg's own commands (BEGIN, COMMIT, ROLLBACK) from now on, each with whether it was
    sent in a pipeline (with other statements, one round trip for all)."""
    from psycopg._connection_base import BaseConnection

    sent: list[tuple[str, bool]] = []
    original = BaseConnection._exec_command

    def _exec_command(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        sent.append((bytes(command).decode().split()[0], self._pipeline is not None))
        return original(self, command, *args, **kwargs)

    monkeypatch.setattr(BaseConnection, "_exec_command", _exec_command)
    return sent
