"""One node at a time sweeps the federation: the sweeper lease, its hand-over, and a phase's
slow-down while it finds nothing."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from celery import Celery

from bidding import clock
from bidding.auction import sweeper
from bidding.config import Settings
from bidding.lifecycle import lease


def test_one_holder_at_a_time_and_the_next_takes_over_when_it_lapses(
    settings: Settings,
) -> None:
    url, now = settings.database_url, clock.now()
    # given a lease taken by a, for 10 s
    assert lease.hold(url, "a@host", 10, now=now)
    # then b cannot take it meanwhile, and a renews it
    assert not lease.hold(url, "b@host", 10, now=now + 5)
    assert lease.hold(url, "a@host", 10, now=now + 5)
    # and when a stops renewing, b takes it once it lapsed
    assert not lease.hold(url, "b@host", 10, now=now + 14)
    assert lease.hold(url, "b@host", 10, now=now + 15.1)
    assert not lease.hold(url, "a@host", 10, now=now + 16)


def test_a_holder_that_stops_cleanly_hands_the_lease_over_at_once(settings: Settings) -> None:
    url = settings.database_url
    # given a lease held by a
    assert lease.hold(url, "a@host", 10)
    # when a gives it up, then b takes it at its next look, not 10 s later
    lease.give_up(url, "a@host")
    assert lease.hold(url, "b@host", 10)
    # and giving up a lease one does not hold changes nothing
    lease.give_up(url, "a@host")
    assert not lease.hold(url, "a@host", 10)


def test_of_two_node_sweepers_only_the_lease_holder_sweeps(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given two nodes' sweepers on one store (each with its own app, so that a phase can tell
    # whose it is), every phase counting the node it ran on
    fast = settings.model_copy(update={"sweep_interval": 0.02, "heartbeat_interval": 0.05})
    apps = {name: Celery(name, broker="memory://", backend="cache+memory://",
                         set_as_current=False) for name in ("n1", "n2")}
    ran: Counter[str] = Counter()

    def counting(result: Any) -> Any:
        def phase(ctx: Any, *args: Any, **kwargs: Any) -> Any:
            if ctx.app.main in apps:  # (not another module's worker left in this process)
                ran[ctx.app.main] += 1
            return result
        return phase

    for name in sweeper.PHASES:
        monkeypatch.setattr(sweeper, name, counting((0, 1) if name == "check_winners" else 0))
    nodes = [sweeper.Sweeper(fast, app, holder=f"{name}@host") for name, app in apps.items()]
    # when both run for a while
    for node in nodes:
        node.start()
    try:
        threading.Event().wait(0.6)
        leaders = [node.holder for node in nodes if node.leading]
    finally:
        for node in nodes:
            node.stop()
    # then one of them held the lease, and the phases ran on it alone
    assert len(leaders) == 1
    assert set(ran) == {leaders[0].split("@")[0]}, ran
    # and, stopped cleanly, it gave the lease up: the other takes it at once
    assert lease.hold(settings.database_url, "n3@host", 10)


def test_a_phase_that_keeps_finding_nothing_slows_down_and_speeds_up_again() -> None:
    # given the default sweep interval
    base = 0.2
    # then a few empty passes keep it, more double it up to the idle interval
    assert [sweeper.idle_interval(base, n) for n in (0, 4)] == [base, base]
    assert sweeper.idle_interval(base, 5) == pytest.approx(0.4)
    assert sweeper.idle_interval(base, 6) == pytest.approx(0.8)
    assert sweeper.idle_interval(base, 50) == sweeper.IDLE_INTERVAL
    # and a configured interval slower than the idle one is kept as it is
    assert sweeper.idle_interval(5.0, 50) == 5.0
    # and work found is a count, or the watchdog's moved tasks
    assert sweeper.found_work(3) and sweeper.found_work((1, 4))
    assert not sweeper.found_work(0) and not sweeper.found_work((0, 4))
