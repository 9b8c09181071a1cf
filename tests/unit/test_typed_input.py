"""Typed input: a definition without an input schema is checked against its task's signature
and type hints (``bidding.submit`` and POST /aitp/tasks), naming the field and the type."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from pydantic import BaseModel

import bidding
from bidding.api.app import create_app
from bidding.config import celery_conf
from bidding.graphs.typed import task_input, type_errors
from bidding.graphs.validate import GraphValidationError
from bidding.nodes.registry import invalidate_cache


class Order(BaseModel):
    item: str
    quantity: int


def make_app(store_url: str) -> Celery:
    app = Celery("typed", set_as_current=False)
    app.conf.update(celery_conf("memory://", "cache+memory://"),
                    bidding_database_url=store_url, bidding_bid_mode="ask")

    @app.task(shared=False, base=bidding.BiddingTask, bind=True, name="t.split",
              capability="split")
    def split(self: Any, text: str, parts: int = 2) -> list[str]:
        return [text]

    @app.task(shared=False, base=bidding.BiddingTask, name="t.order", capability="order",
              pydantic=True)
    def order(order: Order, note: str | None = None) -> dict[str, Any]:
        return order.model_dump()

    @app.task(shared=False, base=bidding.BiddingTask, name="t.loose", capability="loose")
    def loose(value, **rest):  # type: ignore[no-untyped-def]
        return value

    return app


@pytest.fixture
def app(store_url: str) -> Celery:
    invalidate_cache()
    return make_app(store_url)


def single(capability: str, values: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {"name": "one step", "agent_capability": capability, "input_values": values, **more}


def refused(app: Celery, definition: dict[str, Any]) -> list[str]:
    with pytest.raises(GraphValidationError) as raised:
        bidding.submit(definition, app=app)
    return raised.value.errors


# --- the schema a signature gives ----------------------------------------------------------


def test_a_signature_and_its_hints_make_a_json_schema(app: Celery) -> None:
    taken = task_input(app.tasks["t.split"].run)
    assert taken is not None
    assert taken.schema == {
        "type": "object",
        "properties": {"text": {"type": "string"}, "parts": {"type": "integer"}},
        "required": ["text"], "additionalProperties": False}
    model = task_input(app.tasks["t.order"].run)
    assert model is not None
    assert model.schema["properties"]["order"]["required"] == ["item", "quantity"]
    assert type_errors(taken, {"text": "ok", "parts": "5"}) == [
        ("parts", "expected integer, got '5' (parts: int)")]


# --- bidding.submit --------------------------------------------------------------------------


def test_submit_refuses_a_value_of_the_wrong_type_naming_the_field_and_the_type(
    app: Celery,
) -> None:
    assert refused(app, single("split", {"text": 123})) == [
        "input.text: expected string, got 123 (text: str), in task t.split (split)"]


def test_submit_names_a_missing_argument_and_an_unknown_one(app: Celery) -> None:
    assert refused(app, single("split", {"txt": "a"})) == [
        "input.txt: task t.split (split) takes no argument 'txt' (it takes: parts, text)",
        "input.text: missing; task t.split (split) needs argument 'text' (str)"]


def test_submit_takes_the_values_given_with_the_call_into_account(app: Celery) -> None:
    with pytest.raises(GraphValidationError) as raised:
        bidding.submit(single("split", {}), app=app, input={"text": 7})
    assert raised.value.errors == [
        "input.text: expected string, got 7 (text: str), in task t.split (split)"]


def test_a_pydantic_model_argument_is_checked_field_by_field(app: Celery) -> None:
    assert refused(app, single("order", {"order": {"item": "tea", "quantity": "two"}})) == [
        "input.order.quantity: expected integer, got 'two' (order: Order), "
        "in task t.order (order)"]
    assert refused(app, single("order", {"order": {"item": "tea"}, "note": 3})) == [
        "input.note: expected string or null, got 3 (note: str | None), in task t.order (order)",
        "input.order: 'quantity' is a required property (order: Order), in task t.order (order)"]


def test_a_subtasks_literal_input_is_checked_and_another_subtasks_output_is_not(
    app: Celery,
) -> None:
    graph = {"name": "two steps", "subtasks": [
        {"subtask_id": "a", "agent_capability": "split", "input": {"text": "x", "parts": "2"}},
        {"subtask_id": "b", "agent_capability": "split", "depends_on": ["a"],
         "input": {"text": "${a.output.result}"}},
    ]}
    assert refused(app, graph) == [
        "subtask a: input.parts: expected integer, got '2' (parts: int), "
        "in task t.split (split)"]


def test_an_input_schema_of_the_definition_is_the_one_that_counts(app: Celery) -> None:
    # given a definition whose own input schema takes a number for text
    definition = single("split", {"text": 123},
                        input={"type": "object", "properties": {"text": {"type": "number"}}})
    # then the task's hints are not applied over it
    assert bidding.submit(definition, app=app).id


def test_untyped_and_open_signatures_take_anything(app: Celery) -> None:
    assert bidding.submit(single("loose", {"value": object.__name__, "other": 1}), app=app).id


# --- POST /aitp/tasks ------------------------------------------------------------------------


def test_post_a_task_whose_input_has_the_wrong_type_is_422_naming_field_and_type(
    app: Celery,
) -> None:
    client = TestClient(create_app(app))
    answer = client.post("/aitp/tasks", json=single("split", {"text": 123}))
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"] == [{
        "loc": ["body"], "type": "invalid_definition",
        "msg": "input.text: expected string, got 123 (text: str), in task t.split (split)"}]
    good = client.post("/aitp/tasks", json=single("split", {"text": "a b"}))
    assert good.status_code == 201, good.text
