"""Celery's revoke on bidding tasks, on real node workers: the caller sees REVOKED as with a
plain task, and the store ends the task FAILED with the reason instead of keeping it ASSIGNED or
EXECUTING for ever (Redis broker; the store on SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid

import pytest
from celery.exceptions import TaskRevokedError
from sqlalchemy import select

import bidding
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow
from tests.integration.app import shared, sleepy
from tests.integration.conftest import Cluster, wait_for

pytestmark = pytest.mark.integration


def row(cluster: Cluster, task_id: str) -> AnnouncementRow | None:
    with read_session(cluster.settings.database_url) as s:
        found = s.scalars(select(AnnouncementRow)
                          .where(AnnouncementRow.task_id == task_id)).one_or_none()
        if found is not None:
            s.expunge(found)
        return found


def told_every_node(cluster: Cluster, task_id: str) -> bool:
    """Revoke ``task_id`` and say whether all three nodes acknowledged it; revoking twice is
    harmless, and on a loaded machine one node's reply can miss a single broadcast's window."""
    replies = cluster.app.control.revoke(task_id, reply=True, timeout=5, limit=3)
    return len(replies) == 3


def test_a_task_revoked_before_it_runs_ends_failed_and_never_runs(cluster: Cluster) -> None:
    # given a task id every node has been told is revoked
    task_id = str(uuid.uuid4())
    assert wait_for(lambda: told_every_node(cluster, task_id), timeout=20)
    # when a bidding task is announced under that id
    result = shared.apply_async((1,), task_id=task_id)
    # then it is auctioned and awarded, and the caller sees it revoked
    with pytest.raises(TaskRevokedError):
        result.get(timeout=15)
    # and the store ends it FAILED with the reason, its body never ran
    assert wait_for(lambda: (r := row(cluster, task_id)) is not None and r.state == "FAILED")
    found = row(cluster, task_id)
    assert found is not None and found.error == "revoked: dropped before it started"
    assert cluster.executions(task_id) == 0
    kinds = [m.kind for m in bidding.explain(task_id, app=cluster.app).messages]
    assert kinds[-2:] == ["AWARDED", "TASK_FAILED"]


def test_a_running_task_revoked_with_terminate_ends_failed(cluster: Cluster) -> None:
    # given a long task running on its node
    result = sleepy.delay(30)
    assert wait_for(lambda: (r := row(cluster, result.id)) is not None
                    and r.state == "EXECUTING", timeout=15)
    # when the caller revokes it with terminate=True
    result.revoke(terminate=True)
    # then the caller sees it revoked, and the store ends it FAILED, saying it was terminated
    with pytest.raises(TaskRevokedError):
        result.get(timeout=15)
    assert wait_for(lambda: (r := row(cluster, result.id)) is not None and r.state == "FAILED")
    found = row(cluster, result.id)
    assert found is not None and found.error is not None
    assert found.error.startswith("revoked: terminated")
