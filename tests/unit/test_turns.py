"""A quiet process's background passes take turns at the store (``store.turns``): idle passes
run one after another, so that a quiet node needs one connection; a blocked one holds the
others up by the turn's wait at most; busy passes never wait."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from celery import Celery

from bidding.auction import sweeper
from bidding.config import Settings
from bidding.lifecycle.retention import RetentionJob
from bidding.nodes.periodic import IDLE_PASSES
from bidding.store import turns, upgrade


def _overlapping_runs(run_pass: object, threads: int = 4, passes: int = 20) -> int:
    """How many passes found another pass running when they started."""
    running = 0
    met = 0
    lock = threading.Lock()

    def one() -> int:
        nonlocal running, met
        with lock:
            if running:
                met += 1
            running += 1
        time.sleep(0.002)  # a pass's statement or two
        with lock:
            running -= 1
        return 0

    def loop() -> None:
        for _ in range(passes):
            run_pass(one)  # type: ignore[operator]

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return met


def test_idle_passes_on_their_turn_never_meet() -> None:
    # given four loops whose passes would meet
    def on_turn(fn: object) -> None:
        # (A long wait: the lock is not fair, and on a loaded machine one loop may wait for
        # many passes of the others; this test is about taking turns, not the timeout.)
        with turns.quiet_turn(wait=10):
            fn()  # type: ignore[operator]

    # when each pass takes the turn first, then not one pass met another
    assert _overlapping_runs(on_turn) == 0
    # (and without it, the same loops met)
    assert _overlapping_runs(lambda fn: fn()) > 0


@contextmanager
def turn_held_elsewhere() -> Iterator[None]:
    """Another loop's pass holds the turn (and blocks, as on a half-open connection) until
    the block ends."""
    release = threading.Event()
    holding = threading.Event()

    def blocked() -> None:
        with turns.quiet_turn():
            holding.set()
            release.wait(5)

    holder = threading.Thread(target=blocked)
    holder.start()
    assert holding.wait(5)
    try:
        yield
    finally:
        release.set()
        holder.join()


def test_a_pass_that_blocks_holds_the_others_up_by_the_wait_at_most() -> None:
    # given a pass that holds the turn and blocks (a half-open connection)
    with turn_held_elsewhere():
        # when another pass wants the turn
        started = time.monotonic()
        with turns.quiet_turn(wait=0.1) as taken:
            waited = time.monotonic() - started
        # then it runs anyway after the wait, without the turn
        assert not taken
        assert 0.09 <= waited < 1.0
    # and once the blocked pass ends, the turn is free again
    with turns.quiet_turn(wait=0) as taken:
        assert taken


def test_a_child_process_never_inherits_a_held_turn() -> None:
    # given a parent whose loop holds the turn as it forks (a prefork pool starting)
    with turns.quiet_turn():
        pid = os.fork()
        if pid == 0:  # the child: its own loops must get the turn at once
            with turns.quiet_turn(wait=0) as taken:
                os._exit(0 if taken else 1)
    # then the child took the turn without waiting
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_the_sweepers_idle_passes_take_turns_and_its_busy_ones_do_not() -> None:
    # given a sweeper that sweeps, and a pass of another loop holding the turn
    node = sweeper.Sweeper(Settings(database_url="sqlite://"),
                           Celery("t", broker="memory://", set_as_current=False))
    node.leading = True
    with turn_held_elsewhere():
        waits = {}
        for phase, empty in (("close_expired", 0), ("check_winners", IDLE_PASSES)):
            node.empty[phase] = empty
            started = time.monotonic()
            node._pass(phase, lambda: 0)
            waits[phase] = time.monotonic() - started
        # and the idle phases' look (the store here has no tables: it fails after its wait)
        node.empty["end_expired"] = IDLE_PASSES
        started = time.monotonic()
        node.look_for_work()
        waits["look"] = time.monotonic() - started
        # then a phase that found work lately ran at once; an idle one, and the look, waited
        # for the turn
        assert waits["close_expired"] < turns.QUIET_TURN_WAIT / 2
        assert waits["check_winners"] >= turns.QUIET_TURN_WAIT * 0.9
        assert waits["look"] >= turns.QUIET_TURN_WAIT * 0.9


def test_the_retention_jobs_look_waits_for_the_turn(tmp_path: Path) -> None:
    # given a node whose retention is on, and a pass of another loop holding the turn
    url = f"sqlite:///{tmp_path}/look.db"
    upgrade(url)
    job = RetentionJob(Settings(database_url=url, retention_days=30.0), "n1@host")
    job.run()  # its first look claims the job and prunes (nothing): the job is due later
    job._due = 0.0  # (forget when it is due, so that the next look reads the store)
    with turn_held_elsewhere():
        # when it looks again
        started = time.monotonic()
        assert job.run() is None
        waited = time.monotonic() - started
    # then its look waited for the turn, as an idle pass does
    assert waited >= turns.QUIET_TURN_WAIT * 0.9
