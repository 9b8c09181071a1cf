"""Seed 002's checking arithmetic (``bidding.observe.watch``) on a fake clock: backoff, the
time gate, escalation, news first, per-node policies and what a node's heartbeat says."""

from __future__ import annotations

from pathlib import Path

import pytest

from bidding.config import load_settings
from bidding.errors import ProfileError
from bidding.nodes.profile import parse_profile
from bidding.observe.watch import (
    Action,
    CheckPolicy,
    Liveness,
    NodeReport,
    WatchState,
    WorkerBeat,
    decide,
    idle_pass_interval,
    last_news,
    pass_interval,
    policy_for,
    report,
    view,
)

SEED = CheckPolicy()  # the seed's defaults: 30 s, x2, 1800 s, 10 attempts
SILENT = NodeReport(Liveness.SILENT, "node north silent for 40.0s")


def watch(policy: CheckPolicy, news: float, until: float,
          node: NodeReport = SILENT) -> list[tuple[float, Action, WatchState]]:
    """Look at a task delegated at ``news`` whenever its next check is due, until ``until``
    or its escalation; every look that did something, with its time."""
    state, now, seen = WatchState(), news, []
    while now <= until:
        decision = decide(now, state, policy, news, node)
        if decision.action is not Action.WAIT:
            seen.append((now, decision.action, decision.state))
        state = decision.state
        if decision.action is Action.ESCALATE:
            break
        assert state.next_check_time is not None
        now = state.next_check_time
    return seen


def test_checks_back_off_from_30_s_doubling_up_to_1800_s_and_escalate_after_the_tenth() -> None:
    # given the seed's policy and a task delegated at t=1000 that never has news again
    # when the watch looks at it each time a check is due
    seen = watch(SEED, news=1000.0, until=1e9)
    # then the first look only schedules the first check, 30 s after the delegation
    assert seen[0][:2] == (1000.0, Action.SCHEDULE) and seen[0][2].next_check_time == 1030.0
    # and the ten checks come 30, 60, 120, 240, 480, 960 s apart, then every 1800 s
    checks = [t for t, action, _ in seen if action is Action.CHECKED]
    gaps = [b - a for a, b in zip([1000.0, *checks], checks, strict=False)]
    assert gaps == [30, 60, 120, 240, 480, 960, 1800, 1800, 1800, 1800]
    assert [s.check_attempts for _, a, s in seen if a is Action.CHECKED] == list(range(1, 11))
    # and the check due after the tenth escalates, saying why and what the node said
    at, action, state = seen[-1]
    assert action is Action.ESCALATE and at == checks[-1] + 1800
    assert state.escalated and state.escalated_at == at and state.check_attempts == 10
    assert state.escalation == "silent after 10 checks (node north silent for 40.0s)"


def test_a_look_before_the_next_check_is_due_does_nothing() -> None:
    # given a task checked once (next check due at t=160)
    state = WatchState(check_attempts=1, next_check_time=160.0, since=100.0)
    # when the watch looks at it earlier
    decision = decide(159.9, state, SEED, news=100.0, node=SILENT)
    # then nothing changes
    assert decision.action is Action.WAIT and decision.state == state


def test_news_clears_the_checks_and_the_schedule_starts_again_from_it() -> None:
    # given a task checked three times without news since t=100
    state = WatchState(check_attempts=3, next_check_time=500.0, since=100.0)
    # when it reports progress at t=400 and the watch looks at t=420
    decision = decide(420.0, state, SEED, news=400.0, node=SILENT)
    # then its checks are cleared and its next check is 30 s after the report
    assert decision.action is Action.SCHEDULE
    assert decision.state == WatchState(check_attempts=0, next_check_time=430.0, since=400.0)
    # and status shows the cleared state before the watch has written it
    assert view(state, news=400.0).check_attempts == 0
    # and a check due long after the news counts as the first check since the news
    late = decide(500.0, state, SEED, news=400.0, node=SILENT)
    assert late.action is Action.CHECKED
    assert late.state == WatchState(check_attempts=1, next_check_time=560.0, since=400.0)


