"""Heartbeats and liveness on a real SQLite store (no broker)."""

from __future__ import annotations

from bidding.config import load_settings
from bidding.nodes.heartbeat import beat, heartbeat, mark_offline
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import query_live_nodes

PROFILE = NodeProfile(name="redfin", capabilities=["pdf"], capacity=2, price_per_unit=0.01,
                      latency_ms=30, trust=80)


def test_a_started_node_is_live_with_its_profile(store_url: str) -> None:
    settings = load_settings({"bidding_database_url": store_url}, environ={})
    # given a node that started (full heartbeat) at t=1000
    heartbeat(settings, PROFILE, now=1000.0)
    # then it is live just after, with its declared profile, and dead after the ttl
    [node] = query_live_nodes(settings, now=1001.0)
    assert (node.name, node.capabilities, node.capacity, node.trust) == ("redfin", ("pdf",), 2, 80)
    assert query_live_nodes(settings, now=1000.0 + settings.heartbeat_ttl + 1) == []


def test_the_periodic_beat_keeps_a_node_live(store_url: str) -> None:
    settings = load_settings({"bidding_database_url": store_url}, environ={})
    heartbeat(settings, PROFILE, now=1000.0)
    # when it beats again later
    beat(settings, PROFILE, now=1100.0)
    # then it is live at that later time, profile unchanged
    [node] = query_live_nodes(settings, now=1101.0)
    assert node.last_heartbeat == 1100.0 and node.capabilities == ("pdf",)


def test_a_beat_after_the_row_is_gone_registers_the_node_again(store_url: str) -> None:
    settings = load_settings({"bidding_database_url": store_url}, environ={})
    # given a node whose row does not exist (a fresh store)
    # when it beats
    beat(settings, PROFILE, now=2000.0)
    # then it is registered with its full profile
    [node] = query_live_nodes(settings, now=2001.0)
    assert node.name == "redfin" and node.price_per_unit == 0.01


def test_a_node_marked_offline_comes_back_online_with_its_next_beat(store_url: str) -> None:
    settings = load_settings({"bidding_database_url": store_url}, environ={})
    heartbeat(settings, PROFILE, now=1000.0)
    mark_offline(settings, "redfin")
    assert query_live_nodes(settings, now=1001.0) == []
    # when its consumer restarts and beats again
    beat(settings, PROFILE, now=1002.0)
    # then it is a candidate again
    assert [n.name for n in query_live_nodes(settings, now=1003.0)] == ["redfin"]


def test_a_store_that_fails_at_start_does_not_stop_the_node(tmp_path, caplog) -> None:
    from bidding.nodes.heartbeat import Heartbeat

    # given a store the node cannot write to (as when it stays locked past the lock timeout)
    settings = load_settings({"bidding_database_url": f"sqlite:///{tmp_path}/no/such/dir/s.db",
                              "bidding_heartbeat_interval": 60}, environ={})
    beats = Heartbeat(settings, PROFILE)
    # when the node's heartbeat starts
    try:
        beats.start()
        # then it logs why and keeps trying instead of raising (which would kill the worker)
        assert "first heartbeat of node redfin failed" in caplog.text
        assert beats._loop.running
    finally:
        beats._loop.stop()


def test_a_beat_refreshes_the_node_and_its_worker_in_one_transaction(store_url: str) -> None:
    from sqlalchemy import event, select

    from bidding.nodes import incarnation
    from bidding.store import read_session
    from bidding.store.engine import get_engine
    from bidding.store.schema import Worker

    settings = load_settings({"bidding_database_url": store_url}, environ={})
    # given a started node and its registered worker
    heartbeat(settings, PROFILE, now=1000.0)
    me = incarnation.Incarnation(hostname="redfin@a", node="redfin", boot_id="b1", pid=1,
                                 started_at=1000.0, slots=2)
    incarnation.register(settings, me, now=1000.0)
    commits: list[int] = []
    event.listen(get_engine(store_url), "commit", lambda _conn: commits.append(1))
    # when the periodic beat runs with the tasks its pool runs
    beat(settings, PROFILE, now=1100.0, me=me, running=["t-1"])
    # then one transaction refreshed both rows
    assert len(commits) == 1
    [node] = query_live_nodes(settings, now=1101.0)
    assert node.last_heartbeat == 1100.0
    with read_session(store_url) as session:
        worker = session.execute(select(Worker).where(Worker.hostname == "redfin@a")).scalar_one()
    assert (worker.last_heartbeat, list(worker.running or [])) == (1100.0, ["t-1"])


