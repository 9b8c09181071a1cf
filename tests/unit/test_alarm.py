"""A retry is announced at its time by the process that scheduled it (``auction.alarm``), not
at the next pass of a sweeper that idles a second between passes."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from celery import Celery

from bidding import clock
from bidding.auction import alarm, announce, due_claim
from bidding.config import Settings
from bidding.context import Context
from bidding.lifecycle import states
from bidding.models import Announcement
from tests.stored import add_announcement


class Recorder:
    """An announcer that notes what it was asked to announce, and when."""

    def __init__(self, fail_first: bool = False) -> None:
        self.calls: list[tuple[float, list[str]]] = []
        self.fail_first = fail_first
        self.rang = threading.Event()

    def __call__(self, ctx: Context, task_ids: list[str]) -> None:
        self.calls.append((clock.now(), sorted(task_ids)))
        self.rang.set()
        if self.fail_first and len(self.calls) == 1:
            raise ConnectionError("the store went away")


CTX = Context(settings=Settings(database_url="sqlite://"), app=None)  # type: ignore[arg-type]


def test_a_retry_is_announced_at_its_time_not_before() -> None:
    # given a process's alarm
    recorder = Recorder()
    clock_alarm = alarm.Alarm(recorder)
    # when a retry is set for 0.3 s from now
    at = clock.now() + 0.3
    assert clock_alarm.set(CTX, "t-1", at)
    # then it rings once, at its time (not before, and not a sweeper's second later)
    assert recorder.rang.wait(2)
    (rang_at, ids), = recorder.calls
    assert ids == ["t-1"] and at <= rang_at < at + 0.5
    assert clock_alarm.pending() == 0


def test_retries_due_together_are_announced_in_one_look_and_earlier_ones_first() -> None:
    # given three retries: two due together, one set later but due sooner
    recorder = Recorder()
    clock_alarm = alarm.Alarm(recorder)
    now = clock.now()
    clock_alarm.set(CTX, "late-a", now + 1.0)
    clock_alarm.set(CTX, "late-b", now + 1.0)
    clock_alarm.set(CTX, "soon", now + 0.1)
    # when they have all come due
    deadline = time.monotonic() + 3
    while sum(len(ids) for _, ids in recorder.calls) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    # then the sooner one rang first, the two due together in one announcement
    assert [ids for _, ids in recorder.calls] == [["soon"], ["late-a", "late-b"]]


def test_a_retry_minutes_away_is_left_to_the_sweeper() -> None:
    # given a retry due in ten minutes
    recorder = Recorder()
    clock_alarm = alarm.Alarm(recorder)
    # when the alarm is asked for it
    # then it declines (a second's lateness is noise there), and holds nothing
    assert not clock_alarm.set(CTX, "far", clock.now() + 600)
    assert clock_alarm.pending() == 0


def test_an_alarm_whose_announcement_fails_logs_it_and_rings_the_next(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given an announcer that fails once (the store unreachable for a moment)
    recorder = Recorder(fail_first=True)
    clock_alarm = alarm.Alarm(recorder)
    clock_alarm.set(CTX, "first", clock.now() + 0.05)
    assert recorder.rang.wait(2)
    # when another retry comes due after it
    clock_alarm.set(CTX, "second", clock.now() + 0.05)
    deadline = time.monotonic() + 3
    while len(recorder.calls) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    # then the failure was logged as left to the sweeper, and the next still rang
    assert [ids for _, ids in recorder.calls] == [["first"], ["second"]]
    assert "the sweeper will" in caplog.text


def due_retry(settings: Any, due_at: float) -> tuple[str, Context]:
    """A retry (attempt 2) waiting in the store until ``due_at``, and a context to announce
    it in."""
    task_id = str(uuid.uuid4())
    add_announcement(settings.database_url,
                     Announcement(task_id=task_id, task_name="t.retry", task_type="retry",
                                  announced_at=50.0, attempt=2),
                     states.RETRYING, [], due_at=due_at)
    return task_id, Context(settings, Celery("t", broker="memory://", set_as_current=False))


def test_announcing_by_id_announces_only_those_tasks_that_are_due(
    settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given three retries waiting in the store: two due, one not yet
    ids = {}
    for label, due in (("mine", 100.0), ("another's", 100.0), ("not yet", 300.0)):
        task_id, ctx = due_retry(settings, due_at=due)
        ids[task_id] = label
    opened: list[str] = []
    monkeypatch.setattr(announce, "open_auction",
                        lambda ctx, a, new=True: opened.append(ids[a.task_id]) or True)
    mine = next(t for t, label in ids.items() if label == "mine")
    late = next(t for t, label in ids.items() if label == "not yet")
    # when the alarm of the process that scheduled "mine" and "not yet" rings at 200
    assert announce.announce_due(ctx, now=200.0, task_ids=[mine, late]) == 1
    # then only "mine" is announced: another's is the sweeper's (or its own alarm's), and
    # "not yet" is not due
    assert opened == ["mine"]


def test_of_two_announcers_finding_one_due_retry_only_one_announces_it(
    settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a retry due in the store
    task_id, ctx = due_retry(settings, due_at=100.0)
    opened: list[str] = []
    spans: list[str] = []
    real_span, real_claim = announce.tracing.announce_span, due_claim.claim

    def span(a: Announcement) -> Any:
        spans.append(a.task_id)
        return real_span(a)

    raced: list[bool] = []

    def racing_claim(url: str, task: str, attempt: int, now: float) -> float | None:
        if not raced:
            raced.append(True)
            # when another announcer (the sweeper, while the retry's alarm rings) read the
            # task as due too, and claims and announces it first
            assert announce.announce_due(ctx, now=200.0) == 1
        return real_claim(url, task, attempt, now)

    monkeypatch.setattr(announce.tracing, "announce_span", span)
    monkeypatch.setattr(due_claim, "claim", racing_claim)
    monkeypatch.setattr(announce, "open_auction",
                        lambda ctx, a, new=True: opened.append(a.task_id) or True)
    assert announce.announce_due(ctx, now=200.0, task_ids=[task_id]) == 0
    # then it was announced once: one auction, one announcement span (Flower's ANNOUNCED
    # is sent by the auction, so once too)
    assert opened == [task_id] and spans == [task_id]


def test_an_announcement_that_fails_gives_its_claim_back(
    settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a retry due in the store, and an announcer whose auction fails (the broker down)
    task_id, ctx = due_retry(settings, due_at=100.0)

    def broker_down(ctx: Context, a: Announcement, new: bool = True) -> bool:
        raise ConnectionError("the broker is restarting")

    monkeypatch.setattr(announce, "open_auction", broker_down)
    assert announce.announce_due(ctx, now=200.0) == 0
    # when the next pass comes, a moment later
    opened: list[str] = []
    monkeypatch.setattr(announce, "open_auction",
                        lambda ctx, a, new=True: opened.append(a.task_id) or True)
    # then the task is due again at once (not held by the failed announcer's claim)
    assert announce.announce_due(ctx, now=200.5) == 1 and opened == [task_id]
