"""Which nodes a retry may go to (DESIGN rule 7), through real workers on SQLite and PostgreSQL.

A retry avoids the nodes that failed the task while others can do it, and the node that just
failed while another can; it never runs out of candidates because of its own exclusions, so a
task gets every attempt its policy allows and ends with its own error. Each test names its own
task type, so no test's learned history changes another's bids.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

import bidding
from bidding.store import read_session
from bidding.store.schema import Message
from tests.integration.app import failing, flaky
from tests.integration.conftest import NODES, Cluster

pytestmark = pytest.mark.integration

FAST = {"max_retries": 3, "backoff": "fixed", "base_ms": 50}


def fresh_type() -> str:
    """A task type no node has history of."""
    return f"retries-{uuid.uuid4().hex[:8]}"


def attempts_on(cluster: Cluster, task_id: str) -> list[str]:
    """The node of each attempt that started, in order."""
    with read_session(cluster.settings.database_url) as s:
        return list(s.scalars(select(Message.node).where(
            Message.task_id == task_id, Message.kind == "TASK_ACCEPTED").order_by(Message.id)))


def test_a_fourth_attempt_on_three_nodes_still_runs(cluster: Cluster) -> None:
    # given a task that fails three times, with three retries, on three capable nodes
    key = f"four-{uuid.uuid4().hex}"
    result = flaky.apply_async((key, 3), bidding={"retry_policy": FAST,
                                                  "task_type": fresh_type()})
    # when the caller waits, then the fourth attempt's value arrives
    assert result.get(timeout=30)["attempts"] == 4
    # and the first three attempts went to three different nodes, the fourth to one of them
    # other than the node that had just failed
    tried = attempts_on(cluster, result.id)
    assert len(tried) == 4 and set(tried[:3]) == set(NODES), tried
    assert tried[3] != tried[2]


def test_a_task_that_runs_out_of_retries_ends_with_its_own_error(cluster: Cluster) -> None:
    # given a task that always fails, with three retries, on three capable nodes
    result = failing.apply_async(("boom",), bidding={"retry_policy": FAST,
                                                     "task_type": fresh_type()})
    # when the caller waits, then it gets the task's own error, not "No bidders registered"
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=30)
    # and the policy's four attempts all ran
    assert len(attempts_on(cluster, result.id)) == 4
    assert cluster.executions(result.id) == 4
    status = bidding.status.task_status(cluster.settings.database_url, result.id)
    assert status.state == "FAILED" and "ValueError: boom" in (status.error or "")
    # and status and explain show every attempt with its node and its own error
    for text in (status.render(), bidding.explain(result.id, app=cluster.app).render()):
        shown = [line.strip() for line in text.splitlines() if line.strip().startswith("#")]
        assert len(shown) == 4, text
        assert all("failed: ValueError: boom" in line for line in shown), text
        assert all(line.split()[1].rstrip(":") in NODES for line in shown), text


def test_a_retry_with_one_capable_node_goes_back_to_it(cluster: Cluster) -> None:
    # given a task only east can do (gpu) that fails its first attempt, with one retry
    key = f"one-{uuid.uuid4().hex}"
    result = flaky.apply_async((key, 1), bidding={
        "retry_policy": {**FAST, "max_retries": 1}, "required_skills": ["gpu"],
        "task_type": fresh_type()})
    # when the caller waits, then the retry ran on east again and succeeded
    value = result.get(timeout=30)
    assert value == {"node": "east", "attempts": 2}
    assert attempts_on(cluster, result.id) == ["east", "east"]


def test_a_retry_that_defers_for_want_of_nodes_is_not_stranded(cluster: Cluster) -> None:
    # given a gpu task that fails once, with one retry and on_capability_unavailable="defer"
    key = f"defer-{uuid.uuid4().hex}"
    result = flaky.apply_async((key, 1), bidding={
        "retry_policy": {**FAST, "max_retries": 1}, "required_skills": ["gpu"],
        "fallbacks": {"on_capability_unavailable": "defer", "defer_seconds": 3600},
        "task_type": fresh_type()})
    # when the caller waits, then the retry is not deferred (east may take it again): it runs
    assert result.get(timeout=30)["attempts"] == 2
    with read_session(cluster.settings.database_url) as s:
        kinds = list(s.scalars(select(Message.kind).where(Message.task_id == result.id)))
    assert "DEFERRED" not in kinds
