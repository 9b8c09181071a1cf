"""The auction's phases as Celery task events (no broker: the dispatcher is captured), and what
``celery.events.state`` (Flower's task model) makes of them next to a worker's own events."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from celery.events.state import State

from bidding.lifecycle import events
from bidding.models import Announcement

Sent = list[tuple[str, dict[str, Any]]]


def app() -> Celery:
    return Celery("t", broker="memory://", set_as_current=False)


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Celery, Sent]]:
    """An app that sends task events, and every event it publishes (type, fields)."""
    celery = app()
    celery.conf.task_send_sent_event = True
    captured: Sent = []

    class Dispatcher:
        def __init__(self, hostname: str) -> None:
            self.hostname = hostname

        def publish(self, kind: str, fields: dict[str, Any], producer: Any,
                    **_: Any) -> None:
            assert producer is not None
            captured.append((kind, {"hostname": self.hostname, **fields}))

    monkeypatch.setattr(events, "_dispatcher", lambda _, hostname: Dispatcher(hostname))
    yield celery, captured


def announcement(attempt: int = 1) -> Announcement:
    return Announcement(task_id=str(uuid.uuid4()), task_name="proj.extract", task_type="x",
                        args=["https://example.org/a.pdf"], attempt=attempt)


def flower_view(stream: Sent) -> list[tuple[str, str]]:
    """Feed ``stream`` to Celery's event state, as Flower does; the task's (state, worker)
    after each event."""
    state = State()
    seen = []
    for clock, (kind, fields) in enumerate(stream, start=1):
        now = time.time()
        state.event({"type": kind, "timestamp": now, "local_received": now, "clock": clock,
                     **fields})
        [task] = state.tasks.values()
        seen.append((task.state, task.worker.hostname))
    return seen


def test_each_phase_is_the_tasks_state_in_flower_until_it_ends(
        sent: tuple[Celery, Sent]) -> None:
    celery, captured = sent
    task = announcement()
    # given the auction's events for a task: announced, awarded (by the auctioneer), executing
    # (by the winner's worker)
    events.announced(celery, task, candidates=2)
    events.awarded(celery, task, "redfin", "exec.redfin")
    worker = "redfin@host"
    events.send(celery, events.EXECUTING, task.task_id, hostname=worker, name=task.task_name)
    announced, awarded, executing = captured
    # when Flower's state reads them between the worker's own events
    received = ("task-received", {"uuid": task.task_id, "hostname": worker,
                                  "name": task.task_name})
    started = ("task-started", {"uuid": task.task_id, "hostname": worker})
    succeeded = ("task-succeeded", {"uuid": task.task_id, "hostname": worker, "result": "1"})
    view = flower_view([announced, awarded, received, started, executing, succeeded])
    # then the first event creates the task in state ANNOUNCED, from auctioneer@<host>
    auctioneer = events.auctioneer()
    assert view[0] == ("ANNOUNCED", auctioneer) and auctioneer.startswith("auctioneer@")
    # and AWARDED holds while the worker receives and starts it (a custom state outranks
    # RECEIVED and STARTED), so the winner's EXECUTING is what says it runs, then SUCCESS
    assert [s for s, _ in view] == ["ANNOUNCED", "AWARDED", "AWARDED", "AWARDED", "EXECUTING",
                                    "SUCCESS"]
    assert view[-1][1] == worker
    # and the fields Flower shows carry what fits: the name, the arguments, the queue
    assert announced[1]["name"] == "proj.extract" and "example.org" in announced[1]["args"]
    assert (announced[1]["retries"], awarded[1]["routing_key"]) == (0, "exec.redfin")


def test_a_retry_is_announced_again_and_a_reaward_and_escalation_are_states_too(
        sent: tuple[Celery, Sent]) -> None:
    celery, captured = sent
    task = announcement(attempt=2)
    # given a retried task (Celery's RETRY), announced again, awarded, then re-awarded
    retry = ("task-retried", {"uuid": task.task_id, "hostname": "north@h"})
    events.announced(celery, task, candidates=3)
    events.awarded(celery, task, "north", "exec.north")
    events.reawarded(celery, task, "north", "south", "exec.south", "node north lost")
    events.deferred(celery, task, "no live node offers ocr")
    events.escalated(celery, task, "deferred 3 times")
    events.failed(celery, task, RuntimeError("deferred 3 times"))
    # then Flower shows each in turn, and the failure last
    states = [s for s, _ in flower_view([retry, *captured])]
    assert states == ["RETRY", "ANNOUNCED", "AWARDED", "REAWARDED", "DEFERRED", "ESCALATED",
                      "FAILURE"]
    assert captured[0][1]["retries"] == 1 and captured[2][1]["routing_key"] == "exec.south"


def test_nothing_is_sent_unless_the_process_sends_task_events(
        sent: tuple[Celery, Sent]) -> None:
    celery, captured = sent
    # given an app that sends no task events (neither worker -E nor task_send_sent_event)
    celery.conf.task_send_sent_event = False
    celery.conf.worker_send_task_events = False
    # when the auction goes through its phases, then no event is sent
    task = announcement()
    events.announced(celery, task, candidates=1)
    events.awarded(celery, task, "north", "exec.north")
    assert captured == []
    # but a forced one (restoring Flower's view after a stale copy) is
    events.send(celery, "task-succeeded", task.task_id, hostname="north@h", force=True)
    assert [kind for kind, _ in captured] == ["task-succeeded"]


def test_a_send_that_fails_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # given an app whose broker cannot take events
    celery = app()
    celery.conf.worker_send_task_events = True

    class Broken:
        def publish(self, *_: Any, **__: Any) -> None:
            raise ConnectionError("broker down")

    monkeypatch.setattr(events, "_dispatcher", lambda *_: Broken())
    # when a phase is sent, then nothing is raised: events are a view
    events.announced(celery, announcement(), candidates=1)


def test_each_process_publishes_with_its_own_dispatcher_per_sender() -> None:
    # given an app: its dispatchers are made once per sender name in a process
    celery = app()
    first = events._dispatcher(celery, "auctioneer@h")
    assert events._dispatcher(celery, "auctioneer@h") is first
    assert events._dispatcher(celery, "north@h") is not first
    assert first.hostname == "auctioneer@h" and not first.enabled  # it publishes on a producer


def flower_workers(stream: Sent, received_at: float) -> dict[str, bool]:
    """Flower's worker list after ``stream`` (received at ``received_at``): each name it lists
    and whether it shows it Online (``flower.views.workers.WorkersView``: the hostnames its
    events counted that Celery's state knows as workers, Online while alive)."""
    flower_events = pytest.importorskip("flower.events")
    state = flower_events.EventsState()
    for clock, (kind, fields) in enumerate(stream, start=1):
        state.event({"type": kind, "timestamp": received_at, "local_received": received_at,
                     "clock": clock, **fields})
    return {name: state.workers[name].alive for name in state.counter if name in state.workers}


def test_flower_lists_the_auctioneer_by_name_online_only_while_auctions_happen(
        sent: tuple[Celery, Sent]) -> None:
    celery, captured = sent
    task = announcement()
    # given an auction's events from the process that ran it, then the winner's own
    events.announced(celery, task, candidates=2)
    events.awarded(celery, task, "redfin", "exec.redfin")
    worker = "redfin@host"
    stream = [*captured, ("task-received", {"uuid": task.task_id, "hostname": worker,
                                            "name": task.task_name}),
              ("task-succeeded", {"uuid": task.task_id, "hostname": worker, "result": "1"})]
    # when Flower reads them as they happen
    listed = flower_workers(stream, time.time())
    # then it lists the auctioneer by a name that says so, beside the node's worker, both
    # Online (Celery's state takes each task event as its sender's heartbeat)
    auctioneer = events.auctioneer()
    assert auctioneer.startswith("auctioneer@") and not auctioneer.startswith("redfin@")
    assert listed == {auctioneer: True, worker: True}
    # and two minutes after the last auction, without a heartbeat of its own, it is Offline
    assert flower_workers(stream, time.time() - 130)[auctioneer] is False
