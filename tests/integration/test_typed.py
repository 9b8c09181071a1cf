"""What a Celery user declares is honoured through real workers: a ``pydantic=True`` task
under ``BiddingTask`` (models in, models out, as in plain Celery), and the coordinator's
opt-in rules (``bidding_skill_keywords``, ``bidding_preferred_nodes``). Redis, SQLite."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

import bidding
from tests.integration.app import Order, order, untagged
from tests.integration.conftest import Cluster, store_cluster

pytestmark = pytest.mark.integration

RULES = {"BIDDING_SKILL_KEYWORDS": json.dumps({"Rendering": "gpu"}),
         "BIDDING_PREFERRED_NODES": json.dumps({"untagged_work": "south"})}


@pytest.fixture(scope="module")
def typed(redis_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The three test nodes, with the coordinator's rules set (nodes and this process)."""
    with store_cluster("sqlite", tmp_path_factory.mktemp("typed"), extra_env=RULES) as c:
        yield c


def test_a_pydantic_task_takes_a_dict_as_its_model_and_returns_the_models_dict(
    typed: Cluster,
) -> None:
    # when a pydantic=True bidding task is called with a dict, as in plain Celery
    result = order.delay({"item": "tea", "quantity": 3}, price=4)
    # then the body got the model (it asserts so) and the caller gets the result model's dict
    got = result.get(timeout=15)
    assert {k: got[k] for k in ("item", "total")} == {"item": "tea", "total": 12}
    assert got["node"] in ("north", "south", "east")


def test_a_pydantic_task_takes_the_model_itself_from_the_caller(typed: Cluster) -> None:
    # when it is called with the model (Celery dumps it to JSON for the message)
    result = order.delay(Order(item="cake", quantity=2))
    # then it runs as with the dict
    assert result.get(timeout=15)["total"] == 4


def test_a_pydantic_tasks_invalid_argument_fails_it_as_in_plain_celery(typed: Cluster) -> None:
    # when the dict does not make the model
    result = order.delay({"item": "tea", "quantity": "many"})
    # then the caller gets pydantic's ValidationError as Celery's JSON backend gives it back
    # (it cannot rebuild one: an Exception naming its class, as in plain Celery)
    with pytest.raises(Exception, match="ValidationError"):
        result.get(timeout=15)
    # and the task failed, its error naming the field
    why = bidding.explain(result.id, app=typed.app)
    assert why.state == "FAILED" and why.error is not None and "quantity" in why.error


def test_skills_inferred_from_a_keyword_send_the_task_to_the_node_that_has_them(
    typed: Cluster,
) -> None:
    # given bidding_skill_keywords {"rendering": "gpu"}: only east has gpu
    # when a task that names no skills is called about rendering
    results = [untagged.delay(f"{i}: RENDERING of a scene") for i in range(3)]
    # then each ran on east, and explain says why it required gpu
    assert {r.get(timeout=15)["node"] for r in results} == {"east"}
    why = bidding.explain(results[0].id, app=typed.app)
    assert why.required_skills == ["gpu"]
    assert ("  required skills inferred: bidding_skill_keywords: 'rendering' -> gpu "
            "(found in the task)") in why.render()


def test_a_task_type_mapped_to_a_node_prefers_it(typed: Cluster) -> None:
    # given bidding_preferred_nodes {"untagged_work": "south"}
    # when a task of that type is called, with no keyword in it
    result = untagged.apply_async(("plain text",), bidding={"strategy": "composite"})
    result.get(timeout=15)
    # then south was its preferred node, and its bid was multiplied by 1.1
    why = bidding.explain(result.id, app=typed.app)
    assert why.preferred_node == "south" and why.required_skills == []
    south = next(b for b in why.bids if b.node == "south")
    assert south.breakdown["multipliers"]["preferred_node"] == 1.1
    assert "preferred node inferred: bidding_preferred_nodes: task type 'untagged_work'" \
        in why.render()
