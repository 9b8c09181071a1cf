"""SQLite's WAL checkpoints: taken by the sweeping node, not by the writes a caller waits on."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import text

from bidding.auction import sweeper
from bidding.config import Settings
from bidding.context import Context
from bidding.store import checkpoint as wal
from bidding.store import read_session, write_session
from bidding.store.engine import WAL_BACKSTOP_FRAMES, get_engine, sqlite_path
from tests.sqlite_alone import database_file_alone


def _write_rows(url: str, rows: int) -> None:
    with write_session(url) as session:
        session.execute(text("CREATE TABLE IF NOT EXISTS filler (blob BLOB)"))
    for _ in range(rows):
        with write_session(url) as session:
            session.execute(text("INSERT INTO filler VALUES (randomblob(3000))"))


def _rows_in_the_database_file(url: str, tmp_path: Path) -> int:
    """The filler rows a reader finds in the store's database file alone (its log left out):
    only what a checkpoint has copied there."""
    with database_file_alone(url, tmp_path) as conn:
        try:
            return int(conn.execute("SELECT count(*) FROM filler").fetchone()[0])
        except sqlite3.OperationalError:  # no such table: not copied yet
            return 0


def test_the_stores_connections_checkpoint_only_past_the_backstop(store_url: str) -> None:
    # given a SQLite store's connection, as every session gets it
    with get_engine(store_url).connect() as conn:
        # then a commit checkpoints only once the log is past the backstop, not SQLite's 1,000
        assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == WAL_BACKSTOP_FRAMES
    assert WAL_BACKSTOP_FRAMES > 1000


def test_writes_leave_their_pages_in_the_log_until_a_checkpoint_copies_them(
    store_url: str, tmp_path: Path,
) -> None:
    # given a store written to 400 times (about 1,200 pages of log: past SQLite's own
    # threshold, which would have checkpointed in one of these commits)
    wal.checkpoint(store_url)
    _write_rows(store_url, 400)
    # then the database file alone does not have them yet: no write checkpointed
    assert _rows_in_the_database_file(store_url, tmp_path) == 0
    # when the sweeper's checkpoint runs
    logged = wal.checkpoint(store_url)
    # then the database file has every row
    assert logged > 1000
    assert _rows_in_the_database_file(store_url, tmp_path) == 400


def test_a_checkpoint_with_nothing_new_logged_runs_no_statement(
    store_url: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a store whose log was just checkpointed
    _write_rows(store_url, 3)
    assert wal.checkpoint(store_url) > 0
    # when the next pass comes with nothing written since
    engine = get_engine(store_url)
    monkeypatch.setattr(engine, "raw_connection",
                        lambda: pytest.fail("a checkpoint with nothing new took a connection"))
    # then it copies nothing and does not touch the store
    assert wal.checkpoint(store_url) == 0


def test_a_checkpoint_does_not_wait_for_a_reader_and_the_next_copies_the_rest(
    store_url: str, tmp_path: Path,
) -> None:
    # given a reader holding a snapshot from before 20 more writes
    _write_rows(store_url, 5)
    wal.checkpoint(store_url)
    reading, done = threading.Event(), threading.Event()

    def reader() -> None:
        with read_session(store_url) as session:
            session.execute(text("SELECT count(*) FROM filler")).scalar()
            reading.set()
            done.wait(10)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        assert reading.wait(10)
        _write_rows(store_url, 20)
        # when a checkpoint runs while it reads
        wal.checkpoint(store_url)
        # then it returned without waiting, and could not copy what the reader may still need
        assert _rows_in_the_database_file(store_url, tmp_path) == 5
    finally:
        done.set()
        thread.join()
    # and once the reader is done, the next pass copies the rest, with nothing written since
    # (and counts no page twice: none was logged since the first)
    assert wal.checkpoint(store_url) == 0
    assert _rows_in_the_database_file(store_url, tmp_path) == 25


def test_a_store_opened_through_a_link_is_checkpointed_beside_its_target(
    store_url: str, tmp_path: Path,
) -> None:
    # given a store whose URL names a symbolic link to its file (a mounted volume, say)
    target = sqlite_path(store_url)
    assert target is not None
    link = tmp_path / "linked" / "store.db"
    link.parent.mkdir()
    link.symlink_to(target)
    linked = f"sqlite:///{link}"
    _write_rows(linked, 400)
    # when the sweeper's checkpoint runs on that URL
    # then it found the log beside the target, and copied it
    assert wal.checkpoint(linked) > 1000
    assert _rows_in_the_database_file(store_url, tmp_path) == 400


def test_the_sweepers_checkpoint_phase_runs_on_sqlite_alone() -> None:
    # given a PostgreSQL store (nothing is connected to)
    url = "postgresql+psycopg://nobody@127.0.0.1:1/none"
    ctx = Context(Settings(database_url=url), Celery("c", set_as_current=False))
    # when the sweeper's checkpoint phase runs, then it does nothing and found nothing
    assert sweeper.checkpoint_wal(ctx) == 0
    # and a sweeper on PostgreSQL has no checkpoint loop (no thread waking for nothing),
    # one on SQLite has
    on_postgresql = sweeper.Sweeper(ctx.settings, ctx.app, holder="n@host")
    assert "checkpoint_wal" not in on_postgresql.phases
    assert "bidding-sweeper-checkpoint_wal" not in {loop.name for loop in on_postgresql.loops}
    on_sqlite = sweeper.Sweeper(Settings(database_url="sqlite:////nowhere/store.db"), ctx.app,
                                holder="n@host")
    assert "bidding-sweeper-checkpoint_wal" in {loop.name for loop in on_sqlite.loops}


def test_the_sweepers_phase_idles_on_a_few_heartbeats_and_keeps_pace_with_a_burst(
    store_url: str,
) -> None:
    ctx = Context(Settings(database_url=store_url), Celery("c", set_as_current=False))
    sweeper.checkpoint_wal(ctx)
    # given a store that logged a few writes since the last pass (an idle federation's beats)
    _write_rows(store_url, 5)
    # when the phase runs, then it checkpoints them and counts as a pass that found nothing
    assert sweeper.checkpoint_wal(ctx) == 0
    # given a burst's worth of writes since
    _write_rows(store_url, 400)
    # then the pass says it found work (the phase keeps the sweep interval)
    assert sweeper.checkpoint_wal(ctx) >= sweeper.BUSY_LOG_PAGES
    # and no write was lost on the way
    with read_session(store_url) as session:
        assert session.execute(text("SELECT count(*) FROM filler")).scalar() == 405
