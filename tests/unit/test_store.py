"""Unit tests of the store: the migration matches the models, migrating is safe to repeat and
to run from several threads, and stats.percentile (nearest rank).

SQLite files in tmp_path; no broker, no server.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text

from bidding.observe.stats import percentile
from bidding.store import (
    dispose_all,
    ensure_schema,
    get_engine,
    migrate,
    read_session,
    upgrade,
    write_session,
)
from bidding.store.schema import Base, Node

TABLES = {"bidding_nodes", "bidding_announcements", "bidding_bids", "bidding_episodes",
          "bidding_messages", "bidding_ledger", "bidding_workers",
          "bidding_graphs", "bidding_graph_steps", "bidding_jobs", "bidding_tags",
          "bidding_metric_totals", "bidding_node_records"}


def schema_diff(url: str) -> list:
    with get_engine(url).connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True,
                                                         "compare_server_default": True})
        return compare_metadata(context, Base.metadata)


def revision_of(url: str) -> str | None:
    with get_engine(url).connect() as conn:
        return migrate.current_revision(conn)


# --- migration vs models -------------------------------------------------------------------


def test_migration_creates_exactly_the_models_schema(store_url):
    # given a SQLite file migrated to head
    # when its schema is compared with the models (tables, columns, types, indexes, keys)
    diff = schema_diff(store_url)
    # then there is no difference
    assert diff == []


def test_schema_comparison_sees_a_missing_schema(fresh_url):
    # given an empty database (the comparison must be able to see differences)
    # when it is compared with the models
    diff = schema_diff(fresh_url)
    # then every table of the models is reported missing
    added = {d[1].name for d in diff if d[0] == "add_table"}
    assert added == TABLES


def test_migrated_store_is_at_head_with_every_table(store_url):
    # given a migrated store
    # then it is at the head revision and has the models' tables plus Alembic's
    assert revision_of(store_url) == migrate.head_revision()
    tables = set(inspect(get_engine(store_url)).get_table_names())
    assert tables == TABLES | {"alembic_version"}


# --- ensure_schema and upgrade -------------------------------------------------------------


def test_ensure_schema_creates_a_fresh_store(fresh_url):
    # given a database file that does not exist
    # when the schema is ensured
    ensure_schema(fresh_url)
    # then it is at head
    assert revision_of(fresh_url) == migrate.head_revision()


def test_ensure_schema_is_idempotent(fresh_url, monkeypatch):
    # given a store whose schema was ensured, with a row in it
    ensure_schema(fresh_url)
    with write_session(fresh_url) as session:
        session.add(Node(name="redfin", capabilities=["gpu"]))
    upgrades: list[str] = []
    real_upgrade = migrate.upgrade
    monkeypatch.setattr(migrate, "upgrade", lambda url: (upgrades.append(url), real_upgrade(url)))
    # when it is ensured again, cached, and then after forgetting the cache
    ensure_schema(fresh_url)
    migrate.forget_schema_checks()
    ensure_schema(fresh_url)
    # then no upgrade runs (the schema is current), the schema and the data are unchanged
    assert upgrades == []
    assert revision_of(fresh_url) == migrate.head_revision()
    assert schema_diff(fresh_url) == []
    with read_session(fresh_url) as session:
        assert session.scalars(select(Node.name)).all() == ["redfin"]


def test_ensure_schema_upgrades_a_fresh_store_once(fresh_url, monkeypatch):
    # given a database that was never migrated
    upgrades: list[str] = []
    real_upgrade = migrate.upgrade
    monkeypatch.setattr(migrate, "upgrade", lambda url: (upgrades.append(url), real_upgrade(url)))
    # when the schema is ensured twice
    ensure_schema(fresh_url)
    ensure_schema(fresh_url)
    # then it is upgraded exactly once
    assert len(upgrades) == 1
    assert revision_of(fresh_url) == migrate.head_revision()


def test_upgrade_twice_is_harmless(store_url):
    # given a store already at head
    # when it is upgraded again
    upgrade(store_url)
    # then it is still at head, with the models' schema
    assert revision_of(store_url) == migrate.head_revision()
    assert schema_diff(store_url) == []


def test_upgrade_creates_missing_parent_directories(tmp_path):
    # given a database path under directories that do not exist
    url = f"sqlite:///{tmp_path / 'a' / 'b' / 'store.db'}"
    try:
        # when it is upgraded
        upgrade(url)
        # then the file exists and is at head
        assert (tmp_path / "a" / "b" / "store.db").exists()
        assert revision_of(url) == migrate.head_revision()
    finally:
        dispose_all()


def test_concurrent_upgrades_of_a_fresh_file_all_succeed(fresh_url):
    # given 8 threads that start upgrading the same fresh SQLite file at the same moment
    start = threading.Barrier(8)

    def migrate_now() -> None:
        start.wait(timeout=30)
        upgrade(fresh_url)

    # when they all run
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(migrate_now) for _ in range(8)]
        errors = [f.exception(timeout=60) for f in futures]
    # then none fails, and the store is at head with exactly the models' schema
    assert errors == [None] * 8
    assert revision_of(fresh_url) == migrate.head_revision()
    assert schema_diff(fresh_url) == []


def test_concurrent_ensure_schema_all_succeed(fresh_url):
    # given 8 threads ensuring the schema of the same fresh file at once
    start = threading.Barrier(8)

    def ensure_now() -> None:
        start.wait(timeout=30)
        ensure_schema(fresh_url)

    with ThreadPoolExecutor(max_workers=8) as pool:
        errors = [f.exception(timeout=60) for f in [pool.submit(ensure_now) for _ in range(8)]]
    # then none fails and the store is at head
    assert errors == [None] * 8
    assert revision_of(fresh_url) == migrate.head_revision()


def test_upgrading_to_the_node_record_counts_the_episodes_already_stored(fresh_url):
    # given a store at the first revision with two nodes and three finished attempts
    upgrade(fresh_url, "0001")
    with get_engine(fresh_url).begin() as conn:
        for name in ("redfin", "bluefin"):
            conn.execute(text(
                "INSERT INTO bidding_nodes (name, capabilities, capacity, price_per_unit, "
                "latency_ms, trust, description, hostname, status, started_at, last_heartbeat) "
                "VALUES (:n, '[]', 1, 0, 0, 50, '', '', 'online', 0, 0)"), {"n": name})
        for i, (node, ok) in enumerate([("redfin", True), ("redfin", False), ("bluefin", True)]):
            conn.execute(text(
                "INSERT INTO bidding_episodes (task_id, attempt, node, task_type, skills, "
                "success, duration_s, cost, finished_at) "
                "VALUES (:t, 1, :n, 'x', '[]', :ok, 0, 0, 0)"), {"t": f"t{i}", "n": node, "ok": ok})
    # when it is upgraded to head
    upgrade(fresh_url)
    # then each node's record counts its episodes
    with read_session(fresh_url) as session:
        found = {n.name: (n.attempts, n.successes) for n in session.scalars(select(Node))}
    assert found == {"redfin": (2, 1), "bluefin": (1, 1)}


# --- stats.percentile (nearest rank) -------------------------------------------------------


def test_percentile_median_of_1_to_100():
    # given the values 1..100 (shuffled)
    values = [float(v) for v in range(100, 0, -1)]
    # then the 50th percentile by nearest rank is 50
    assert percentile(values, 50) == 50


def test_percentile_p99_of_1_to_100():
    # given the values 1..100
    values = list(range(1, 101))
    # then the 99th percentile by nearest rank is ceil(0.99 * 100) = the 99th value
    assert percentile(values, 99) == 99


def test_percentile_quartiles_of_four_values():
    # given 4 values; nearest rank: p25 -> rank ceil(1.0) = 1, p75 -> rank ceil(3.0) = 3
    # then the quartiles are the 1st and 3rd values
    assert (percentile([10, 20, 30, 40], 25), percentile([10, 20, 30, 40], 75)) == (10, 30)


def test_percentile_where_the_rank_is_not_a_whole_number():
    # given 1..100; p99.5 -> rank ceil(99.5) = 100, p0.5 -> ceil(0.5) = 1, p90.1 -> 91
    values = list(range(1, 101))
    # then the nearest ranks are used
    assert percentile(values, 99.5) == 100
    assert percentile(values, 0.5) == 1
    assert percentile(values, 90.1) == 91


def test_percentile_of_a_single_value():
    # given one value
    # then every percentile is that value
    assert percentile([7.5], 0) == 7.5
    assert percentile([7.5], 50) == 7.5
    assert percentile([7.5], 100) == 7.5


def test_percentile_extremes():
    # given 1..100
    values = list(range(1, 101))
    # then p0 is the smallest and p100 the largest value
    assert percentile(values, 0) == 1
    assert percentile(values, 100) == 100


def test_percentile_of_no_values_is_none():
    # given no values
    # then there is no percentile
    assert percentile([], 50) is None
    assert percentile((), 99) is None


def test_an_orm_row_leaves_its_unset_json_columns_null(settings) -> None:
    from bidding.store.schema import JSONDocument

    # given a node row written through the ORM without its optional JSON columns, as the
    # code that writes new rows does (a new task's row leaves its result unset)
    with write_session(settings.database_url) as session:
        session.add(Node(name="plain"))
    # then those columns are SQL NULL, not JSON's 'null': "IS NULL" finds them (a task's
    # result is written where it is still NULL)
    with read_session(settings.database_url) as session:
        unset = session.scalars(select(Node.name).where(
            Node.name == "plain", Node.resources.is_(None), Node.warm.is_(None),
            Node.checking.is_(None))).all()
        assert unset == ["plain"]
    # and the type keeps JSON's own behaviour in the ORM: None evaluated, values unhashable
    assert JSONDocument.should_evaluate_none and not JSONDocument.hashable