def test_news_clears_an_escalation_and_without_news_it_is_only_reviewed() -> None:
    # given an escalated task
    escalated = WatchState(check_attempts=10, next_check_time=9000.0, since=100.0,
                           escalated_at=7200.0, escalation="silent after 10 checks (x)")
    # when its next look comes without news
    quiet = decide(9000.0, escalated, SEED, news=100.0, node=SILENT)
    # then it stays escalated (no second escalation) and is looked at again 1800 s later
    assert quiet.action is Action.REVIEWED and quiet.state.escalation == escalated.escalation
    assert quiet.state.next_check_time == 10800.0 and quiet.state.escalated_at == 7200.0
    # when it has news instead (its node accepted it again, or it reported progress)
    news = decide(9000.0, escalated, SEED, news=8990.0, node=SILENT)
    # then the escalation is cleared and the watch starts again
    assert not news.state.escalated and news.state.check_attempts == 0
    assert not view(escalated, news=8990.0).escalated


def test_a_reset_task_is_scheduled_from_the_reset_not_from_its_delegation() -> None:
    # given a task delegated at t=100 and reset by hand at t=5000 (no next check)
    state = WatchState(check_attempts=0, next_check_time=None, since=5000.0)
    # when the watch looks at it
    decision = decide(5001.0, state, SEED, news=100.0, node=SILENT)
    # then its first check is due 30 s after the reset
    assert decision.action is Action.SCHEDULE and decision.state.next_check_time == 5030.0


def test_a_node_profile_overrides_the_global_policy_key_by_key() -> None:
    # given global settings and a node whose [checking] table sets two of the four keys
    settings = load_settings({"bidding_initial_check_wait_time": 0.3,
                              "bidding_max_check_wait_time": 1.0}, environ={})
    profile = parse_profile({"name": "slowpoke", "capabilities": ["x"],
                             "checking": {"initial_check_wait_time": 120,
                                          "max_check_attempts": 2}})
    # when the policies are made
    node = policy_for(settings, profile.checking.overrides())
    # then the node's keys win and the rest stay global
    assert policy_for(settings) == CheckPolicy(0.3, 2.0, 1.0, 10)
    assert node == CheckPolicy(120.0, 2.0, 1.0, 2)
    # and with max 2 attempts a task on that node escalates after its second check
    seen = watch(node, news=0.0, until=1e6)
    assert [a for _, a, _ in seen] == [Action.SCHEDULE, Action.CHECKED, Action.CHECKED,
                                       Action.ESCALATE]


def test_a_bad_checking_table_is_refused_naming_the_key() -> None:
    # given profiles with a misspelt and an impossible [checking] key
    # when they are loaded, then each is refused naming the key
    with pytest.raises(ProfileError, match=r"checking\.max_check_attempt"):
        parse_profile({"name": "n", "capabilities": ["x"],
                       "checking": {"max_check_attempt": 3}})
    with pytest.raises(ProfileError, match=r"checking\.check_backoff_factor"):
        parse_profile({"name": "n", "capabilities": ["x"],
                       "checking": {"check_backoff_factor": 0.5}})


def test_news_is_the_award_the_start_or_this_attempts_latest_progress_report() -> None:
    assert last_news(100.0, None, {}, 1) == 100.0
    assert last_news(100.0, 105.0, {"at": 130.0, "attempt": 1}, 1) == 130.0
    # a report of an earlier attempt is not news of this one
    assert last_news(200.0, 205.0, {"at": 150.0, "attempt": 1}, 2) == 205.0


