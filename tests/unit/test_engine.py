"""The store's writer lock on SQLite: writers of several processes queue on it, a killed holder
frees it, and a thread may nest it."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import time
from pathlib import Path

from sqlalchemy import text

from bidding.store import write_session
from bidding.store.engine import WriterLock, dispose_all, writer_lock_path

SPAWN = multiprocessing.get_context("spawn")


def _hold(path: str, ready: object, seconds: float, released: object) -> None:
    """Child: hold the writer lock of ``path`` for ``seconds``, then record when it let go."""
    lock = WriterLock(Path(path))
    with lock.held():
        ready.set()  # type: ignore[attr-defined]
        time.sleep(seconds)
        released.value = time.time()  # type: ignore[attr-defined]


def _hold_forever(path: str, ready: object) -> None:
    """Child: take the writer lock and never let go (it is killed)."""
    lock = WriterLock(Path(path))
    with lock.held():
        ready.set()  # type: ignore[attr-defined]
        time.sleep(3600)


def _count(url: str, times: int) -> None:
    """Child: read-modify-write a counter ``times`` times, one write transaction each."""
    for _ in range(times):
        with write_session(url) as session:
            value = session.execute(text("SELECT n FROM counter")).scalar_one()
            session.execute(text("UPDATE counter SET n = :n"), {"n": value + 1})
    dispose_all()


def _free(path: Path) -> bool:
    """Whether another open file could take the lock right now."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def test_the_lock_file_sits_beside_a_sqlite_file_and_nowhere_else(tmp_path: Path) -> None:
    assert writer_lock_path(f"sqlite:///{tmp_path}/store.db") == tmp_path / "store.db-writer.lock"
    assert writer_lock_path("sqlite://") is None
    assert writer_lock_path("sqlite:///:memory:") is None
    assert writer_lock_path("postgresql://localhost/test") is None


def test_a_write_waits_for_another_process_holding_the_lock(tmp_path: Path) -> None:
    # given a store, and another process holding its writer lock for 0.5 s
    url = f"sqlite:///{tmp_path}/store.db"
    with write_session(url) as session:
        session.execute(text("CREATE TABLE t (x INTEGER)"))
    ready, released = SPAWN.Event(), SPAWN.Value("d", 0.0)
    child = SPAWN.Process(target=_hold, args=(str(writer_lock_path(url)), ready, 0.5, released))
    child.start()
    try:
        assert ready.wait(30)
        # when this process writes
        with write_session(url) as session:
            began = time.time()
            session.execute(text("INSERT INTO t VALUES (1)"))
        # then its transaction began only after the other let go
        assert released.value > 0
        assert began >= released.value
    finally:
        child.join(10)
        dispose_all()


def test_a_killed_holder_frees_the_lock(tmp_path: Path) -> None:
    # given a process that took the writer lock and hangs
    url = f"sqlite:///{tmp_path}/store.db"
    path = writer_lock_path(url)
    assert path is not None
    ready = SPAWN.Event()
    child = SPAWN.Process(target=_hold_forever, args=(str(path), ready))
    child.start()
    assert ready.wait(30)
    assert not _free(path)
    # when it is killed with SIGKILL (no clean-up runs)
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join(10)
    # then the next writer gets the lock at once
    with write_session(url) as session:
        session.execute(text("CREATE TABLE t (x INTEGER)"))
    dispose_all()


def test_a_thread_may_nest_the_lock_and_the_file_is_freed_at_the_outer_exit(
    tmp_path: Path,
) -> None:
    lock = WriterLock(tmp_path / "x-writer.lock")
    with lock.held():
        with lock.held():
            assert not _free(lock.path)
        # the inner exit keeps the file locked for the outer hold
        assert not _free(lock.path)
    assert _free(lock.path)
    lock.close()


def test_writers_in_four_processes_lose_no_update(tmp_path: Path) -> None:
    # given a counter in a fresh store
    url = f"sqlite:///{tmp_path}/store.db"
    with write_session(url) as session:
        session.execute(text("CREATE TABLE counter (n INTEGER)"))
        session.execute(text("INSERT INTO counter VALUES (0)"))
    # when four processes each read and rewrite it 100 times
    children = [SPAWN.Process(target=_count, args=(url, 100)) for _ in range(4)]
    for child in children:
        child.start()
    for child in children:
        child.join(90)
    # then every one finished cleanly and every increment counted
    assert [c.exitcode for c in children] == [0, 0, 0, 0]
    with write_session(url) as session:
        assert session.execute(text("SELECT n FROM counter")).scalar_one() == 400
    dispose_all()
