"""One clock for the federation: every process keeps the store's time (``bidding.clock``),
whatever its own host's wall clock says."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from bidding import clock
from bidding.store import clock as store_clock
from bidding.store import keep_clock, read_session
from tests.unit.conftest import postgres_database


@pytest.fixture(autouse=True)
def no_reading() -> Iterator[None]:
    store_clock.forget()
    yield
    store_clock.forget()


@pytest.fixture
def postgres() -> Iterator[str]:
    with postgres_database() as url:
        store_clock.forget()  # (making the database read its clock)
        yield url


def server_time(url: str) -> float:
    with read_session(url) as session:
        return float(session.execute(text(
            "SELECT extract(epoch FROM clock_timestamp())")).scalar_one())


def shift_wall_clock(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """Make this host's wall clock ``seconds`` off (its monotonic clock stays right)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + seconds)


@pytest.mark.parametrize("off_by", [30.0, -30.0])
def test_a_process_on_a_host_whose_clock_is_off_keeps_the_stores_time(
    postgres: str, monkeypatch: pytest.MonkeyPatch, off_by: float, caplog: pytest.LogCaptureFixture,
) -> None:
    # given a host whose wall clock is 30 s ahead of (or behind) the store's
    shift_wall_clock(monkeypatch, off_by)
    # when the process first uses the store
    with caplog.at_level(logging.WARNING, logger="bidding.store.clock"):
        keep_clock(postgres)
    # then its time is the store's, not its host's, and the log says the host's clock is off
    assert abs(clock.now() - server_time(postgres)) < 0.5
    assert abs(clock.now() - time.time() + off_by) < 0.5
    assert f"this host's clock is 30.0s {'ahead of' if off_by > 0 else 'behind'} the store's" \
        in caplog.text


def test_a_wall_clock_stepped_after_the_reading_does_not_move_the_federations_time(
    postgres: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a process that read the store's time
    keep_clock(postgres)
    before = clock.now()
    # when its host's wall clock is stepped an hour forward (NTP, a resumed virtual machine)
    shift_wall_clock(monkeypatch, 3600.0)
    # then its time goes on from the store's, on the monotonic clock
    assert 0 <= clock.now() - before < 0.5
    assert abs(clock.now() - server_time(postgres)) < 0.5


def test_the_stores_time_is_read_again_when_due(postgres: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # given a process that read the store's time, and a reading now due again
    keep_clock(postgres)
    first = clock.current()
    assert first is not None and first.source
    monkeypatch.setattr(store_clock, "_next_read", time.monotonic() - 1)
    # when it next uses the store
    server_time(postgres)
    # then it has a new reading
    second = clock.current()
    assert second is not None and second.monotonic > first.monotonic


def test_a_sqlite_store_keeps_this_hosts_clock(store_url: str,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # given a SQLite store (one host's file: its clock is that host's)
    shift_wall_clock(monkeypatch, 30.0)
    # when a process uses it
    keep_clock(store_url)
    # then the federation's time is this host's clock, and nothing was read
    assert clock.current() is None
    assert abs(clock.now() - time.time()) < 0.01


def test_a_store_whose_time_cannot_be_read_keeps_the_clock_it_had(
    postgres: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    # given a process that read the store's time once
    keep_clock(postgres)
    reading = clock.current()
    # when the next reading fails (the store restarting)
    monkeypatch.setattr(store_clock, "_next_read", time.monotonic() - 1)
    monkeypatch.setattr(store_clock, "_SERVER_NOW", text("SELECT no_such_function()"))
    with caplog.at_level(logging.INFO, logger="bidding.store.clock"):
        keep_clock(postgres)
        keep_clock(postgres)  # not tried again before RETRY_AFTER
    # then it keeps the reading it had, says so once (no warning: the reading is fresh, and
    # stays right), and will try again later
    assert clock.current() is reading
    [said] = [r for r in caplog.records if "could not read the store's clock" in r.message]
    assert said.levelno == logging.INFO and "keeping the previous reading" in said.message


def test_a_refresh_read_in_a_slow_round_trip_keeps_the_better_reading(
    postgres: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a process that read the store's time in a quick round trip
    keep_clock(postgres)
    good = clock.current()
    assert good is not None and good.round_trip < store_clock.ROUGH_ROUND_TRIP
    # when its next reading takes 0.7 s (the process descheduled in the middle of it, on a
    # loaded host: such a reading may be a third of a second off)
    monkeypatch.setattr(store_clock, "_next_read", time.monotonic() - 1)
    monkeypatch.setattr(store_clock, "_SERVER_NOW", text(
        "SELECT extract(epoch FROM clock_timestamp()) FROM pg_sleep(0.7)"))
    keep_clock(postgres)
    # then the federation's time stays on the quick reading, and the next look is soon
    assert clock.current() is good
    assert store_clock._next_read < time.monotonic() + store_clock.RETRY_AFTER
    # and a reading that is rough only because the earlier one was very quick is not dropped
    assert not store_clock.rougher(
        clock.Reading(server=0, monotonic=10, round_trip=0.2), clock.Reading(0, 0, "", 0.001))
    # and nor is one that replaces a reading older than STALE_AFTER
    assert not store_clock.rougher(
        clock.Reading(server=0, monotonic=store_clock.STALE_AFTER + 1, round_trip=2.0),
        clock.Reading(0, 0, "", 0.001))
    assert store_clock.rougher(
        clock.Reading(server=0, monotonic=10, round_trip=2.0), clock.Reading(0, 0, "", 0.001))