def test_a_worker_still_starting_is_not_taken_for_dead_until_its_grace_runs_out(
    store_url: str,
) -> None:
    from bidding.nodes import incarnation

    settings = load_settings({"bidding_database_url": store_url}, environ={})
    # given two workers registered at 1000: one whose consumer started and beat once at
    # 1000, one still starting (its pool and consumer not up yet: no beat)
    started = incarnation.Incarnation(hostname="redfin@a", node="redfin", boot_id="b1", pid=1,
                                      started_at=1000.0, slots=2)
    starting = incarnation.Incarnation(hostname="redfin@b", node="redfin", boot_id="b2",
                                       pid=2, started_at=1000.0, slots=2)
    for me in (started, starting):
        incarnation.register(settings, me, now=1000.0)
    assert incarnation.beat(settings, started, now=1000.0)

    # when the watchdog looks a TTL and a second later (its cutoff: now - TTL), neither
    # having beaten since
    ended = incarnation.end_stale(settings, cutoff=1001.0)

    # then only the one that had beaten is taken for dead
    assert [e.hostname for e in ended] == ["redfin@a"]
    assert ended[0].why == "stopped heartbeating"
    # and the starting one only once its start grace has run out too
    assert incarnation.end_stale(settings, cutoff=1000.0 + incarnation.START_GRACE) == []
    [late] = incarnation.end_stale(settings, cutoff=1001.0 + incarnation.START_GRACE)
    assert late.hostname == "redfin@b"


def _beat_rows(settings, hostname: str) -> tuple[float, float, list[str]]:
    """The node's heartbeat time, and the worker's heartbeat time and running tasks."""
    from sqlalchemy import select

    from bidding.store import read_session
    from bidding.store.schema import Node, Worker

    with read_session(settings.database_url) as session:
        node = session.execute(select(Node).where(Node.name == PROFILE.name)).scalar_one()
        worker = session.execute(select(Worker).where(Worker.hostname == hostname)).scalar_one()
        return node.last_heartbeat, worker.last_heartbeat, list(worker.running or [])


def _registered_worker(settings, boot_id: str = "b1", at: float = 1000.0):
    """Worker ``redfin@a`` of the node, registered at ``at`` under ``boot_id``."""
    from bidding.nodes import incarnation

    me = incarnation.Incarnation(hostname="redfin@a", node="redfin", boot_id=boot_id, pid=1,
                                 started_at=at, slots=2)
    incarnation.register(settings, me, now=at)
    return me


def test_the_periodic_beat_refreshes_the_node_and_its_worker_on_either_store(
    settings, monkeypatch,
) -> None:
    from sqlalchemy import event

    from bidding.store.engine import get_engine, is_sqlite
    from tests.unit.conftest import psycopg_commands

    # given a started node and its registered worker
    heartbeat(settings, PROFILE, now=1000.0)
    me = _registered_worker(settings)
    statements: list[str] = []
    event.listen(get_engine(settings.database_url), "before_cursor_execute",
                 lambda *args: statements.append(args[2]))
    sent = [] if is_sqlite(settings.database_url) else psycopg_commands(monkeypatch)

    # when the periodic beat runs with the tasks the worker's pool runs
    beat(settings, PROFILE, now=1100.0, me=me, running=["t-1"])
    beat_statements = len(statements)

    # then both rows are refreshed: the node live at 1100, the worker with its tasks
    assert _beat_rows(settings, "redfin@a") == (1100.0, 1100.0, ["t-1"])
    [node] = query_live_nodes(settings, now=1101.0)
    assert node.last_heartbeat == 1100.0
    if not is_sqlite(settings.database_url):
        # and on PostgreSQL in one statement, with no transaction around it
        assert beat_statements == 1
        assert [name for name, _ in sent] == []


