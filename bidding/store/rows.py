"""Several rows in one INSERT: one statement and one round trip, however many rows.

A list of parameter sets given to ``Session.execute`` is an executemany: psycopg sends it as a
pipeline of one INSERT per row. An award writes a message per answer and a row per bid, so
its inserts were most of its statements (bench/latency.py's phase table). On PostgreSQL the
rows travel as one JSON array, unpacked by the server (``jsonb_to_recordset``): the
statement's text never changes, so psycopg and the server parse and plan it once (a
multi-row ``VALUES`` list is new text for every row count, and psycopg spent more time
parsing its placeholders than the server inserting). SQLite runs in the process: its
executemany costs no round trip, and the new rows' ids are read back after it (``_AfterRowid``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection, Dialect, Insert, Table, bindparam, func, insert, select
from sqlalchemy.orm import Session

from bidding.store.direct import Direct, DirectInsert, as_sqlalchemy_error, on_cursor
from bidding.store.engine import core


@lru_cache(maxsize=1)
def _postgresql() -> Dialect:
    """PostgreSQL's dialect, to spell the columns' types (imported on first use: a process on
    SQLite never needs it, and it costs 2 MB)."""
    from sqlalchemy.dialects import postgresql

    return postgresql.dialect()  # type: ignore[no-untyped-call]


def insert_rows(session: Session, table: Table, rows: Sequence[dict[str, Any]],
                returning: Sequence[str] = ()) -> Sequence[Sequence[Any]]:
    """INSERT ``rows`` (dicts with the same keys, JSON values) into ``table`` in the session's
    transaction, in one statement and in their order (an autoincrement key counts up in it);
    the ``returning`` columns of the new rows, in that order (match them up by a key column)."""
    if not rows:
        return []
    conn = core(session)
    if conn.dialect.name == "postgresql":
        # The driver's SQL on its cursor (``store.direct``): no SQLAlchemy execution around it.
        sql = _from_json(table, tuple(rows[0]), tuple(returning))
        found, _, _ = on_cursor(conn, sql, {"rows": json.dumps(list(rows))},
                             fetch=bool(returning))
        return found
    if returning:
        after = _after_rowid(table, tuple(rows[0]), tuple(returning), conn.dialect)
        if after is not None:
            return after.run(conn, rows)
        result = conn.execute(_returning(table, tuple(returning)), list(rows))
    else:
        direct = _direct_insert(table, tuple(rows[0]), conn.dialect)
        if direct is not None:
            direct.run_many(conn, rows)
        else:
            conn.execute(_insert(table), list(rows))
        return []
    return list(result.all()) if returning else []


def commit_with(session: Session, table: Table, rows: Sequence[dict[str, Any]]) -> bool:
    """On PostgreSQL, INSERT ``rows`` and COMMIT the session's transaction in one round trip
    (psycopg's pipeline mode); False, having done nothing, on another store.

    For a session about to commit (``before_commit``): its other pending changes are flushed
    first, so the COMMIT covers them; SQLAlchemy's own COMMIT then finds the connection idle,
    and psycopg sends nothing. A failed INSERT or COMMIT raises, and the session rolls back.
    Without this, the INSERT and the COMMIT were a round trip each, at the end of every
    transaction that logs a message (an award, a node's begin and completion).
    """
    if (not rows or session.get_bind().dialect.name != "postgresql"
            or not _can_pipeline()):
        return False
    session.flush()  # the session's other pending changes, into this transaction
    conn = core(session)
    import psycopg

    driver = conn.connection.driver_connection
    sql = _from_json(table, tuple(rows[0]), ())
    params = {"rows": json.dumps(list(rows))}
    try:
        with driver.pipeline():  # type: ignore[union-attr]
            driver.execute(sql, params)  # type: ignore[union-attr]
            driver.commit()  # type: ignore[union-attr]
    except psycopg.Error as exc:
        # The whole transaction rolls back; a connection severed mid-pipeline leaves the pool.
        raise as_sqlalchemy_error(conn, exc, sql, params) from exc
    return True


@lru_cache(maxsize=1)
def _can_pipeline() -> bool:
    """Whether psycopg's libpq has pipeline mode (libpq 14 and later; psycopg's wheels bundle
    a newer one)."""
    import psycopg

    return bool(psycopg.Pipeline.is_supported())


@lru_cache(maxsize=64)
def _from_json(table: Table, columns: tuple[str, ...], returning: tuple[str, ...]) -> str:
    """PostgreSQL's INSERT of ``columns`` from a JSON array of objects, in the array's order.

    ``jsonb_to_recordset`` with the columns' own types, numbered (``WITH ORDINALITY``) and
    ordered by that number. (``jsonb_populate_record`` on the table's row type took twice as
    long: it fills every column of the table from each object.)
    """
    names = ", ".join(columns)
    typed = ", ".join(f"{name} {table.c[name].type.compile(dialect=_postgresql())}"
                      for name in columns)
    sql = (f"INSERT INTO {table.name} ({names}) SELECT {names} FROM ROWS FROM "
           f"(jsonb_to_recordset(%(rows)s::jsonb) AS ({typed})) WITH ORDINALITY "
           f"AS given({names}, n) ORDER BY n")
    if returning:
        sql += " RETURNING " + ", ".join(returning)
    return sql


@lru_cache(maxsize=64)
def _insert(table: Table) -> Insert:
    # Built once: a new statement is traversed for its cache key on every execution.
    return insert(table)


@lru_cache(maxsize=64)
def _direct_insert(table: Table, columns: tuple[str, ...],
                   dialect: Dialect) -> DirectInsert | None:
    """The INSERT of ``columns`` on the driver's cursor (``store.direct``), or None when a
    column left out has a default only SQLAlchemy's execution can compute."""
    return DirectInsert.of(table, columns, dialect)


class _AfterRowid:
    """SQLite's INSERT of several rows that reads ``returning`` back, on the driver's cursor:
    the table's largest key, the driver's executemany, then the rows with a larger key in key
    order. The write transaction holds SQLite's write lock from the first read to the last, and
    SQLite gives a new row the largest key then in the table plus one (its rowid): every row
    past the key read first is one of these, and they come back in the order they went in.
    (SQLAlchemy's multi-row ``VALUES ... RETURNING`` cost 0.15 ms more for an award's bids,
    most of it SQLAlchemy's own Python.)"""

    def __init__(self, insert_: DirectInsert, largest: Direct, read: Direct) -> None:
        self.insert = insert_
        self.largest = largest
        self.read = read

    def run(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> Sequence[Sequence[Any]]:
        """INSERT ``rows``; their ``returning`` columns, in their order."""
        found = self.largest.run(conn, {}).rows
        largest = found[0][0] if found and found[0][0] is not None else 0
        self.insert.run_many(conn, rows)
        return self.read.run(conn, {"after": largest}).rows


@lru_cache(maxsize=64)
def _after_rowid(table: Table, columns: tuple[str, ...], returning: tuple[str, ...],
                 dialect: Dialect) -> _AfterRowid | None:
    """The read-back INSERT on SQLite's cursor, or None where it does not apply: another store,
    a key that is not one ``INTEGER`` column SQLite fills itself (its rowid: no value given,
    no default), or a default only SQLAlchemy's execution can compute."""
    keys = list(table.primary_key.columns)
    if (dialect.name != "sqlite" or len(keys) != 1 or keys[0].name in columns
            or keys[0].default is not None or keys[0].server_default is not None
            or keys[0].type.compile(dialect=dialect) != "INTEGER"):
        return None
    key = keys[0]
    insert_ = DirectInsert.of(table, columns, dialect)
    largest = Direct.on(select(func.max(key)), dialect)
    read = Direct.on(select(*(table.c[name] for name in returning))
                     .where(key > bindparam("after", type_=key.type)).order_by(key), dialect)
    if insert_ is None or largest is None or read is None:
        return None
    return _AfterRowid(insert_, largest, read)


@lru_cache(maxsize=64)
def _returning(table: Table, returning: tuple[str, ...]) -> Insert:
    # With RETURNING, SQLAlchemy sends the rows as one multi-row VALUES ("insertmanyvalues").
    return insert(table).returning(*(table.c[name] for name in returning))
