"""Writes that must not fail wait out a busy SQLite store, as they wait out a server store
that restarts (``store.outage.outlasting``): many node workers starting at once on one
SQLite file can hold its write lock longer than a writer waits for it."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from bidding.store import engine, read_session, write_session
from bidding.store.outage import outlasting


def _lock_for(path: Path, seconds: float) -> threading.Thread:
    """Another process's writer: holds the file's write lock for ``seconds``."""
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    released = threading.Timer(seconds, lambda: (holder.execute("COMMIT"), holder.close()))
    released.start()
    return released


def test_a_write_that_finds_the_sqlite_store_locked_is_tried_again_until_it_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a SQLite store whose write lock another writer holds for 0.6 s, and writers that
    # wait 0.1 s for it (30 s by default: as if a crowd of writers had used that up)
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    with write_session(url) as session:
        session.execute(text("CREATE TABLE beats (n INTEGER)"))
    monkeypatch.setattr(engine, "WRITE_LOCK_WAIT", 0.1)
    released = _lock_for(path, 0.6)
    tries: list[int] = []

    def write() -> None:
        tries.append(1)
        with write_session(url) as session:
            session.execute(text("INSERT INTO beats VALUES (1)"))

    # When the write must not fail (a registration, a heartbeat, an attempt's result)
    outlasting(url, "a heartbeat", write, patience=10)

    # Then it was tried again after "database is locked" and landed once
    released.join()
    assert len(tries) > 1
    with read_session(url) as session:
        assert session.execute(text("SELECT count(*) FROM beats")).scalar_one() == 1
    engine.dispose_all()


def test_any_other_sqlite_error_is_raised_at_once(tmp_path: Path) -> None:
    # Given a write that is wrong, not unlucky (its table does not exist)
    url = f"sqlite:///{tmp_path}/store.db"
    engine = create_engine(url)
    tries: list[int] = []

    def write() -> None:
        tries.append(1)
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO missing VALUES (1)"))

    # When it is written through outlasting, Then its error is raised after one try
    with pytest.raises(Exception, match="no such table"):
        outlasting(url, "a write", write, patience=10)
    assert len(tries) == 1
    engine.dispose()


def test_a_restarted_worker_hands_on_its_predecessor_despite_a_dropped_connection(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a worker restarted under its name, whose handling of the earlier incarnation (its
    # lost attempts, its finished tasks' results for the backend) meets a store connection
    # severed mid-transaction once: nothing else would hand those on, the row being taken
    from sqlalchemy.exc import OperationalError

    import bidding.app as app_module
    import bidding.auction.watchdog as watchdog
    from bidding.config import Settings
    from bidding.nodes.incarnation import Ended

    calls: list[Ended] = []

    def severed_once(_settings: Settings, earlier: Ended, _now: float) -> None:
        calls.append(earlier)
        if len(calls) == 1:
            raise OperationalError("UPDATE bidding_announcements ...", {},
                                   Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(watchdog, "_hand_on", severed_once)
    earlier = Ended("soak-3@vm", "soak-3", "b1", 1000.0, 1010.0, "restarted")
    settings = Settings(database_url="postgresql://bidding@127.0.0.1/bidding")

    # When the restarted worker handles it
    app_module._handle_ended(settings, earlier)

    # Then it tried again on a fresh connection and the handling ran through
    assert calls == [earlier, earlier]