def test_a_beat_whose_worker_row_another_incarnation_took_still_keeps_the_node_live(
    settings, caplog,
) -> None:
    # given a node whose worker name was registered again by a second process (a new boot id)
    heartbeat(settings, PROFILE, now=1000.0)
    first = _registered_worker(settings)
    _registered_worker(settings, boot_id="b2", at=1050.0)

    # when the first process beats
    beat(settings, PROFILE, now=1100.0, me=first, running=["t-1"])

    # then the node is live, the second process's row is left as it is, and the log says why
    node_beat, worker_beat, running = _beat_rows(settings, "redfin@a")
    assert node_beat == 1100.0
    assert (worker_beat, running) != (1100.0, ["t-1"])
    assert "belongs to another incarnation" in caplog.text


def test_a_beat_after_the_node_row_is_gone_registers_it_again_on_either_store(settings) -> None:
    from sqlalchemy import delete

    from bidding.store import write_session
    from bidding.store.schema import Node

    # given a registered worker whose node's row was deleted (a store restored from a backup)
    heartbeat(settings, PROFILE, now=1000.0)
    me = _registered_worker(settings)
    with write_session(settings.database_url) as session:
        session.execute(delete(Node))

    # when the periodic beat runs
    beat(settings, PROFILE, now=1100.0, me=me)

    # then the node is back, with its profile, and its worker refreshed
    [node] = query_live_nodes(settings, now=1101.0)
    assert (node.name, node.capacity, node.last_heartbeat) == ("redfin", 2, 1100.0)
    assert _beat_rows(settings, "redfin@a")[1] == 1100.0


def test_the_one_statement_beat_sets_only_the_columns_it_means() -> None:
    from sqlalchemy.dialects import postgresql

    from bidding.nodes import heartbeat as module

    # given the one-statement beats (alone, and reading a lease) compiled with every
    # parameter each is given
    keys = ["n_name", "n_now", "w_host", "w_boot", "w_now", "w_status", "w_running"]
    for statement, extra in ((module._BEAT_ALONE, []), (module._BEAT_AND_LEASE, ["j_name"])):
        sql = str(statement.compile(dialect=postgresql.dialect(), column_keys=keys + extra))
        # then each UPDATE sets its own columns and no other (a parameter named like a column
        # of either table would add it to that table's SET)
        node_set = sql.split("UPDATE bidding_nodes SET ")[1].split(" WHERE")[0]
        worker_set = sql.split("UPDATE bidding_workers SET ")[1].split(" WHERE")[0]
        assert [c.split("=")[0] for c in node_set.split(", ")] == ["status", "last_heartbeat"]
        assert sorted(c.split("=")[0] for c in worker_set.split(", ")) == [
            "last_heartbeat", "running", "status"]


def test_a_beat_reads_the_sweeper_lease_with_it_on_either_store(settings, monkeypatch) -> None:
    from sqlalchemy import event

    from bidding.lifecycle import lease
    from bidding.nodes.heartbeat import LeaseSeen
    from bidding.store.engine import get_engine, is_sqlite

    # given a started node and its registered worker, and no sweeper lease taken yet
    heartbeat(settings, PROFILE, now=1000.0)
    me = _registered_worker(settings)
    # then a beat asked to read the lease says there is none
    assert beat(settings, PROFILE, now=1050.0, me=me, lease=lease.SWEEPER) == LeaseSeen(None,
                                                                                         None)
    # and once another node holds it until 1110 (beside another lease of the jobs table),
    # the beat says so
    assert lease.hold(settings.database_url, "other@host", 10, now=1100.0)
    assert lease.hold(settings.database_url, "third@host", 50, name="another", now=1100.0)
    statements: list[str] = []

    def count(*args: object) -> None:
        statements.append(str(args[2]))

    engine = get_engine(settings.database_url)
    event.listen(engine, "before_cursor_execute", count)
    try:
        seen = beat(settings, PROFILE, now=1101.0, me=me, lease=lease.SWEEPER)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    beat_statements = len(statements)
    assert seen == LeaseSeen(1110.0, "other@host")
    # and the beat itself still happened, on PostgreSQL in its one statement
    assert _beat_rows(settings, "redfin@a")[:2] == (1101.0, 1101.0)
    if not is_sqlite(settings.database_url):
        assert beat_statements == 1
    # and a beat not asked for the lease reads nothing of it
    assert beat(settings, PROFILE, now=1102.0, me=me) is None
