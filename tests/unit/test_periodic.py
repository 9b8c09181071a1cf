"""A node's loops (heartbeat, sweeper phases) through an outage: they back off and keep the log
readable, then resume."""

from __future__ import annotations

import threading

import pytest

from bidding.nodes.periodic import BACKOFF_CAP, Periodic, pause_after


def test_a_failing_loop_backs_off_up_to_the_cap_and_resumes_its_interval() -> None:
    # given a loop every 0.2 s
    # then after failures it waits longer each time, never more than the cap
    assert pause_after(0.2, 0) == 0.2
    assert pause_after(0.2, 1) == 0.4 and pause_after(0.2, 3) == 1.6
    assert pause_after(0.2, 30) == BACKOFF_CAP
    # and a loop slower than the cap keeps its own interval
    assert pause_after(30.0, 5) == 30.0


def test_a_loop_failing_for_hours_still_waits_the_cap_and_does_not_die() -> None:
    # given a loop every 0.2 s that has failed 1024 times in a row (an outage of 85 minutes
    # at 5 s each), or a million
    # then its next pause is the cap (2.0 ** 1024 would overflow a float: an OverflowError
    # outside the loop's try would end the loop for good)
    assert pause_after(0.2, 1024) == BACKOFF_CAP
    assert pause_after(0.2, 1_000_000) == BACKOFF_CAP


def test_an_outage_is_a_few_lines_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    # given a loop whose calls fail for a while (the store restarting), then work
    calls = 0
    recovered = threading.Event()

    def call() -> None:
        nonlocal calls
        calls += 1
        if calls <= 4:
            raise ConnectionError("store down")
        recovered.set()

    loop = Periodic("bidding-test-loop", 0.01, call)
    # when it runs through the outage
    loop.start()
    try:
        assert recovered.wait(10)
    finally:
        loop.stop()
    # then the first failure is logged with its traceback, and the recovery once
    failed = [r for r in caplog.records if "failed; trying again" in r.getMessage()]
    assert len(failed) == 1 and failed[0].exc_info is not None
    assert any("works again, after 4 failure(s)" in r.getMessage() for r in caplog.records)
    assert sum(r.exc_info is not None for r in caplog.records) == 1


def test_a_loop_idle_for_hours_keeps_its_longest_pause_and_runs_on() -> None:
    # given a loop whose passes found nothing 10,000 times in a row (hours of an idle node)
    from bidding.auction.sweeper import IDLE_INTERVAL, idle_interval
    from bidding.observe.watch import idle_pass_interval

    # then its pause is the longest one, not an overflow that would end its thread
    assert idle_interval(0.25, 10_000) == IDLE_INTERVAL
    assert idle_pass_interval(30.0, 1, 10_000) == 7.5
    # and a slower configured loop stays as slow
    assert idle_interval(5.0, 10_000) == 5.0


def test_a_woken_loop_runs_at_once_and_then_keeps_its_pace() -> None:
    import time

    # given a loop that runs once a minute, its calls counted
    calls: list[float] = []
    called = threading.Event()
    loop = Periodic("woken", 60.0, lambda: (calls.append(time.monotonic()), called.set()))
    loop.start()
    try:
        # when it is woken
        started = time.monotonic()
        loop.wake()
        # then it runs now, not a minute later, and once
        assert called.wait(5)
        assert calls[0] - started < 5
        time.sleep(0.2)
        assert len(calls) == 1
    finally:
        # and it stops at once, in the middle of its minute's wait
        stopping = time.monotonic()
        loop.stop()
        assert time.monotonic() - stopping < 5
    assert not loop.running
