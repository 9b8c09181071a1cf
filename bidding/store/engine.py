"""Engines and sessions of the store, one set per process and URL.

Why this is more than ``create_engine``:
- a forked Celery child must not reuse its parent's pooled connections, so engines are keyed by
  process id and a child builds its own (``reset_after_fork`` runs in ``worker_process_init``);
- SQLite's deferred transactions fail with "database is locked" instead of waiting when two
  writers upgrade at once, so writes begin with ``BEGIN IMMEDIATE`` (they wait ``busy_timeout``)
  and the database runs in WAL mode, where readers never block writers;
- sessions hold the fork guard (``forkguard``), so that no pool process is forked while another
  thread is inside the SQLite library;
- a pooled PostgreSQL connection is checked without a round trip when it is handed out
  (``_check_on_checkout``): SQLAlchemy's ``pool_pre_ping`` cost one ``SELECT 1`` per session,
  a tenth of an auction's statements.
"""

from __future__ import annotations

import functools
import os
import random
import select
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DisconnectionError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import ConnectionPoolEntry, QueuePool

from bidding.config import db_pool_size, db_transaction_pooler
from bidding.store import clock as store_clock
from bidding.store.forkguard import child_safe_lock, guard

_WRITE_OPTION = "bidding_write"
#: Seconds to wait for a new PostgreSQL connection.
CONNECT_TIMEOUT = 10
#: A pooled server connection idle this long is pinged before use (a half-open connection
#: after a network cut says nothing until it is used; TCP keepalives catch it later).
PING_AFTER_IDLE = 30.0
#: Connections a process may open to a server store at a peak, beyond its pool's
#: ``bidding_db_pool_size``.
MAX_OVERFLOW = 10
_lock = child_safe_lock()
#: Jitter of reconnection pauses (its own generator: see nodes.periodic).
_jitter = random.Random()


@dataclass(frozen=True)
class _Engines:
    pid: int
    engine: Engine
    reader: sessionmaker[Session]
    writer: sessionmaker[Session]
    #: Reads in a transaction (on SQLite, the same as ``reader``).
    snapshot: sessionmaker[Session]
    #: The engine of ``reader`` (autocommit on a server store).
    plain: Engine


_engines: dict[str, _Engines] = {}


