"""Workers that die and come back, through real worker processes on SQLite and PostgreSQL.

A worker restarted a second after a SIGKILL under the same name (as systemd, Kubernetes or
supervisord do) is a new incarnation: the attempt its predecessor was running goes to another
node as soon as the new one registers, not after the broker's visibility timeout (an hour on
Redis). Two workers of one node are not restarts of each other: one dying loses only its own
attempts. A winner busy with a backlog keeps its queued tasks; a winner that could start a
task and does not loses it after the schedule-to-start timeout.
"""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select

from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.profile import NodeProfile
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow, Message
from tests.integration.app import shared, slow
from tests.integration.conftest import (
    NODES,
    Cluster,
    finished_in_the_database_file,
    wait_for,
    write_profile,
)

pytestmark = pytest.mark.integration


def fresh_type() -> str:
    return f"incarnation-{uuid.uuid4().hex[:8]}"


def row(cluster: Cluster, task_id: str) -> AnnouncementRow:
    with read_session(cluster.settings.database_url) as s:
        found = s.get(AnnouncementRow, task_id)
        assert found is not None
        s.expunge(found)
        return found


def kinds(cluster: Cluster, task_id: str) -> list[tuple[str, str | None]]:
    with read_session(cluster.settings.database_url) as s:
        return [(m.kind, m.node) for m in s.scalars(
            select(Message).where(Message.task_id == task_id).order_by(Message.id))]


def running(cluster: Cluster, task_id: str) -> bool:
    return row(cluster, task_id).state == "EXECUTING"


def test_a_node_restarted_mid_task_loses_it_at_once_and_the_task_runs_elsewhere(
    cluster: Cluster,
) -> None:
    # given a 3 s task running on some node
    key = f"restart-{uuid.uuid4().hex}"
    result = slow.apply_async((key, 3.0), bidding={"task_type": fresh_type()})
    assert wait_for(lambda: running(cluster, result.id), 20)
    victim = row(cluster, result.id).assigned_node
    assert victim in NODES
    # when its worker is SIGKILLed and started again a second later under the same name
    restarted = cluster.federation.restart(victim, pause=1.0)
    cluster.federation.wait_registered(cluster.settings, victim, restarted)
    # then the task is handed on as soon as the new incarnation is seen, well before the
    # dead one's heartbeat would have expired (TTL 10 s) and an hour before Redis would
    # hand its message out again
    assert wait_for(lambda: any(k in ("REAWARDED", "RETRYING")
                                for k, _ in kinds(cluster, result.id)), 5)
    moved_after = time.time() - restarted
    value = result.get(timeout=30)
    assert value["node"] != victim and moved_after < 8
    # and the body ran to completion exactly once (its first run died with the worker)
    assert int(cluster.counters.get(f"finished:{key}") or 0) == 1
    log = kinds(cluster, result.id)
    lost = next(k for k in log if k[0] in ("REAWARDED", "RETRYING"))
    assert lost[0] == "REAWARDED"
    with read_session(cluster.settings.database_url) as s:
        reason = s.scalars(select(Message.detail).where(
            Message.task_id == result.id, Message.kind == "REAWARDED")).one()["reason"]
    assert "restarted" in reason and victim in reason
    # and the restarted node takes work again
    cluster.federation.wait_live(cluster.settings, [victim])
    assert shared.apply_async((7,), bidding={"preferred_node": victim, "strategy": "composite",
                                             "task_type": fresh_type()}).get(timeout=20)


def test_two_workers_of_one_node_are_not_restarts_of_each_other(
    cluster: Cluster, tmp_path: Path,
) -> None:
    # given node north served by two workers: its own (2 processes) and north-b (1 process)
    profile = write_profile(tmp_path, "north", NODES["north"])
    cluster.federation.add_worker(profile, "north-b", "-c", "1")
    since = time.time() - 60
    cluster.federation.wait_registered(cluster.settings, "north-b", since)
    try:
        # and three slow tasks on north, so that each of its workers runs at least one
        key = f"pair-{uuid.uuid4().hex}"
        task_type = fresh_type()
        results = [slow.apply_async((f"{key}-{i}", 4.0), bidding={
            "preferred_node": "north", "strategy": "preferred_only", "candidate_cap": 0,
            "task_type": task_type}) for i in range(3)]
        assert wait_for(lambda: all(running(cluster, r.id) for r in results), 20)
        on = {r.id: row(cluster, r.id).worker for r in results}
        host = socket.gethostname()
        assert set(on.values()) == {f"north@{host}", f"north-b@{host}"}, on
        # when north's own worker is SIGKILLed and not started again (north-b lives on)
        cluster.federation.kill("north")
        # then the attempts of the killed worker go elsewhere once its heartbeat expires,
        # though its node is still alive; north-b's attempt finishes where it runs
        for r in results:
            value = r.get(timeout=40)
            log = kinds(cluster, r.id)
            if on[r.id] == f"north-b@{host}":
                assert value["node"] == "north-b" and not any(
                    k in ("REAWARDED", "RETRYING") for k, _ in log), log
            else:
                assert any(k in ("REAWARDED", "RETRYING") for k, _ in log), log
        for i in range(3):
            assert int(cluster.counters.get(f"finished:{key}-{i}") or 0) == 1
    finally:
        cluster.federation.stop_node("north-b")
        started = cluster.federation.restart("north")
        cluster.federation.wait_registered(cluster.settings, "north", started)
        cluster.federation.wait_live(cluster.settings, ["north"])


