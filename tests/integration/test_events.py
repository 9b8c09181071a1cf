"""What Flower sees, read as Flower reads it (the worker events on the broker): a node that
drops a stale copy of a task's execution does not leave the task shown on its worker."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from bidding.execution.dispatch import send_execution
from bidding.models import Announcement
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow
from tests.integration.app import shared
from tests.integration.conftest import NODES, Cluster, wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def events(cluster: Cluster) -> Iterator[list[dict[str, Any]]]:
    """Every event the workers send while the test runs (Flower's view is built from them)."""
    seen: list[dict[str, Any]] = []
    conn = cluster.app.connection_for_read()
    receiver = cluster.app.events.Receiver(conn, handlers={"*": seen.append})
    thread = threading.Thread(target=receiver.capture, kwargs={"limit": None, "wakeup": False},
                              daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        receiver.should_stop = True
        thread.join(timeout=5)
        conn.release()


def test_a_dropped_stale_copy_leaves_the_task_on_the_worker_that_ran_it(
    cluster: Cluster, events: list[dict[str, Any]],
) -> None:
    # given a task that ran and succeeded on one node
    result = shared.apply_async((7,))
    ran_on = result.get(timeout=30)["node"]
    # when a stale copy of its execution reaches another node (a resend that crossed the
    # first delivery), which drops it after its worker has announced receiving it
    with read_session(cluster.settings.database_url) as s:
        row = s.get(AnnouncementRow, result.id)
        assert row is not None
        announcement = Announcement.model_validate(row.spec)
    other = next(n for n in NODES if n != ran_on)
    send_execution(cluster.app, announcement, other, cluster.settings)
    assert wait_for(lambda: any(e.get("uuid") == result.id
                                and e["hostname"].startswith(f"{other}@") for e in events), 15)

    # then the task's last event is its success, from the worker that ran it: Flower shows it
    # there, not on the node that dropped the copy
    def last() -> dict[str, Any]:
        return [e for e in events if e.get("uuid") == result.id][-1]

    assert wait_for(lambda: last()["hostname"].startswith(f"{ran_on}@")
                    and last()["type"] == "task-succeeded", 10), last()
    assert cluster.executions(result.id) == 1
