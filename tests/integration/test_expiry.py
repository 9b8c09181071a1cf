"""A task's expiry through real workers: one node of capacity 1 (one pool process), the only
one that can do ``shared`` work, so a slow task keeps it busy and the next one waits in its
queue. A task not started by its expiry never starts, and its caller hears it expired."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

import bidding
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow, Episode, Message
from tests.integration.app import flaky, gpu, shared, slow
from tests.integration.conftest import Cluster, store_cluster, wait_for

pytestmark = pytest.mark.integration

SOLO = {"solo": ["shared"]}


@pytest.fixture(scope="module")
def solo(redis_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One node, ``solo``, with one pool process: it runs one task at a time."""
    directory = tmp_path_factory.mktemp("expiry")
    with store_cluster("sqlite", directory, nodes=SOLO, capacity=1,
                       extra_env={"BIDDING_BID_MODE": "auto"}) as c:
        yield c


def row(cluster: Cluster, task_id: str) -> AnnouncementRow:
    with read_session(cluster.settings.database_url) as s:
        found = s.get(AnnouncementRow, task_id)
        assert found is not None
        s.expunge(found)
        return found


def kinds(cluster: Cluster, task_id: str) -> list[str]:
    with read_session(cluster.settings.database_url) as s:
        return list(s.scalars(select(Message.kind).where(Message.task_id == task_id)
                              .order_by(Message.id)))


def episodes(cluster: Cluster, task_id: str) -> int:
    with read_session(cluster.settings.database_url) as s:
        return len(s.scalars(select(Episode).where(Episode.task_id == task_id)).all())


def fresh_type() -> str:
    return f"expiry-{uuid.uuid4().hex[:8]}"


def test_a_task_that_expires_while_the_only_capable_node_is_busy_never_runs(
    solo: Cluster,
) -> None:
    # given the only capable node busy with a 4 s task on its one pool process
    key = f"busy-{uuid.uuid4().hex[:8]}"
    busy = slow.apply_async((key, 4.0), bidding={"task_type": fresh_type()})
    assert wait_for(lambda: solo.counters.get(f"started:{key}") is not None, 15)
    # when a task that expires in 1 s is called (Celery's own option): it is awarded to the
    # busy node, and its execution waits in that node's queue
    called = time.monotonic()
    result = shared.apply_async((1,), expires=1.0)
    # then the caller hears it expired at its expiry, not when the node is free again
    with pytest.raises(bidding.TaskExpiredError, match="expired: not started by its expiry"):
        result.get(timeout=15)
    assert time.monotonic() - called < 3.5
    # and the store says so: FAILED, the reason, an EXPIRED message
    stored = row(solo, result.id)
    assert stored.state == "FAILED" and stored.error is not None
    assert stored.error.startswith("expired: not started by its expiry")
    assert stored.expires_at is not None and stored.expires_at <= stored.finished_at
    assert "EXPIRED" in kinds(solo, result.id)
    assert "error: expired: not started by its expiry" in bidding.status.task_status(
        solo.settings.database_url, result.id).render()
    explained = bidding.explain(result.id, app=solo.app).render()
    assert "expired" in explained and "not started by its expiry" in explained
    # when the node is free again and has taken its queue past that message (one task at a
    # time, in order: a task called after it has run)
    assert busy.get(timeout=15)["node"] == "solo"
    assert shared.delay(2).get(timeout=15)["value"] == 2
    # then the expired task's body never ran, and it counts against no node
    assert solo.executions(result.id) == 0
    assert episodes(solo, result.id) == 0
    assert row(solo, result.id).state == "FAILED"


def test_a_retry_due_after_the_expiry_does_not_run(solo: Cluster) -> None:
    # given a task that always fails, retried 2 s after a failure, that expires in 1 s
    key = f"flaky-{uuid.uuid4().hex[:8]}"
    result = flaky.apply_async((key, 5), expires=1.0, bidding={
        "task_type": fresh_type(), "retry_same_node": True,
        "retry_policy": {"max_retries": 3, "base_ms": 2000}})
    # when its first attempt fails
    with pytest.raises(bidding.TaskExpiredError) as err:
        result.get(timeout=15)
    # then no retry is planned: the expiry is the task's, and the retry would be due after it;
    # the caller hears it expired, with the attempt's own error
    assert "expired: retry 1 would be due in 2s" in str(err.value)
    assert "attempt 1 fails on purpose" in str(err.value)
    assert int(solo.counters.get(f"attempts:{key}") or 0) == 1
    stored = row(solo, result.id)
    assert stored.state == "FAILED" and "RETRYING" not in kinds(solo, result.id)
    time.sleep(2.5)  # past when the retry would have been due
    assert int(solo.counters.get(f"attempts:{key}") or 0) == 1


def test_a_deferred_task_whose_expiry_passes_ends(solo: Cluster) -> None:
    # given a task no live node can do, deferred for 30 s at a time, that expires in 1 s
    result = gpu.apply_async((1,), bidding={
        "expires": 1.0,
        "fallbacks": {"on_capability_unavailable": "defer", "defer_seconds": 30}})
    assert wait_for(lambda: row(solo, result.id).state == "DEFERRED", 5)
    assert "unless it starts by then" in bidding.status.task_status(
        solo.settings.database_url, result.id).render()
    # when its expiry passes, then it ends, saying it expired while deferred
    called = time.monotonic()
    with pytest.raises(bidding.TaskExpiredError, match="deferred, waiting for a capable node"):
        result.get(timeout=10)
    assert time.monotonic() - called < 3.0
    assert row(solo, result.id).state == "FAILED"
    assert solo.executions(result.id) == 0


def test_a_task_scheduled_past_its_expiry_never_starts(solo: Cluster) -> None:
    # given a task put off by 5 s that expires at a datetime 1 s away (an ISO string in the
    # bidding options, as JSON would carry it)
    at = (datetime.now(UTC) + timedelta(seconds=1)).isoformat()
    result = shared.apply_async((3,), countdown=5, bidding={"expires": at})
    # then it ends at its expiry, never announced
    with pytest.raises(bidding.TaskExpiredError, match="scheduled"):
        result.get(timeout=10)
    assert "ANNOUNCED" not in kinds(solo, result.id)
    assert solo.executions(result.id) == 0


def test_a_bad_expires_is_refused_at_the_call(solo: Cluster) -> None:
    # when a call gives a negative expiry, then it is refused, naming the option
    with pytest.raises(bidding.ConfigurationError, match=r"expires: .*negative"):
        shared.apply_async((1,), expires=-1)