def test_the_node_says_running_it_not_running_it_or_silent_from_its_heartbeats() -> None:
    # given node north with two workers: w1 beat just now running t1, w2 silent for 9 s
    beats = [WorkerBeat("north@w1", "north", 100.0, frozenset({"t1"})),
             WorkerBeat("north@w2", "north", 91.0, frozenset({"t2"})),
             WorkerBeat("south@w1", "south", 100.0, frozenset({"t3"}))]

    def said(task: str, worker: str | None, node: str = "north") -> tuple[Liveness, str]:
        found = report(task, node, worker, beats, now=100.5, silent_after=3.0)
        return found.liveness, found.text

    # then each check reads what the heartbeats say
    assert said("t1", "north@w1") == (Liveness.RUNNING, "node north alive and running it")
    assert said("t9", "north@w1") == (Liveness.UNAWARE, "node north alive, not running it")
    assert said("t9", None) == (Liveness.UNAWARE, "node north alive, not running it")
    assert said("t2", "north@w2") == (
        Liveness.SILENT, "worker north@w2 silent for 9.5s, node north alive")
    # and a node none of whose workers beats, or that never did, is silent
    assert report("t", "north", None, beats, now=200.0, silent_after=3.0).text == (
        "node north silent for 100.0s")
    assert report("t", "ghost", None, beats, now=200.0, silent_after=3.0).text == (
        "node ghost never heartbeated")


def test_a_monitor_looks_four_times_per_first_wait_within_bounds() -> None:
    assert pass_interval(30.0, 1) == 1.0
    assert pass_interval(0.3, 1) == pytest.approx(0.075)
    assert pass_interval(0.01, 1) == 0.05
    assert pass_interval(30.0, 16) == 4.0


def test_an_idle_monitor_spaces_its_passes_out_to_a_quarter_of_the_shortest_wait() -> None:
    # given the default first wait (30 s), one node, and passes that found nothing
    # then the first four keep the busy pace, the next ones double, up to a quarter of 30 s
    assert [idle_pass_interval(30.0, 1, n) for n in (0, 4, 5, 6, 7, 50)] == [
        1.0, 1.0, 2.0, 4.0, 7.5, 7.5]
    # and with 16 nodes sharing the work, each monitor's pace is four times slower, both ways
    assert idle_pass_interval(30.0, 16, 0) == 4.0
    assert idle_pass_interval(30.0, 16, 50) == 30.0
    # and a short first wait leaves no room to slow down (a check must not be later)
    assert idle_pass_interval(0.3, 1, 50) == pytest.approx(0.075)


def test_a_monitor_comes_back_to_its_busy_pace_at_the_first_pass_that_writes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a monitor on an empty store, after six passes that found nothing
    from bidding.config import Settings
    from bidding.observe import monitor as monitor_module
    from bidding.observe.checking import Pass
    from bidding.store import upgrade

    url = f"sqlite:///{tmp_path}/store.db"
    upgrade(url)
    monitor = monitor_module.Monitor(Settings(database_url=url))
    for _ in range(6):
        monitor.run_once()
    assert monitor.interval() == 4.0
    # when a pass writes a check (a delegated task came due)
    monkeypatch.setattr(monitor_module, "check_due", lambda *_a, **_k: Pass(written=1))
    monitor.run_once()
    # then the next wait is the busy one again
    assert monitor.interval() == 1.0


@pytest.mark.parametrize(
    ("factor", "attempts"),
    [(1e40, 8), (1e40, 1_000), (10.0, 10**9), (2.0, 1_024), (float("inf"), 3),
     (1e308, 2)],
)
def test_the_wait_saturates_at_its_cap_for_huge_factors_and_attempt_numbers(
        factor: float, attempts: int) -> None:
    # given a policy with a huge backoff factor, or a task checked a huge number of times
    # (a policy from a node's row: a version without bounds may have written it)
    policy = CheckPolicy(30.0, factor, 1800.0, 10)
    # when the wait after that many checks is computed
    wait = policy.wait(attempts)
    # then it is the cap, not an OverflowError
    assert wait == 1800.0


def test_the_wait_is_the_first_wait_before_any_check_whatever_the_factor() -> None:
    # given a huge factor, then the seed's
    # then no check yet waits the initial time, and the seed's schedule is exact
    assert CheckPolicy(30.0, float("inf"), 1800.0, 10).wait(0) == 30.0
    assert [SEED.wait(n) for n in range(8)] == [30, 60, 120, 240, 480, 960, 1800, 1800]
