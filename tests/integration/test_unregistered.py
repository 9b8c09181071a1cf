"""A task the node workers do not have (defined only in the caller's process): nodes that are
asked refuse to bid on it, saying why, and an execution that reaches a node without it (bids
made by proxy) ends the task FAILED with the reason instead of being sent again for ever."""

from __future__ import annotations

from typing import Any

import pytest
from celery.exceptions import NotRegistered

import bidding
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow
from tests.integration.app import app
from tests.integration.conftest import Cluster, wait_for

pytestmark = pytest.mark.integration


@app.task(base=bidding.BiddingTask, bind=True, name="tests.integration.caller_only",
          task_type="caller_only", required_skills=["shared"])
def caller_only(self: Any, value: int) -> int:
    """Registered here, in the caller, and in no node worker's app."""
    return value


def state_and_error(cluster: Cluster, task_id: str) -> tuple[str, str]:
    with read_session(cluster.settings.database_url) as s:
        row = s.get(AnnouncementRow, task_id)
        assert row is not None
        return row.state, row.error or ""


def test_nodes_refuse_to_bid_on_a_task_they_do_not_have(cluster: Cluster) -> None:
    # given a task only the caller registers, and nodes that are asked for their bids
    # when it is called
    result = caller_only.apply_async((1,), bidding={"bid_mode": "ask"})
    # then every node refuses, naming the task, and the caller learns why
    with pytest.raises(bidding.NoBidsError, match="every answering node refused") as caught:
        result.get(timeout=30)
    assert "task tests.integration.caller_only is not registered on this node" in str(
        caught.value)
    assert state_and_error(cluster, result.id)[0] == "FAILED"


def test_an_execution_a_node_cannot_run_ends_failed_with_the_reason(cluster: Cluster) -> None:
    # given the same task, bid for by proxy (the announcer cannot know what the nodes run)
    # when it is awarded and sent to its winner
    result = caller_only.apply_async((2,), bidding={"bid_mode": "proxy"})
    # then the winner's worker cannot run it: the caller gets Celery's NotRegistered, and the
    # store ends the task FAILED saying which node and why, at once
    with pytest.raises(NotRegistered, match=r"tests\.integration\.caller_only"):
        result.get(timeout=30)
    assert wait_for(lambda: state_and_error(cluster, result.id)[0] == "FAILED", 10)
    error = state_and_error(cluster, result.id)[1]
    assert "cannot run tests.integration.caller_only" in error
    assert "no task of that name is registered in its workers' app" in error
