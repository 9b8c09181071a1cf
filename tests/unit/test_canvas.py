"""Celery's canvas options of a bidding call: kept in the announcement as JSON, put into the
execution message as ``send_task`` would, and handed to the result backend on a failure that
no worker saw (no broker: the message is built, not sent)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest
from celery import Celery

from bidding.config import Settings
from bidding.context import Context
from bidding.errors import ConfigurationError, NoBidsError
from bidding.execution.canvas import caller_request, canvas_of, message_options
from bidding.execution.dispatch import send_execution
from bidding.execution.report import fail_caller
from bidding.models import Announcement


def plain(signature: Any) -> dict[str, Any]:
    """A signature as JSON carries it (tuples become lists)."""
    result: dict[str, Any] = json.loads(json.dumps(dict(signature)))
    return result


@pytest.fixture
def app() -> Celery:
    app = Celery("canvas", broker="memory://", backend="cache+memory://", set_as_current=False)

    @app.task(name="t.next", shared=False)
    def following(value: Any) -> Any:
        return value

    return app


def test_link_link_error_and_canvas_options_are_kept_as_plain_json(app: Celery) -> None:
    # given a call with a callback, two errbacks and the options a chord header gets
    nxt = app.tasks["t.next"]
    canvas = canvas_of(app, nxt.s(1), [nxt.si("a"), nxt.si("b")],
                       {"chain": [nxt.s(2)], "group_id": "g1", "group_index": 2,
                        "chord": nxt.s(), "countdown": 5})
    # then each is a plain dict of the signature, in Celery's shape
    assert canvas.callbacks == [plain(nxt.s(1))]
    assert [e["args"] for e in canvas.errbacks or []] == [["a"], ["b"]]
    assert canvas.chain == [plain(nxt.s(2))]
    assert (canvas.group_id, canvas.group_index) == ("g1", 2)
    assert canvas.chord == plain(nxt.s())
    # and outside a task there is no parent
    assert canvas.root_id is None and canvas.parent_id is None
    # and the announcement keeps it through its JSON round trip (the store's spec)
    announcement = Announcement(task_id="t1", task_name="t.work", task_type="w", canvas=canvas)
    assert Announcement.model_validate(announcement.model_dump(mode="json")).canvas == canvas


def test_a_callback_that_is_not_json_is_refused_naming_it(app: Celery) -> None:
    # given a callback whose argument JSON cannot carry
    nxt = app.tasks["t.next"]
    # when the call is made, then it is refused at once, naming link and the reason
    with pytest.raises(ConfigurationError, match="link: not JSON serializable"):
        canvas_of(app, nxt.s(datetime.now()))
    with pytest.raises(ConfigurationError, match="link_error: expected Celery signatures"):
        canvas_of(app, None, "t.next")


def test_the_execution_message_carries_the_canvas(app: Celery,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # given an announcement made inside a running task, with a callback and a chain
    nxt = app.tasks["t.next"]
    canvas = canvas_of(app, nxt.s(), None, {"chain": [nxt.s(9)], "root_id": "r0",
                                            "parent_id": "p0", "group_id": "g"})
    announcement = Announcement(task_id="t1", task_name="t.work", task_type="w", args=[1],
                       canvas=canvas)
    sent: list[Any] = []
    monkeypatch.setattr(app.amqp, "send_task_message",
                        lambda producer, name, message, **kw: sent.append(message))
    # when the award sends its execution
    send_execution(app, announcement, "north")
    # then the message has them where a worker looks: the body's embed and the headers
    (message,) = sent
    embed = message.body[2]
    assert embed["callbacks"] == [plain(nxt.s())] and embed["chain"] == [plain(nxt.s(9))]
    assert message.headers["root_id"] == "r0" and message.headers["parent_id"] == "p0"
    assert message.headers["group"] == "g"
    assert message_options(canvas)["callbacks"] == canvas.callbacks


def test_a_failure_no_worker_saw_reaches_the_errbacks_and_the_chain(
        app: Celery, monkeypatch: pytest.MonkeyPatch, store_url: str) -> None:
    # given a task with an errback and a chain after it, that fails before any attempt ran
    nxt = app.tasks["t.next"]
    announcement = Announcement(task_id="t1", task_name="t.work", task_type="w",
                       canvas=canvas_of(app, None, nxt.si("x"), {"chain": [nxt.s()]}))
    seen: dict[str, Any] = {}

    def errbacks(request: Any, exc: BaseException, traceback: Any) -> None:
        seen["errbacks"] = (request.id, request.errbacks, exc)

    def fail_chain(chain: Any, exc: BaseException, *_: Any, **__: Any) -> None:
        seen["chain"] = chain

    monkeypatch.setattr(app.backend, "_call_task_errbacks", errbacks)
    monkeypatch.setattr(app.backend, "_fail_chain", fail_chain)
    error = NoBidsError("No bids received")
    # when the caller's result is failed
    fail_caller(Context(Settings(database_url=store_url), app), announcement, error)
    # then the result backend stored it and handed the errbacks and chain the failure
    assert app.AsyncResult("t1").state == "FAILURE"
    assert seen["errbacks"] == ("t1", announcement.canvas.errbacks, error)
    assert seen["chain"] == announcement.canvas.chain
    # and the request is the one a worker would have had (its own root when it has none)
    assert caller_request(announcement).root_id == "t1"
