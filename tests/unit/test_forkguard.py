"""A process forked while other threads use the store (as Celery forks a pool process after a
hard time limit, while the node's bid, award and sweeper threads run) can use the store."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

from sqlalchemy import text

from bidding.store import read_session, write_session
from bidding.store.engine import reset_after_fork
from bidding.store.forkguard import ForkGuard

#: Seconds a child may take for one query before it counts as hung.
CHILD_LIMIT = 5


def _fork_and_query(url: str) -> bool:
    """Fork; the child runs one query (killed by an alarm if it hangs). True when it finished."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        # The kernel's default action, not a Python handler (pytest-timeout installs one): a
        # child stuck inside C code never runs Python handlers.
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        signal.alarm(CHILD_LIMIT)
        try:
            reset_after_fork()
            with read_session(url) as session:
                session.execute(text("SELECT n FROM counter")).all()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_children_forked_while_threads_use_the_store_do_not_hang(tmp_path: Path) -> None:
    # given a SQLite store and three threads writing and reading it without pause
    url = f"sqlite:///{tmp_path}/store.db"
    with write_session(url) as session:
        session.execute(text("CREATE TABLE counter (n INTEGER)"))
        session.execute(text("INSERT INTO counter VALUES (0)"))
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            with write_session(url) as session:
                session.execute(text("UPDATE counter SET n = n + 1"))
            with read_session(url) as session:
                session.execute(text("SELECT n FROM counter")).all()

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        # when this process forks 150 times meanwhile (without the guard, about 1 child in 40
        # hung for ever in its first SQLite call)
        finished = [_fork_and_query(url) for _ in range(150)]
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    # then every child ran its query
    assert finished.count(False) == 0
    with read_session(url) as session:
        assert session.execute(text("SELECT n FROM counter")).scalar_one() > 0


def test_a_thread_inside_the_store_may_fork_and_nest() -> None:
    # given a guard held by this thread, twice (a session inside a session)
    guard = ForkGuard()
    with guard.inside(), guard.inside():
        # when it forks (the fork handlers run in the forking thread), it does not wait for itself
        guard.before_fork()
        guard.after_fork_in_parent()
    # and another thread can enter afterwards
    entered = threading.Event()

    def enter() -> None:
        with guard.inside():
            entered.set()

    t = threading.Thread(target=enter)
    t.start()
    t.join(5)
    assert entered.is_set()


def test_a_fork_waits_for_sessions_in_other_threads_and_keeps_new_ones_out() -> None:
    guard = ForkGuard()
    inside, leave = threading.Event(), threading.Event()

    def session() -> None:
        with guard.inside():
            inside.set()
            leave.wait(5)

    holder = threading.Thread(target=session)
    holder.start()
    assert inside.wait(5)
    # when a fork begins while the other thread is inside
    forked = threading.Event()

    def fork() -> None:
        guard.before_fork()
        forked.set()
        guard.after_fork_in_parent()

    forker = threading.Thread(target=fork)
    forker.start()
    # then it waits for that session to end
    assert not forked.wait(0.3)
    leave.set()
    assert forked.wait(5)
    holder.join(5)
    forker.join(5)


def _module_locks() -> dict[str, threading.Lock]:
    """The module-level locks a pool process may take, by where they live."""
    from bidding.auction import history, loads
    from bidding.nodes import records
    from bidding.store import clock, engine, migrate, trim, turns

    return {"records": records._cache._lock, "loads": loads._cache._lock,
            "history": history._history_lock,
            "clock": clock._lock, "engine": engine._lock, "trim": trim._lock,
            "migrate": migrate._done_lock, "turns": turns._turn}


def test_a_child_forked_while_threads_hold_the_modules_locks_can_take_them() -> None:
    # given a thread of this process holding every module-level lock a pool process may take
    # (a cache being filled, the clock being read, an engine being built) ...
    locks = _module_locks()
    held, leave = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in locks.values():
            lock.acquire()
        held.set()
        leave.wait(10)
        for lock in locks.values():
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(5)
    try:
        # ... when this process forks (as Celery forks a pool process after a hard time limit)
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 when it could take every lock
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.alarm(CHILD_LIMIT)
            try:
                taken = [lock.acquire(timeout=1) for lock in locks.values()]
            finally:
                os._exit(0 if all(taken) else 1)
        _, status = os.waitpid(pid, 0)
    finally:
        leave.set()
        holder.join(10)
    # then the child took each of them at once, and the parent's are as they were
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert not any(lock.locked() for lock in locks.values())


def test_the_store_clock_is_read_inside_the_fork_guard() -> None:
    # given a server store whose clock this process has not read yet
    from bidding import clock
    from bidding.store import clock as store_clock
    from bidding.store.forkguard import guard

    seen: list[int] = []

    class Connection:
        def __enter__(self) -> Connection:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def execute(self, statement: object) -> Connection:
            # what a fork would meet now: this thread inside the store
            seen.append(guard._depth())
            return self

        def scalar_one(self) -> float:
            return 1_700_000_000.0

    class Engine:
        def connect(self) -> Connection:
            return Connection()

    store_clock.forget()
    try:
        # when the reading is taken
        store_clock.keep_current("postgresql+psycopg://clock-test/db", Engine(),  # type: ignore[arg-type]
                                 local=False)
        # then it ran inside the guard, so no pool process was forked meanwhile
        assert seen == [1]
        current = clock.current()
        assert current is not None and current.server == 1_700_000_000.0
    finally:
        store_clock.forget()
