"""Seed 002's watch of delegated work on real workers (two nodes, the store on SQLite and on
PostgreSQL), on a compressed schedule: checks 0.3, 0.6 and 1 s apart, escalation at the check
after the third.

A task whose node goes silent (SIGSTOP) is escalated, and the webhook, the node workers' log,
``bidding status`` and ``bidding explain`` say so; ``bidding reset`` puts it back under watch
(it escalates again while its node stays silent) and, once the node is continued (SIGCONT),
it completes as usual. A task that reports progress is never escalated, where one as long that
does not is, saying its node is alive and running it.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from bidding.cli import main
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow, Message
from tests.integration.app import sleepy, slow, steps
from tests.integration.conftest import Cluster, store_cluster, wait_for
from tests.integration.test_lifecycle import Hook, webhook

pytestmark = pytest.mark.integration

__all__ = ["webhook"]  # the webhook receiver's fixture, shared with test_lifecycle

#: The compressed schedule, and a heartbeat TTL long enough that the liveness watchdog does not
#: take a stopped node's task away while the watch looks at it (silent: 3 beats of 0.3 s).
WATCH_ENV = {"BIDDING_INITIAL_CHECK_WAIT_TIME": "0.3", "BIDDING_CHECK_BACKOFF_FACTOR": "2",
             "BIDDING_MAX_CHECK_WAIT_TIME": "1", "BIDDING_MAX_CHECK_ATTEMPTS": "3",
             "BIDDING_HEARTBEAT_INTERVAL": "0.3", "BIDDING_HEARTBEAT_TTL": "60"}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def watched(request: pytest.FixtureRequest, redis_broker: str, webhook: str,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two node workers (north, south) watching on the compressed schedule, both checking
    (each check claimed once), the store on SQLite or PostgreSQL."""
    directory = tmp_path_factory.mktemp(f"cluster-watch-{request.param}")
    with store_cluster(request.param, directory,
                       extra_env={**WATCH_ENV, "BIDDING_NOTIFY_URL": webhook},
                       nodes={"north": ["shared"], "south": ["shared"]}) as cluster:
        yield cluster


def task_row(cluster: Cluster, task_id: str) -> AnnouncementRow:
    with read_session(cluster.settings.database_url) as s:
        found = s.get(AnnouncementRow, task_id)
        assert found is not None
        s.expunge(found)
        return found


def escalations(cluster: Cluster, task_id: str) -> list[str]:
    """The reasons of the task's WATCH_ESCALATED messages, in order."""
    with read_session(cluster.settings.database_url) as s:
        return [d["reason"] for d in s.scalars(select(Message.detail).where(
            Message.task_id == task_id, Message.kind == "WATCH_ESCALATED").order_by(Message.id))]


def command(cluster: Cluster, *args: str) -> str:
    """Run a ``bidding`` command against the cluster's store; its output (exit code 0)."""
    done = CliRunner().invoke(main, [*args, "--database-url", cluster.settings.database_url])
    assert done.exit_code == 0, done.output
    return done.output


def node_logs(cluster: Cluster) -> str:
    return "\n".join(Path(n.log).read_text(errors="replace")
                     for n in cluster.federation.nodes.values())


def test_a_task_whose_node_goes_silent_is_escalated_and_reset_puts_it_back_under_watch(
    watched: Cluster,
) -> None:
    # given a 6 s task running on some node
    result = slow.apply_async((f"watch-{uuid.uuid4().hex}", 6.0),
                              bidding={"task_type": f"watch-{uuid.uuid4().hex[:8]}"})
    assert wait_for(lambda: task_row(watched, result.id).state == "EXECUTING", 20)
    node = task_row(watched, result.id).assigned_node
    assert node is not None
    # when its node's worker stops (SIGSTOP: no heartbeat, no progress, nothing said)
    watched.federation.kill(node, signal.SIGSTOP)
    try:
        # then the other node's watch escalates it after three checks without news
        assert wait_for(lambda: escalations(watched, result.id), 15)
        reason = escalations(watched, result.id)[0]
        assert reason.startswith(f"silent after 3 checks (node {node} silent for ")
        # and says so: the webhook (the task_escalated signal's), the log, status, explain
        assert wait_for(lambda: any(h.get("task_id") == result.id for h in Hook.received), 5)
        hook = next(h for h in Hook.received if h.get("task_id") == result.id)
        assert (hook["event"], hook["reason"], hook["watch"]) == ("task_escalated", reason, True)
        assert f"task {result.id} escalated: {reason}" in node_logs(watched)
        assert f"state: EXECUTING, escalated: {reason}" in command(watched, "status", result.id)
        assert f"watch: escalated: {reason}" in command(watched, "explain", result.id)
        # when an operator resets it
        cleared = command(watched, "reset", result.id)
        after = task_row(watched, result.id)
        # then its checking state is cleared and it is watched again: it escalates again
        assert "checking state cleared (was 3 check(s) without news, escalated" in cleared
        assert (after.escalated_at, after.escalation) == (None, None)
        # (0 checks at the reset; on a loaded machine the first check after it, due 0.3 s
        # later, may have come before this read)
        assert after.check_attempts in (0, 1)
        assert wait_for(lambda: len(escalations(watched, result.id)) == 2, 15)
        assert task_row(watched, result.id).state == "EXECUTING"  # never failed for it
    finally:
        watched.federation.kill(node, signal.SIGCONT)
    # when its node continues, then the task completes there as usual, and is no longer watched
    assert result.get(timeout=30)["node"] == node
    assert task_row(watched, result.id).state == "SUCCESS"
    assert "escalated" not in command(watched, "status", result.id)


def test_a_task_that_reports_progress_is_never_escalated(watched: Cluster) -> None:
    # given two 6 s tasks on live nodes: one reports progress every 0.5 s, one says nothing
    talking = steps.apply_async((12, 0.5), bidding={"task_type": f"w-{uuid.uuid4().hex[:8]}"})
    quiet = sleepy.apply_async((6.0,), bidding={"task_type": f"w-{uuid.uuid4().hex[:8]}"})
    # when both run to completion
    assert talking.get(timeout=30) == 12
    assert quiet.get(timeout=30)["slept"] == 6.0
    # then the one that reported progress was never escalated
    assert escalations(watched, talking.id) == []
    # and the quiet one was, its node alive and running it (a flag: it still succeeded)
    node = task_row(watched, quiet.id).assigned_node
    assert escalations(watched, quiet.id) == [
        f"silent after 3 checks (node {node} alive and running it)"]
