"""INSERT a row once: a duplicate of a unique key is skipped, on every database.

An attempt's ledger entry and episode are unique per (task, attempt, node): a redelivered
execution, or a sweeper racing the node, must not charge or count it twice.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sqlalchemy import Dialect, Executable, Table, insert
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from bidding.store.direct import DRIVERS, DirectInsert, insert_for
from bidding.store.engine import core


def insert_once(session: Session, table: Table, values: dict[str, Any],
                 report: bool = False) -> bool:
    """INSERT a row unless it breaks a unique index (an earlier delivery wrote it already).
    With ``report``, say whether it was inserted (else True)."""
    conn = core(session)
    dialect = conn.dialect.name
    direct = _direct_once(table, tuple(values), report, conn.dialect)
    if direct is not None:
        stored = direct.run(conn, values)
        return bool(stored.rows) if report else True
    key = (dialect, table.name, report)
    stmt = _INSERT_ONCE.get(key)
    if stmt is None and dialect in DRIVERS:  # (the dialects with ON CONFLICT DO NOTHING)
        stmt = insert_for(dialect, table).on_conflict_do_nothing()
        if report:  # RETURNING tells (psycopg reports no rowcount here); it costs a fetch
            stmt = stmt.returning(*table.primary_key.columns)
        _INSERT_ONCE[key] = stmt
    if stmt is not None:
        result = conn.execute(stmt, values)
        return result.first() is not None if report else True
    try:  # another database: a savepoint, rolled back on the duplicate
        with session.begin_nested():
            session.execute(insert(table), values)
    except IntegrityError:
        return False
    return True


_INSERT_ONCE: dict[tuple[str, str, bool], Executable] = {}


@lru_cache(maxsize=64)
def _direct_once(table: Table, columns: tuple[str, ...], report: bool,
                 dialect: Dialect) -> DirectInsert | None:
    """The INSERT ... ON CONFLICT DO NOTHING of ``columns`` on the driver's cursor
    (``store.direct``), RETURNING the key with ``report``; None where it cannot run so."""
    return DirectInsert.of(table, columns, dialect, conflict_skipped=True,
                           returning=[c.name for c in table.primary_key.columns] if report else ())
