"""One node at a time sweeps the federation: the sweeper lease, its hand-over, and a phase's
slow-down while it finds nothing."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import pytest
from celery import Celery
from celery import _state as celery_state

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


def _idle_sweeper(settings: Settings) -> sweeper.Sweeper:
    """A sweeper that holds the lease and whose phases found nothing for a while."""
    node = sweeper.Sweeper(settings, Celery("t", broker="memory://", set_as_current=False))
    node.leading = True
    node.empty = dict.fromkeys(node.empty, 50)
    return node


def _stored(settings: Settings, state: str, **columns: Any) -> str:
    import uuid

    from bidding.models import Announcement
    from tests.stored import add_announcement

    task_id = str(uuid.uuid4())
    add_announcement(settings.database_url,
                     Announcement(task_id=task_id, task_name="t.later", task_type="later",
                                  announced_at=clock.now()), state, [], **columns)
    return task_id


def test_an_idle_sweeper_wakes_for_the_next_scheduled_task_rather_than_a_whole_pause(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bidding.lifecycle import states

    # given an idle sweeper (its phases found nothing for a while: it looks once a second)
    node = _idle_sweeper(settings)
    woken: list[str] = []
    for name, loop in node._phase_loops.items():
        monkeypatch.setattr(loop, "wake", lambda name=name: woken.append(name))
    node.look_for_work()
    assert node.look_interval() == 1.0
    # when a task is scheduled to start in 0.6 s and the next look reads it
    now = clock.now()
    _stored(settings, states.DEFERRED, due_at=now + 0.6)
    monkeypatch.setattr(sweeper.clock, "now", lambda: now)
    node.look_for_work()
    # then nothing is woken yet, and the next look comes no later than its due time, even with
    # the loop's jitter (the wait reckoned at the look's time: a loaded machine's delay since
    # is not the sweeper's)
    assert woken == []
    wait = node.look_interval()
    assert 0.3 < wait * (1 + sweeper.PHASE_JITTER) <= 0.6
    # and once it has come, the look wakes the announcing phase alone
    monkeypatch.setattr(sweeper.clock, "now", lambda: now + 0.61)
    node.look_for_work()
    assert woken == ["announce_due"] and node.wanted == {"announce_due"}
    # and the phases keep their idle pace meanwhile
    assert node.interval("close_expired") == 1.0


def test_an_idle_sweeper_reads_the_store_once_per_look_not_once_per_phase(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqlalchemy import event

    from bidding.auction import idle_look
    from bidding.store.engine import get_engine

    # given an idle sweeper on an idle store, its phases counted when they run
    node = _idle_sweeper(settings)
    ran: list[str] = []
    for name in sweeper.PHASES:
        monkeypatch.setattr(sweeper, name, lambda ctx, name=name: ran.append(name) or 0)
    statements: list[str] = []
    event.listen(get_engine(settings.database_url), "before_cursor_execute",
                 lambda *args: args[2] != "BEGIN" and statements.append(args[2]))
    # when each looked-at phase's loop wakes, and the look runs
    for name in idle_look.LOOKED:
        node.run(name)
    node.look_for_work()
    # then none of them ran: one statement read that none has work
    assert ran == []
    assert len(statements) == 1, statements
    # and once the look found work for one, its loop runs it
    node.wanted.add("close_expired")
    node.run("close_expired")
    assert ran == ["close_expired"] and not node.wanted
    # and the watchdog still runs on its own (a lost winner has no time in its row)
    node.run("check_winners")
    assert ran == ["close_expired", "check_winners"]


def test_the_look_sees_work_exactly_where_each_phase_would_find_it(settings: Settings) -> None:
    from bidding.auction import idle_look
    from bidding.auction.announce import _DUE
    from bidding.auction.close import _EXPIRED as PAST_WINDOW
    from bidding.auction.expiry import _EXPIRED as PAST_START_BY
    from bidding.context import Context
    from bidding.execution.report import _DUE as REPORT_DUE
    from bidding.lifecycle import states
    from bidding.store import read_session

    ctx = Context(settings, Celery("t", broker="memory://", set_as_current=False))
    own = {"end_expired": PAST_START_BY, "close_expired": PAST_WINDOW, "announce_due": _DUE,
           "report_results": REPORT_DUE}
    now = clock.now()

    def found_by_phases(at: float) -> set[str]:
        with read_session(settings.database_url) as session:
            return {name for name, stmt in own.items()
                    if session.execute(stmt, {"now": at, "limit": 5}).first() is not None}

    # given a store with, each at its own time: an open auction whose window ends at +10, a
    # deferred task due at +20, a scheduled task whose start-by time is +30 and an awarded one
    # whose deadline is +40, a finished task whose outcome is due for the backend at +50; and
    # rows no phase looks at (a finished task, a parked open auction, an executing task, all
    # past their times)
    _stored(settings, states.BIDDING, closes_at=now + 10)
    _stored(settings, states.DEFERRED, due_at=now + 20)
    _stored(settings, states.PENDING, due_at=now + 99, expires_at=now + 30)
    _stored(settings, states.ASSIGNED, deadline=now + 40)
    _stored(settings, states.SUCCESS, report_due=now + 50)
    _stored(settings, states.SUCCESS, closes_at=now - 5, due_at=now - 5, expires_at=now - 5)
    _stored(settings, states.BIDDING, closes_at=now - 5, parked="deadline closer")
    _stored(settings, states.EXECUTING, closes_at=now - 5, due_at=now - 5, expires_at=now - 5)

    # when the look reads it
    seen = idle_look.look(ctx)

    # then at every moment it names the phases that would find work, and no other
    for at in (now, now + 10, now + 15, now + 20, now + 30, now + 35, now + 40, now + 50):
        assert set(seen.due(at)) == found_by_phases(at), at - now
    # and it knows when the next one comes
    assert seen.next_at(now) == pytest.approx(now + 10)
    assert seen.next_at(now + 45) == pytest.approx(now + 50)
    assert seen.next_at(now + 60) is None
    assert seen.next_at(now, among=("report_results",)) == pytest.approx(now + 50)


def test_a_look_that_fails_wakes_every_idle_phase(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bidding.auction import idle_look

    # given an idle sweeper whose look fails (a statement this store refuses, say), one of
    # its phases busy (its own loop runs it anyway)
    node = _idle_sweeper(settings)
    node.empty["close_expired"] = 0
    woken: list[str] = []
    for name, loop in node._phase_loops.items():
        monkeypatch.setattr(loop, "wake", lambda name=name: woken.append(name))

    def broken(ctx: object) -> None:
        raise RuntimeError("no such function: min")

    monkeypatch.setattr(idle_look, "look", broken)
    # when it looks
    node.look_for_work()
    # then every idle looked-at phase is woken, to read the store as it would alone
    assert sorted(woken) == ["announce_due", "end_expired", "report_results"]
    assert node.next_at is None


def test_a_stuck_look_does_not_stop_the_phases_it_watches(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import time

    # given an idle sweeper whose look last finished just now
    node = _idle_sweeper(settings)
    ran: list[str] = []
    monkeypatch.setattr(sweeper, "close_expired", lambda ctx: ran.append("close_expired") or 0)
    node.looked_at = time.monotonic()
    # then an idle pass of a watched phase leaves the store to the look
    node.run("close_expired")
    assert ran == []
    # when the look has not finished for longer than its patience (stuck on a half-open
    # connection, say)
    node.looked_at = time.monotonic() - sweeper.LOOK_PATIENCE - 0.1
    node.run("close_expired")
    # then the phase reads the store on its own again
    assert ran == ["close_expired"]


def test_a_phase_backing_off_after_failures_is_not_woken_by_the_look(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bidding.lifecycle import states

    # given an idle sweeper whose deadline closer keeps failing (the bid board unreachable),
    # and an auction past its window
    node = _idle_sweeper(settings)
    node._phase_loops["close_expired"].failures = 3
    woken: list[str] = []
    for name, loop in node._phase_loops.items():
        monkeypatch.setattr(loop, "wake", lambda name=name: woken.append(name))
    _stored(settings, states.BIDDING, closes_at=clock.now() - 1)
    # when the look sees it
    node.look_for_work()
    # then the phase will run it at its backoff's pace, not every second
    assert woken == [] and node.wanted == {"close_expired"}


def test_a_standby_whose_beats_show_the_lease_renewed_does_not_read_it_itself(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bidding.nodes.heartbeat import LeaseSeen

    # given the defaults and a started standby (its loops not running: each pass is called
    # here), whose lease reads are counted
    defaults = settings.model_copy(update={"heartbeat_interval": 2.0, "heartbeat_ttl": 10.0})
    node = sweeper.Sweeper(defaults, Celery("t", broker="memory://", set_as_current=False),
                           holder="b@host")
    node._started = True
    reads: list[str] = []
    real_look = lease.look
    monkeypatch.setattr(lease, "look", lambda *a, **k: reads.append(a[1]) or real_look(*a, **k))
    woken: list[bool] = []
    monkeypatch.setattr(node._lease_loop, "wake", lambda: woken.append(True))
    assert lease.hold(settings.database_url, "a@host", 10)
    # when its heartbeat reads a's lease, renewed until 9.5 s from now
    node.saw_lease(LeaseSeen(clock.now() + 9.5, "a@host"))
    # then its lease loop wakes only to see whether its beats still show the lease (every
    # three heartbeat intervals), or just after a lease it saw could lapse, and a pass that
    # comes while a beat shows the lease live reads nothing
    assert node.lease_interval() == pytest.approx(3 * 2.0)
    assert node.hold_lease() is False and reads == [] and woken == []
    node.saw_lease(LeaseSeen(clock.now() + 3.5, "a@host"))
    assert 3.3 < node.lease_interval() * (1 - sweeper.LEASE_JITTER) < 3.6
    assert node.hold_lease() is False and reads == [] and woken == []
    # when a gives the lease up (a clean stop) and the next beat reads it so
    lease.give_up(settings.database_url, "a@host")
    node.saw_lease(LeaseSeen(0.0, "a@host"))
    # then the lease loop is woken at once, and its pass reads the lease and takes it
    assert woken == [True]
    assert node.hold_lease() is True and reads == ["b@host"] and node.leading
    # and a lease no node has taken, or one the beat shows held under this node's own name
    # (a worker restarted under it), wakes the loop too: it is this node's to take
    node.leading = False
    for unheld in (LeaseSeen(None, None), LeaseSeen(clock.now() + 9, "b@host")):
        node.saw_lease(unheld)
    assert woken == [True, True, True]
    # but a lease loop backing off after failures (the store refusing its reads) keeps its
    # backoff's pace, whatever the beats show
    node._lease_loop.failures = 2
    node.saw_lease(LeaseSeen(None, None))
    assert woken == [True, True, True]


def test_a_standby_whose_beats_stopped_showing_the_lease_reads_it_itself_again(
    settings: Settings,
) -> None:
    from bidding.nodes.heartbeat import LeaseSeen

    # given a standby whose beats showed the lease live, then stopped (its beats failing)
    defaults = settings.model_copy(update={"heartbeat_interval": 2.0, "heartbeat_ttl": 10.0})
    node = sweeper.Sweeper(defaults, Celery("t", broker="memory://", set_as_current=False),
                           holder="b@host")
    node._started = True
    node.saw_lease(LeaseSeen(clock.now() + 9.5, "a@host"))
    assert node.beats_show_lease()
    node.beat_saw_lease_at -= 3 * 2.0 + 0.1  # type: ignore[operator]
    # then it reads a live holder's lease every half TTL again, as with no beats at all
    assert not node.beats_show_lease()
    assert node.lease_interval() == pytest.approx(5.0)


def test_a_standby_fed_by_its_heartbeat_takes_over_a_clean_stop_within_a_beat(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bidding.nodes.heartbeat import Heartbeat
    from tests.unit.test_registry import PROFILE, _registered_worker

    # given two nodes' sweepers (their phases doing nothing), the standby's heartbeat reading
    # the lease for it: beats every 0.25 s, a TTL of 2.5 s (a standby without beats would
    # read the lease every 1.25 s, and see a clean stop up to that late)
    fast = settings.model_copy(update={"heartbeat_interval": 0.25, "heartbeat_ttl": 2.5})
    for name in sweeper.PHASES:
        monkeypatch.setattr(sweeper, name,
                            lambda ctx, name=name: (0, 1) if name == "check_winners" else 0)
    holder, standby = (sweeper.Sweeper(fast, Celery(n, broker="memory://",
                                                    set_as_current=False), holder=f"{n}@host")
                       for n in ("n1", "n2"))
    reads: list[str] = []
    real_look = lease.look
    monkeypatch.setattr(lease, "look", lambda *a, **k: reads.append(a[1]) or real_look(*a, **k))
    beats = Heartbeat(fast, PROFILE, _registered_worker(fast, at=clock.now()),
                      lease=(lease.SWEEPER, standby.saw_lease))
    holder.start()
    standby.start()
    beats.start()
    try:
        # when both run for 2 s
        threading.Event().wait(2.0)
        # then the holder swept, and the standby read the lease only as it started
        assert holder.leading and not standby.leading
        assert reads.count("n2@host") == 1, reads
        # when the holder stops cleanly
        holder.stop()
        stopped = clock.now()
        # then the standby sweeps after its next beat, sooner than its own reading would
        while not standby.leading and clock.now() - stopped < 3:
            threading.Event().wait(0.01)
        assert standby.leading and clock.now() - stopped < 1.0
    finally:
        beats._loop.stop()
        for node in (holder, standby):
            node.stop()


def test_a_node_workers_heartbeat_reads_the_lease_for_its_own_sweeper(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import bidding
    from bidding.app import HeartbeatStep, SweeperStep
    from bidding.nodes import incarnation
    from bidding.nodes.profile import PROFILE_ENV

    # (the worker's node step registers this process's incarnation: put back afterwards)
    monkeypatch.setattr(incarnation, "_current", incarnation._current)
    monkeypatch.delenv(incarnation.BOOT_ENV, raising=False)
    # given a node worker built as `bidding worker` builds it (its consumer's steps made, not
    # started: an in-memory broker, a SQLite store)
    profile = tmp_path / "wired.toml"
    profile.write_text('name = "wired"\ncapabilities = ["x"]\ncapacity = 1\n')
    monkeypatch.setenv(PROFILE_ENV, str(profile))
    app = Celery("wired", broker="memory://", backend="cache+memory://", set_as_current=False)
    app.conf.bidding_database_url = f"sqlite:///{tmp_path}/store.db"
    bidding.install(app)
    # (Building a worker's pool marks the process as one whose tasks must not wait on
    # results, for good: put back as it was, for the tests that run after this one here.)
    monkeypatch.setattr(celery_state, "_task_join_will_block",
                        celery_state._task_join_will_block)
    worker = app.WorkController(pool_cls="solo", hostname="wired@host", without_mingle=True,
                                without_gossip=True, without_heartbeat=True)
    # then its heartbeat reads the sweeper lease, and tells this worker's own sweeper
    steps = worker.consumer.blueprint.steps
    beats, sweeping = steps[HeartbeatStep.name].heartbeat, steps[SweeperStep.name].sweeper
    assert beats is not None and beats.lease is not None
    assert beats.lease == (lease.SWEEPER, sweeping.saw_lease)