def test_a_backlog_on_the_only_capable_node_does_not_trip_its_start_timeout(
    cluster: Cluster,
) -> None:
    # given four 2 s tasks only east can do, on east's two pool processes, each allowed 1 s
    # to start
    key = f"backlog-{uuid.uuid4().hex}"
    task_type = fresh_type()
    results = [slow.apply_async((f"{key}-{i}", 2.0), bidding={
        "required_skills": ["gpu"], "schedule_to_start_timeout": 1.0, "task_type": task_type})
        for i in range(4)]
    # when they run (the last two wait about 2 s in east's queue, while it is busy)
    values = [r.get(timeout=40) for r in results]
    # then all ran on east, once each, and none was taken from it for waiting in its queue
    assert [v["node"] for v in values] == ["east"] * 4
    for i, r in enumerate(results):
        assert int(cluster.counters.get(f"started:{key}-{i}") or 0) == 1
        assert not any(k in ("REAWARDED", "RETRYING") for k, _ in kinds(cluster, r.id))


def test_a_winner_that_could_start_a_task_and_does_not_loses_it(cluster: Cluster) -> None:
    # given a node whose execution queue nobody consumes (its pool idle, as when its
    # consumer is cancelled or its pool stuck while its main process heartbeats)
    profile = NodeProfile(name="idler", capabilities=["shared"], capacity=2,
                          price_per_unit=0.0, latency_ms=1, trust=90)
    heartbeat(cluster.settings, profile)
    try:
        # when it wins a task (preferred; bid for by proxy from its profile), with 1 s to
        # start it
        result = shared.apply_async((5,), bidding={
            "preferred_node": "idler", "strategy": "composite", "bid_mode": "proxy",
            "schedule_to_start_timeout": 1.0, "task_type": fresh_type()})
        assert row(cluster, result.id).assigned_node == "idler"
        # then it moves on after the timeout, and runs elsewhere
        value = result.get(timeout=20)
        assert value["node"] in NODES
        moved = next(k for k in kinds(cluster, result.id) if k[0] == "REAWARDED")
        assert moved[1] == value["node"]
    finally:
        cluster.bury("idler")


def sweeper_lease(cluster: Cluster) -> tuple[str, float]:
    """Who holds the sweeper lease (a worker's Celery name, ``north@host``), and until when."""
    from bidding.lifecycle.lease import SWEEPER
    from bidding.store.schema import Job

    with read_session(cluster.settings.database_url) as s:
        job = s.get(Job, SWEEPER)
        assert job is not None
        return job.last_by, job.due_at


def test_when_the_sweeping_node_stops_cleanly_another_sweeps_within_a_heartbeat(
    cluster: Cluster,
) -> None:
    import signal

    # given the node whose worker holds the federation's sweeper lease (the library's
    # default heartbeat: every 2 s)
    holder, _ = sweeper_lease(cluster)
    victim = next(name for name, worker in cluster.federation.nodes.items()
                  if holder.split("@")[0] == name)
    interval = cluster.settings.heartbeat_interval
    # when its worker stops cleanly (a warm shutdown gives the lease up)
    cluster.federation.kill(victim, signal.SIGTERM)
    try:
        assert wait_for(lambda: sweeper_lease(cluster)[0] != holder
                        or sweeper_lease(cluster)[1] == 0.0, timeout=20, interval=0.02)
        given_up = time.time()
        # then another node's worker takes it once its own heartbeat shows it given up:
        # within a heartbeat interval, not the half TTL (5 s) a standby's own reading took
        assert wait_for(lambda: sweeper_lease(cluster)[0] != holder, timeout=20,
                        interval=0.02)
        assert time.time() - given_up <= interval + 1.0
    finally:
        cluster.federation.restart(victim)
        cluster.federation.wait_live(cluster.settings, [victim], timeout=60)


def test_when_the_sweeping_node_is_killed_another_sweeps_within_the_lease_ttl(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    # given the node whose worker holds the federation's sweeper lease
    holder, _ = sweeper_lease(cluster)
    victim = next(name for name, worker in cluster.federation.nodes.items()
                  if holder.split("@")[0] == name)
    ttl = cluster.settings.heartbeat_ttl
    # when it is killed (no clean stop: its lease is left to lapse), and a task is scheduled
    # to start a second later by a caller gone by then (no alarm of its own: only a sweep
    # announces it)
    monkeypatch.setattr("bidding.task.announce_at", lambda *args: False)
    cluster.federation.kill(victim)
    killed_at = time.time()
    try:
        result = shared.apply_async((7,), countdown=1, bidding={"task_type": fresh_type()})
        # then another node's worker takes the lease once it lapses, within the TTL (a
        # standby looks when it could lapse, not a look later)
        assert wait_for(lambda: sweeper_lease(cluster)[0] != holder, timeout=ttl + 10)
        assert time.time() - killed_at <= ttl + 2.5
        # and sweeps: the scheduled task is announced and runs
        assert result.get(timeout=ttl + 30)["value"] == 7
        # and, on SQLite, checkpoints the store's log as the killed node did: the database
        # file alone soon has the task finished
        if cluster.backend == "sqlite":
            assert wait_for(lambda: finished_in_the_database_file(
                cluster.settings.database_url, [result.id], tmp_path), timeout=10, interval=0.2)
    finally:
        cluster.federation.restart(victim)
        cluster.federation.wait_live(cluster.settings, [victim], timeout=60)