@functools.lru_cache(maxsize=64)
def normalize_url(url: str) -> str:
    """Make a URL explicit about its driver: ``postgresql://`` means psycopg 3 here."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    return u.render_as_string(hide_password=False)


def masked_url(url: str) -> str:
    """``url`` fit to print or log: its password, if any, replaced by ``***``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        # Not a URL SQLAlchemy can parse, so we cannot tell where a password would be.
        return "(unparsable database URL)"


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite store as given (maybe relative), or None (in memory, not SQLite)."""
    try:
        u = make_url(url)
    except ArgumentError:
        return None
    if u.get_backend_name() != "sqlite" or not u.database or u.database == ":memory:":
        return None
    return Path(u.database)


def store_label(url: str) -> str:
    """The store's URL fit to print (password masked), for messages that must say which store.

    A relative SQLite path is also shown resolved: it depends on the folder the command runs
    from, and a command run from the wrong folder reads (and creates) another, empty store.
    """
    shown = masked_url(url)
    path = sqlite_path(url)
    if path is not None and not path.is_absolute():
        shown += f" (= {path.resolve()})"
    return shown


@functools.lru_cache(maxsize=64)
def is_sqlite(url: str) -> bool:
    """True when the URL names a SQLite database."""
    return make_url(url).get_backend_name() == "sqlite"


def _build(url: str) -> _Engines:
    kwargs: dict[str, Any] = {"future": True}
    if is_sqlite(url):
        # Pooled per process (engines are rebuilt after a fork): reconnecting and re-running the
        # PRAGMAs for every session cost more than the query itself (bench/latency.py profile).
        kwargs["pool_size"] = 8
        kwargs["max_overflow"] = 16
        kwargs["connect_args"] = {"timeout": 30, "check_same_thread": False}
    else:
        # No pool_pre_ping: _check_on_checkout replaces it without a round trip.
        kwargs["pool_size"] = db_pool_size()
        kwargs["max_overflow"] = MAX_OVERFLOW
        # Last returned, first handed out: a process that needs one connection at a time
        # keeps using the same one, and those a burst opened go idle, so that ``store.trim``
        # can close them (each is a server process on PostgreSQL).
        kwargs["pool_use_lifo"] = True
        kwargs["poolclass"] = ClosingSlotsPool
        if make_url(url).get_driver_name() == "psycopg":
            # A server that vanished (a half-open connection after a network cut) must fail a
            # session within a minute, not block a node's sweeper or bid threads for ever:
            # a connect timeout, and TCP keepalives on every pooled connection.
            kwargs["connect_args"] = {"connect_timeout": CONNECT_TIMEOUT, "keepalives": 1,
                                      "keepalives_idle": 10, "keepalives_interval": 5,
                                      "keepalives_count": 3, **pooler_connect_args(url)}
    engine = create_engine(url, **kwargs)
    if is_sqlite(url):
        _configure_sqlite(engine)
    else:
        _check_on_checkout(engine)
    writer_engine = engine.execution_options(**{_WRITE_OPTION: True})
    # A server store's reads run without a transaction: psycopg sends BEGIN and the session's
    # end sends ROLLBACK, each a round trip of its own, so a one-statement read was three. In
    # READ COMMITTED each statement reads its own snapshot anyway, so nothing is lost (reads
    # never lock: the locking reads are in write sessions).
    reader_engine = engine if is_sqlite(url) else engine.execution_options(
        isolation_level="AUTOCOMMIT")
    return _Engines(
        pid=os.getpid(),
        engine=engine,
        reader=sessionmaker(bind=reader_engine, expire_on_commit=False),
        snapshot=sessionmaker(bind=engine, expire_on_commit=False),
        writer=sessionmaker(bind=writer_engine, expire_on_commit=False),
        plain=reader_engine,
    )


def pooler_connect_args(url: str) -> dict[str, Any]:
    """psycopg's connection options for ``url`` behind a transaction pooler
    (``bidding_db_transaction_pooler``): no server-side prepared statements. psycopg prepares
    a statement it has run five times on a connection; through PgBouncer in transaction mode
    the next transaction may run on another server connection, where the prepared statement
    does not exist."""
    if not db_transaction_pooler() or make_url(url).get_driver_name() != "psycopg":
        return {}
    return {"prepare_threshold": None}


#: The WAL's length, in pages, past which a SQLite commit checkpoints on its own (SQLite's
#: ``wal_autocheckpoint``; its default is 1,000). The sweeping node checkpoints as it sweeps
#: (``store.checkpoint``), so that the writes a caller waits on do not; this is above what the
#: fastest burst logs between two of its checkpoints (about 6,000 pages a second at 200
#: auctions a second, a pass every ``bidding_sweep_interval``, at most a second apart while
#: idle), and bounds the log (40 MB) when no node sweeps.
WAL_BACKSTOP_FRAMES = 10_000


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let us emit BEGIN ourselves (pysqlite's implicit BEGIN is always DEFERRED).
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=30000")
        # The sweeping node checkpoints (``store.checkpoint``); a commit only past this.
        cur.execute(f"PRAGMA wal_autocheckpoint={WAL_BACKSTOP_FRAMES}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        if conn.get_execution_options().get(_WRITE_OPTION, False):
            _begin_immediate(conn.connection.dbapi_connection)
        else:
            conn.exec_driver_sql("BEGIN")


#: A pooled connection's ``info`` key: when it was last returned to the pool (monotonic).
IDLE_SINCE = "bidding_idle_since"
class _Looking(threading.local):
    #: Set in a thread whose checkouts only look at the pool's idle connections
    #: (``store.trim``): they are neither pinged nor marked as in use.
    on = False


_looking = _Looking()


class ClosingSlotsPool(QueuePool):
    """A ``QueuePool`` that lets a slot go when its connection has been closed.

    QueuePool keeps a slot whose connection was invalidated (a disconnect, or ``store.trim``
    closing it) and opens a new connection in it the next time it is handed out. Here such a
    slot leaves the pool instead (as a connection beyond the pool's size does on return), so
    that the idle connections ``trim`` looks at are all live ones, and the next peak opens a
    new slot as it would have reopened the old one.
    """

    def _do_return_conn(self, record: ConnectionPoolEntry) -> None:
        if record.dbapi_connection is None:
            try:
                record.close()
            finally:
                self._dec_overflow()
            return
        super()._do_return_conn(record)


class WouldConnect(Exception):
    """A checkout ``looking_at_idle`` met a pooled slot without a connection: it opens none."""


@contextmanager
def looking_at_idle() -> Iterator[None]:
    """Check connections out of a pool and back in without the checkout's liveness ping,
    their ``IDLE_SINCE`` unchanged (a look is not a use), and never opening one
    (``WouldConnect`` instead): for ``store.trim``, which closes most of the ones it takes."""
    _looking.on = True
    try:
        yield
    finally:
        _looking.on = False


def _check_on_checkout(engine: Engine) -> None:
    """Hand out only live connections, without a round trip in the usual case.

    A server that restarts or ends a session tells its idle clients (a termination notice,
    then end of file), so a pooled connection whose socket has something to read is suspect:
    it is pinged, and replaced if the ping fails (``DisconnectionError`` makes the pool try
    another). So is one idle longer than ``PING_AFTER_IDLE``. Any other is handed out as is;
    one that fails anyway raises on its first statement, and the writes that must not fail
    outlast it (``store.outage``).
    """

    @event.listens_for(engine, "do_connect")
    def _on_connect(*_args: Any) -> None:
        if _looking.on:
            raise WouldConnect("looking at idle connections only")

    @event.listens_for(engine, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        if not _looking.on:
            record.info[IDLE_SINCE] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        if _looking.on:
            return
        since = record.info.pop(IDLE_SINCE, None)
        if since is None:
            return  # a new connection
        if time.monotonic() - since < PING_AFTER_IDLE and not _has_news(dbapi_connection):
            return
        try:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute("SELECT 1")
            finally:
                cursor.close()
            dbapi_connection.rollback()  # end the ping's transaction: a clean checkout
        except Exception as exc:
            raise DisconnectionError(f"pooled connection is gone: {exc}") from exc


def _has_news(dbapi_connection: Any) -> bool:
    """Whether an idle connection's socket has anything to read (it should have nothing)."""
    try:
        fileno = dbapi_connection.fileno()
    except Exception:
        return True  # closed, or a driver without fileno(): ping it
    try:
        readable, _, _ = select.select([fileno], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


#: Seconds a SQLite writer waits for the write lock before "database is locked" (the writes
#: that must not fail then wait again: ``store.outage``).
WRITE_LOCK_WAIT = 30.0


def _begin_immediate(dbapi_connection: Any) -> None:
    """Take SQLite's write lock, polling finely.

    SQLite's own busy handler sleeps 1, 2, 5, 10 ... 100 ms between tries, so a writer often
    sleeps far longer than the ~1 ms the lock is held; under a dozen concurrent bid writers that
    was most of an auction's time (bench/latency.py). Here the handler is off for this one
    statement and we retry every 0.2-2 ms with jitter.
    """
    deadline = time.monotonic() + WRITE_LOCK_WAIT
    pause = 0.0002
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA busy_timeout=0")
        while True:
            try:
                cursor.execute("BEGIN IMMEDIATE")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() > deadline:
                    raise
                time.sleep(pause * (0.5 + _jitter.random()))
                pause = min(pause * 1.5, 0.002)
    finally:
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()


def engines(url: str) -> _Engines:
    """The engines of ``url`` for this process, built on first use (and again after a fork);
    the federation's clock (``bidding.clock``) kept on this store's."""
    key = normalize_url(url)
    found = _engines.get(key)
    if found is None or found.pid != os.getpid():
        found = _engines_of(key)
    store_clock.keep_current(key, found.plain, local=is_sqlite(key))
    return found


def _engines_of(key: str) -> _Engines:
    found = _engines.get(key)
    if found is not None and found.pid == os.getpid():
        return found
    with _lock:
        found = _engines.get(key)
        if found is None or found.pid != os.getpid():
            if found is not None:
                # Inherited from the parent: drop the pool without closing the parent's sockets.
                found.engine.dispose(close=False)
            found = _build(key)
            _engines[key] = found
        return found


def keep_clock(url: str) -> None:
    """Read the clock of the store at ``url`` if this process has not yet, or is due to, so
    that ``bidding.clock.now()`` is that store's time (it is kept so by every session too)."""
    engines(url)


def get_engine(url: str) -> Engine:
    """The process's engine for ``url``."""
    return engines(url).engine


@contextmanager
def read_session(url: str, *, in_transaction: bool = False) -> Iterator[Session]:
    """A session for reads; it never takes SQLite's write lock.

    On PostgreSQL its statements run outside a transaction (each reads its own snapshot, as
    in READ COMMITTED anyway), which saves the BEGIN's and the ROLLBACK's round trips.
    ``in_transaction``: in one, for a server-side cursor (``yield_per``), which needs one.
    """
    found = engines(url)
    with guard.inside(), (found.snapshot if in_transaction else found.reader)() as session:
        yield session


@contextmanager
def statement_session(url: str) -> Iterator[Session]:
    """A session on a server store whose every statement commits on its own: for a write that
    is one statement (a data-modifying ``WITH``), one round trip instead of a transaction's
    BEGIN, statement and COMMIT. Not for SQLite, whose writes take its lock in a transaction
    (ValueError)."""
    if is_sqlite(url):
        raise ValueError("statement_session: SQLite writes run in write_session")
    # The engines (and the clock's reading, which takes the clock's lock and then the guard)
    # before the guard: never the guard, then the clock's lock.
    found = engines(url)
    with guard.inside(), found.reader() as session:
        yield session


@contextmanager
def write_session(url: str) -> Iterator[Session]:
    """A session whose transaction is committed on success and rolled back on error."""
    found = engines(url)  # before the guard, as in statement_session
    with guard.inside(), found.writer() as session, session.begin():
        yield session


def reset_after_fork() -> None:
    """Forget engines inherited from a parent process (call in ``worker_process_init``)."""
    with _lock:
        for found in _engines.values():
            if found.pid != os.getpid():
                found.engine.dispose(close=False)
        _engines.clear()


def dispose_all() -> None:
    """Close every engine of this process (tests and clean shutdowns)."""
    with _lock:
        for found in _engines.values():
            if found.pid == os.getpid():
                found.engine.dispose()
        _engines.clear()


def core(session: Session) -> Connection:
    """The connection of ``session``'s transaction, for the hot paths' prebuilt statements.

    ``Session.execute`` of a select on mapped columns runs the ORM's compile and result
    machinery, about 40 us a statement more than the connection does (bench/latency.py counts
    a dozen statements per auction). Objects the session holds unflushed are flushed first, as
    that statement's autoflush would have done.
    """
    if session.autoflush:
        session.flush()
    return session.connection()
