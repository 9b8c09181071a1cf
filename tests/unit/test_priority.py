"""Priority has one meaning everywhere (0-9 or a name, higher is more urgent), is translated
for each broker once, and Celery's steering options are refused on a bidding task."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from celery import Celery

import bidding
from bidding.auction.celery_options import merge_priority, refuse_steering, routed_tasks
from bidding.config import celery_conf
from bidding.errors import ConfigurationError
from bidding.execution.priority import execution_queue, message_priority
from bidding.graphs.spec import PRIORITY_LEVELS, load_definition
from bidding.models import parse_priority, priority_label


def make_app(broker: str) -> Celery:
    app = Celery("t", set_as_current=False)
    app.conf.update(celery_conf(broker))
    bidding.install(app)
    return app


@pytest.mark.parametrize(("given", "level"), [
    ("high", 8), ("normal", 5), ("low", 2), ("HIGH", 8), (" Low ", 2), (0, 0), (9, 9), ("7", 7),
])
def test_a_priority_is_a_name_or_an_integer_from_0_to_9(given: Any, level: int) -> None:
    # given a name in any case, or an integer 0-9, then it is that level
    assert parse_priority(given) == level


@pytest.mark.parametrize("given", ["urgent", 10, -1, 2.5, True, None, "", [8]])
def test_anything_else_is_refused_naming_the_field_and_the_choices(given: Any) -> None:
    # when the priority is not one, then the error names the field, the value and the choices
    with pytest.raises(ConfigurationError) as info:
        parse_priority(given, "apply_async(priority=...)")
    message = str(info.value)
    assert message.startswith(f"apply_async(priority=...): {given!r} is not a priority")
    assert '"high" (8), "normal" (5), "low" (2)' in message
    assert "higher is more urgent" in message


def test_a_task_graphs_high_normal_and_low_are_the_call_options_levels() -> None:
    # given a task graph's AITP priorities, then they mean what bidding={"priority": ...} means
    assert PRIORITY_LEVELS == {"HIGH": 8, "NORMAL": 5, "LOW": 2}
    # and a subtask's priority takes the same names and numbers
    defn = load_definition({"name": "g", "subtasks": [
        {"subtask_id": "a", "agent_capability": "x", "priority": "high"}]})
    assert defn.subtasks[0].priority == 8
    with pytest.raises(ConfigurationError, match=r"subtasks\.0\.priority: 12 is not a priority"):
        load_definition({"name": "g", "subtasks": [
            {"subtask_id": "a", "agent_capability": "x", "priority": 12}]})


def test_a_priority_is_shown_with_its_name() -> None:
    assert priority_label(8) == "8 (high)"
    assert priority_label(5) == "5 (normal)"
    assert priority_label(7) == "7"


def test_on_redis_the_message_carries_the_priority_reversed_as_kombu_reads_it() -> None:
    # given an app on Redis: kombu reads its lowest-numbered band first
    app = make_app("redis://127.0.0.1:6379/0")
    # then the most urgent task carries the lowest number, and high/normal/low fall in kombu's
    # default bands (0-2, 3-5, 6-8) one each
    assert [message_priority(app, p) for p in (9, 8, 5, 2, 0)] == [0, 1, 4, 7, 9]
    # and the execution queue is a plain one (Redis takes no queue arguments)
    assert not execution_queue(app, "north").queue_arguments


def test_on_rabbitmq_the_queue_takes_priorities_and_the_message_carries_them_as_they_are() -> None:
    # given an app on RabbitMQ
    app = make_app("amqp://guest:guest@127.0.0.1:5672//")
    # then higher is more urgent on the broker too
    assert [message_priority(app, p) for p in (9, 8, 5, 2, 0)] == [9, 8, 5, 2, 0]
    # and a node's execution queue is declared with x-max-priority, by callers and node alike
    queue = execution_queue(app, "north")
    assert queue.name == "exec.north"
    assert queue.queue_arguments == {"x-max-priority": 9}
    assert app.amqp.queues["exec.north"] is queue
    assert execution_queue(app, "north") is queue


def test_a_quorum_queue_is_declared_without_the_argument_it_refuses() -> None:
    # given an app whose missing queues are made as quorum queues
    app = make_app("amqp://guest:guest@127.0.0.1:5672//")
    app.conf.task_create_missing_queue_type = "quorum"
    # then the execution queue keeps its type and gets no x-max-priority
    arguments = execution_queue(app, "south").queue_arguments or {}
    assert "x-max-priority" not in arguments


@pytest.mark.parametrize("option", ["queue", "routing_key", "exchange"])
def test_a_caller_steering_a_bidding_task_to_a_queue_is_refused_and_told_how_to_steer(
    option: str,
) -> None:
    # given a bidding task
    app = make_app("memory://")

    @app.task(base=bidding.BiddingTask, name="demo.tasks.steer", shared=False)
    def steer() -> None:
        """Never runs."""

    # when a caller passes a queue option, then the call is refused, naming it, before any I/O
    with pytest.raises(ConfigurationError) as info:
        steer.apply_async(**{option: "fast"})
    message = str(info.value)
    assert message.startswith(f"demo.tasks.steer.apply_async: {option} cannot be set")
    assert "required_skills" in message and "preferred_node" in message


def test_refuse_steering_lets_unset_options_through() -> None:
    refuse_steering("t", {"queue": None, "countdown": 3})


def test_celerys_priority_is_the_calls_and_must_agree_with_the_bidding_option() -> None:
    # given Celery's priority= on a call: it is the call's priority
    merged: dict[str, Any] = {"priority": 2}
    merge_priority("t", merged, {}, "high", None)
    assert merged["priority"] == 8
    # and both given alike is fine
    merged = {"priority": "high"}
    merge_priority("t", merged, {"priority": "high"}, 8, None)
    assert merged["priority"] == 8
    # but both given differently is refused, naming both
    with pytest.raises(ConfigurationError, match=r"priority=2 and bidding=\{'priority': 8\}"):
        merge_priority("t", {"priority": 8}, {"priority": 8}, 2, None)
    # and a bad one names Celery's option
    with pytest.raises(ConfigurationError, match=r"t\.apply_async\(priority=\.\.\.\): 11"):
        merge_priority("t", {}, {}, 11, None)


def test_the_tasks_own_priority_is_a_default_below_its_bidding_defaults() -> None:
    # given @app.task(priority=7) and no priority elsewhere: the task's own
    merged: dict[str, Any] = {}
    merge_priority("t", merged, {}, None, 7)
    assert merged["priority"] == 7
    # but a bidding default or the call's bidding option comes first
    merged = {"priority": "low"}
    merge_priority("t", merged, {}, None, 7)
    assert merged["priority"] == "low"


def test_install_warns_once_of_a_route_that_matches_a_bidding_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given task_routes that send a bidding task and a plain task to queues of their own
    app = make_app("memory://")
    app.conf.task_routes = {"demo.tasks.*": {"queue": "fast"}}

    @app.task(base=bidding.BiddingTask, name="demo.tasks.routed", shared=False)
    def routed() -> None:
        """Never runs."""

    @app.task(name="demo.tasks.plain", shared=False)
    def plain() -> None:
        """Never runs."""

    # when the app is finalized
    with caplog.at_level(logging.WARNING, logger="bidding.app"):
        app.finalize()
    # then one warning names the bidding task and its route, and none the plain task
    warnings = [r.getMessage() for r in caplog.records if "task_routes" in r.getMessage()]
    assert len(warnings) == 1
    assert "demo.tasks.routed to queue 'fast'" in warnings[0]
    assert "not followed" in warnings[0]
    assert routed_tasks(app.amqp.router, ["demo.tasks.plain"], "celery") == {
        "demo.tasks.plain": "fast"}


def test_waiting_tasks_that_come_due_together_are_announced_most_urgent_first(
    settings: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import uuid

    from bidding.auction import announce
    from bidding.context import Context
    from bidding.lifecycle import states
    from bidding.models import Announcement
    from tests.stored import add_announcement

    # given deferred tasks (waiting for a capable node) due together: low ones due first,
    # then a high one, a normal one, and another high one due last
    due = [("low-1", "low", 100.0), ("low-2", 2, 101.0), ("high-1", "high", 102.0),
           ("normal", None, 103.0), ("high-2", 8, 104.0)]
    ids = {}
    for label, priority, at in due:
        options = {} if priority is None else {"priority": priority}
        stored = add_announcement(
            settings.database_url,
            Announcement(task_id=str(uuid.uuid4()), task_name="t.wait", task_type="wait",
                         announced_at=at, **options),
            states.DEFERRED, [], due_at=at)
        ids[stored.task_id] = label
    opened: list[str] = []
    monkeypatch.setattr(announce, "open_auction",
                        lambda ctx, a, new=True: opened.append(ids[a.task_id]) or True)
    # when the announcer's pass finds them due (a capable node came back)
    app = Celery("t", broker="memory://", set_as_current=False)
    assert announce.announce_due(Context(settings, app), now=200.0) == 5
    # then the most urgent go first (oldest first among equals), the least urgent last
    assert opened == ["high-1", "high-2", "normal", "low-1", "low-2"]
