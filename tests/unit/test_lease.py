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
    # and a sweeper's fallback phases idle longer than those whose timing a caller sees
    node = sweeper.Sweeper(Settings(database_url="sqlite://"),
                           Celery("t", broker="memory://", set_as_current=False))
    node.empty = dict.fromkeys(node.empty, 50)
    assert {node.interval(p) for p in ("announce_due", "close_expired", "end_expired",
                                       "check_winners")} == {1.0}
    assert node.interval("report_results") == 3.0
    # and so does a plug-in's federation-wide loop that says it is a fallback only (the task
    # graphs' advance of graphs nobody moved)
    from bidding.graphs.plugin import GraphPlugin
    from bidding.lifecycle import plugins

    app = Celery("t", broker="memory://", set_as_current=False)
    plugins.use(app, GraphPlugin)
    with_graphs = sweeper.Sweeper(Settings(database_url="sqlite://"), app)
    with_graphs.empty = dict.fromkeys(with_graphs.empty, 50)
    assert with_graphs.interval("bidding-sweeper-advance_idle") == 3.0
    # and work found is a count, or the watchdog's moved tasks
    assert sweeper.found_work(3) and sweeper.found_work((1, 4))
    assert not sweeper.found_work(0) and not sweeper.found_work((0, 4))


def test_a_standby_only_reads_a_live_lease_and_takes_a_lapsed_one(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, now = settings.database_url, clock.now()
    # given a lease held by a until now + 10
    assert lease.look(url, "a@host", 10, now=now) == lease.Look(True, now + 10)
    writes: list[str] = []
    real_hold = lease.hold
    monkeypatch.setattr(lease, "hold", lambda *a, **k: writes.append(a[1]) or real_hold(*a, **k))
    # when b looks while it runs
    seen = lease.look(url, "b@host", 10, now=now + 4)
    # then b learns until when it runs, and writes nothing (no write lock for a standby)
    assert seen == lease.Look(False, now + 10) and writes == []
    # and a's own look renews it; b takes it once it has lapsed
    assert lease.look(url, "a@host", 10, now=now + 5) == lease.Look(True, now + 15)
    assert lease.look(url, "b@host", 10, now=now + 15.5) == lease.Look(True, now + 25.5)
    assert writes == ["a@host", "b@host"]


def test_a_standby_looks_again_when_the_lease_could_lapse_and_at_least_every_half_ttl(
    settings: Settings,
) -> None:
    # given the defaults (heartbeat every 2 s, TTL 10 s) and a node's sweeper
    defaults = settings.model_copy(update={"heartbeat_interval": 2.0, "heartbeat_ttl": 10.0})
    node = sweeper.Sweeper(defaults, Celery("t", broker="memory://", set_as_current=False))
    now = clock.now()
    # then while it holds the lease it renews every heartbeat interval
    node.leading, node.lease_until = True, now + 10
    assert node.lease_interval() == 2.0
    # and standing by, it reads a live holder's lease every 5 s (a clean hand-over is seen
    # within 5 s), every 2 s while it knows of none
    node.leading = False
    node.lease_until = now + 9.5
    assert node.lease_interval() == pytest.approx(5.0)
    node.lease_until = None
    assert node.lease_interval() == 2.0
    # and once the lease it saw could lapse sooner, it looks just after the lapse, even if
    # its loop's jitter (10%) wakes it early
    for left in (3.5, 0.5):
        node.lease_until = clock.now() + left
        assert left < node.lease_interval() * (1 - sweeper.LEASE_JITTER) < left + 0.1
    node.lease_until = clock.now() - 1  # lapsed already: at once
    assert node.lease_interval() < 0.1


def test_an_idle_sweeper_wakes_for_the_next_scheduled_task_rather_than_a_whole_pause(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uuid

    from bidding.auction import announce
    from bidding.context import Context
    from bidding.lifecycle import states
    from bidding.models import Announcement
    from tests.stored import add_announcement

    # given an idle sweeper (its announcing phase found nothing for a while: 1 s apart)
    node = sweeper.Sweeper(settings, Celery("t", broker="memory://", set_as_current=False))
    node.leading = True
    node.empty = dict.fromkeys(node.empty, 50)
    assert node.interval("announce_due") == 1.0
    # when a task is scheduled to start in 0.6 s and a pass reads when it comes due
    now = clock.now()
    add_announcement(settings.database_url,
                     Announcement(task_id=str(uuid.uuid4()), task_name="t.later",
                                  task_type="later", announced_at=now),
                     states.DEFERRED, [], due_at=now + 0.6)
    assert announce.next_due(Context(settings, node.app), now) == pytest.approx(now + 0.6)
    node._pass("announce_due", lambda: 0)
    # then the next pass comes no later than its due time, even with the loop's jitter (the
    # wait reckoned at the pass's time: a loaded machine's delay since is not the sweeper's)
    monkeypatch.setattr(sweeper.clock, "now", lambda: now)
    wait = node.interval("announce_due")
    assert 0.3 < wait * (1 + sweeper.PHASE_JITTER) <= 0.6
    # and the other phases keep their idle pace
    assert node.interval("close_expired") == 1.0
