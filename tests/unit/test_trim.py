"""A quiet process gives back the store connections a burst opened: on PostgreSQL the pool
keeps the connection it used last and closes those unused for a while (``store.trim``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from bidding.store import read_session, trim
from bidding.store.engine import get_engine
from tests.unit.conftest import postgres_database


@pytest.fixture
def pg_url() -> Iterator[str]:
    with postgres_database() as url:
        yield url


def _backend_pid(url: str) -> int:
    with read_session(url) as session:
        return int(session.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _open_together(url: str, n: int) -> list[int]:
    """``n`` threads each holding a store connection at the same moment: the burst that grows
    a pool. Returns their server processes."""
    barrier = threading.Barrier(n)
    pids: list[int] = []

    def hold() -> None:
        with read_session(url) as session:
            pids.append(int(session.execute(text("SELECT pg_backend_pid()")).scalar_one()))
            barrier.wait(10)

    threads = [threading.Thread(target=hold) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return pids


def _alive(url: str, pids: list[int]) -> set[int]:
    """Which of ``pids`` the server still runs (read from a connection of its own)."""
    admin = create_engine(url)
    try:
        with admin.connect() as conn:
            rows = conn.execute(text("SELECT pid FROM pg_stat_activity")).scalars().all()
    finally:
        admin.dispose()
    return {p for p in pids if p in rows}


def _alive_at_last(url: str, pids: list[int], expected: set[int]) -> set[int]:
    """``_alive``, read again for up to 5 s until it is ``expected``: a server process whose
    client closed its connection exits a moment later, not at once (a loaded machine saw one
    still listed)."""
    deadline = time.monotonic() + 5.0
    found = _alive(url, pids)
    while found != expected and time.monotonic() < deadline:
        time.sleep(0.05)
        found = _alive(url, pids)
    return found


def test_connections_unused_for_a_while_are_closed_down_to_the_one_used_last(
    pg_url: str,
) -> None:
    # Given a process whose threads once held three store connections at the same moment
    pids = _open_together(pg_url, 3)
    assert len(set(pids)) == 3 and _alive(pg_url, pids) == set(pids)
    # and which then used one at a time (the pool hands out the one returned last)
    used_last = _backend_pid(pg_url)
    assert _backend_pid(pg_url) == used_last

    # When it trims connections unused for 0 s (the node's default waits a minute)
    closed = trim.trim_idle(pg_url, after=0.0)

    # Then two were closed on the server and the one used last is the one still open
    assert closed == 2
    assert _alive_at_last(pg_url, pids, {used_last}) == {used_last}
    # and the store still answers, on that connection, and a new burst opens what it needs
    assert _backend_pid(pg_url) == used_last
    assert len(set(_open_together(pg_url, 3))) == 3


def test_connections_used_within_the_idle_time_are_kept(pg_url: str) -> None:
    # Given a pool grown to three connections by a burst a moment ago
    pids = _open_together(pg_url, 3)

    # When the heartbeat's trim looks at it with the default idle time (a minute)
    closed = trim.trim_idle(pg_url)

    # Then nothing is closed, and a second trim in a row (twice per beat) opens nothing
    assert closed == 0
    assert _alive(pg_url, pids) == set(pids)
    assert trim.trim_idle(pg_url, after=0.0) == 2
    before = get_engine(pg_url).pool.checkedin()  # type: ignore[attr-defined]
    assert trim.trim_idle(pg_url, after=0.0) == 0
    assert get_engine(pg_url).pool.checkedin() == before  # type: ignore[attr-defined]
    kept = _backend_pid(pg_url)
    assert _alive_at_last(pg_url, pids, {kept}) == {kept}


def test_a_sqlite_store_is_left_alone(tmp_path: Path) -> None:
    # Given a SQLite store (its connections are files of this process, no server's)
    url = f"sqlite:///{tmp_path}/store.db"
    with read_session(url) as session:
        session.execute(text("SELECT 1"))
    # When it is trimmed, Then nothing is closed
    assert trim.trim_idle(url, after=0.0) == 0



def test_a_trim_that_closes_nothing_does_not_make_the_connections_look_used(pg_url: str) -> None:
    # Given a pool grown to three connections by a burst
    _open_together(pg_url, 3)
    # and a trim (every 15 s on a node) that finds them used too recently
    time.sleep(0.4)
    assert trim.trim_idle(pg_url, after=0.5) == 0

    # When the next trim comes after they have been unused for longer than the idle time
    time.sleep(0.3)
    closed = trim.trim_idle(pg_url, after=0.5)

    # Then it closes the two not used last: the first trim's look did not count as a use
    assert closed == 2


def test_a_connection_lost_in_use_does_not_hide_the_idle_ones_from_the_trim(
    pg_url: str,
) -> None:
    # Given a pool grown to four connections by a burst, one of which was then lost while
    # in use (a disconnect: its slot has no connection any more)
    pids = _open_together(pg_url, 4)
    pool = get_engine(pg_url).pool
    lost = pool.connect()
    lost.invalidate()
    # and which then used one connection at a time
    used_last = _backend_pid(pg_url)

    # When it trims the connections unused since
    closed = trim.trim_idle(pg_url, after=0.0)

    # Then every idle one but the one used last was closed: none is left open behind the
    # lost one, and the store still answers
    assert _alive_at_last(pg_url, pids, {used_last}) == {used_last}
    assert closed == 2
    assert _backend_pid(pg_url) == used_last


def test_a_trim_while_another_thread_holds_a_connection_waits_for_nothing(pg_url: str) -> None:
    # Given a pool of three idle connections, one of them in use by another thread
    pids = _open_together(pg_url, 3)
    busy = get_engine(pg_url).pool.connect()
    try:
        # When the heartbeat's trim looks (the process is not quiet)
        started = time.monotonic()
        closed = trim.trim_idle(pg_url, after=0.0)
        # Then it returns at once and closes nothing
        assert closed == 0
        assert time.monotonic() - started < 1.0
        assert _alive(pg_url, pids) == set(pids)
    finally:
        busy.close()
