"""Schema migrations (Alembic), run programmatically and safely from many processes at once.

Several node workers may start together on a fresh database; a file lock (SQLite) or an
advisory lock (PostgreSQL) makes one of them migrate while the others wait.
"""

from __future__ import annotations

import fcntl
import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text
from sqlalchemy.engine import make_url

from bidding.errors import ConfigurationError
from bidding.store.engine import get_engine, is_sqlite, normalize_url, sqlite_path, store_label
from bidding.store.forkguard import child_safe_lock, guard

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_ADVISORY_KEY = 7_404_119_005  # any constant shared by every process of this product
_done: set[str] = set()
_done_lock = child_safe_lock()


def alembic_config() -> Config:
    """An Alembic config pointing at the bundled migrations."""
    # Alembic is imported here, when a store is migrated, not by every process that only
    # checks that its store is current: it is about 10 MB of a node worker's memory.
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


_REVISION = re.compile(r"^(down_)?revision\s*=\s*['\"]([^'\"]*)['\"]", re.M)


@functools.cache
def head_revision() -> str:
    """The newest revision of the bundled migrations: the one no other revises (they form
    one chain), read from the migration files without importing Alembic."""
    revisions: set[str] = set()
    revised: set[str] = set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        for down, value in _REVISION.findall(path.read_text()):
            (revised if down else revisions).add(value)
    heads = revisions - revised
    if len(heads) != 1:
        raise RuntimeError(f"the bundled migrations have {len(heads)} heads: {sorted(heads)}")
    return heads.pop()


def current_revision(conn: Connection) -> str | None:
    """The revision the database is at, or None when it has never been migrated (Alembic's
    own table, read directly)."""
    if not inspect(conn).has_table("alembic_version"):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


@contextmanager
def _migration_lock(url: str) -> Iterator[None]:
    if is_sqlite(url):
        database = make_url(url).database
        if not database or database == ":memory:":
            yield
            return
        lock_path = Path(database).with_suffix(Path(database).suffix + ".migrate-lock")
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        with lock_path.open("a") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        return
    # A transaction's lock, held until this connection's transaction ends: behind a pooler in
    # transaction mode the transaction keeps one server connection, and a migrator killed
    # mid-way releases it with its transaction (a session's lock would stay on the pooled
    # server connection, and every later migration would wait for it for ever).
    with get_engine(url).connect() as conn:
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _ADVISORY_KEY})
        try:
            yield
        finally:
            conn.rollback()


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (creates the file of a new SQLite store);
    a store already at the head costs one read."""
    url = normalize_url(url)
    if is_sqlite(url):
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
    if revision == "head":
        with guard.inside(), get_engine(url).connect() as conn:
            if current_revision(conn) == head_revision():
                # Alembic is loaded only to migrate: a node worker starting on a current
                # store has no other use for it (about 10 MB of its memory).
                return
    from alembic import command

    with guard.inside(), _migration_lock(url), get_engine(url).begin() as conn:
        cfg = alembic_config()
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def ensure_schema(url: str) -> None:
    """Migrate to head once per process, cheaply when the schema is already current."""
    key = normalize_url(url)
    if key in _done:
        return
    with _done_lock:
        if key in _done:
            return
        path = sqlite_path(key)
        if path is not None and not path.parent.is_dir():
            # SQLite would fail with "unable to open database file", which names neither the
            # store nor the path; creating the folder (as `upgrade` does) would hide a wrong URL.
            raise ConfigurationError(
                f"store {store_label(url)}: folder {path.parent.resolve()} does not exist"
            )
        with guard.inside(), get_engine(key).connect() as conn:
            current = current_revision(conn)
        if current != head_revision():
            upgrade(key)
        _done.add(key)


def forget_schema_checks() -> None:
    """Make the next ``ensure_schema`` look again (tests that drop databases)."""
    with _done_lock:
        _done.clear()
