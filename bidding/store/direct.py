"""Prebuilt statements run on SQLite's cursor: SQLAlchemy compiles them once and runs none of
its execution path.

For a cached Core statement SQLAlchemy still builds an execution context, processes the
parameters through its compiled form, wraps the cursor in a result and dispatches its events:
on an auction's statements that is about two and a half times what SQLite itself does for
them (bench/instructions.py). A ``Direct`` keeps what compiling gave once: the SQL, the order
of its parameters with their literal values and bind processors, its result columns'
processors. ``run`` executes it on the cursor of the session's connection, in the session's
transaction, and keeps what callers and tools rely on: the engine's ``before_cursor_execute``
and ``after_cursor_execute`` events fire (statement counters, the benchmark's phase timers), and
the driver's errors are raised as SQLAlchemy raises them (``DBAPIError`` subclasses: the store's
outage handling reads "database is locked" from them).

SQLite only, and only statements without expanding or post-compiled parameters: PostgreSQL's
statements cost a round trip each, which this would not shorten, and psycopg handles its own
parameters.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from sqlalchemy import ClauseElement, Connection, Dialect, Table, bindparam
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.schema import CallableColumnDefault, ScalarElementColumnDefault

#: The dialect a ``Direct`` runs on.
SQLITE: Final = "sqlite"
_SQLITE_DIALECT: Final = sqlite.dialect()


@dataclass(frozen=True)
class _Compiled:
    sql: str
    #: Each positional parameter: its name and its bind processor (or None).
    params: tuple[tuple[str, Callable[[Any], Any] | None], ...]
    #: The compiled statement, for its literal values (``construct_params``).
    compiled: SQLCompiler
    #: Each result column's processor (or None); empty without result columns.
    results: tuple[Callable[[Any], Any] | None, ...]


class Direct:
    """``statement``, compiled once for SQLite and run on the driver's cursor (``run``)."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._compiled: _Compiled | None = None

    @classmethod
    def for_sqlite(cls, statement: ClauseElement) -> Direct | None:
        """A ``Direct`` of ``statement``, or None when it cannot run directly (``runs``)."""
        return cls(statement) if cls.runs(statement, _SQLITE_DIALECT) else None

    @staticmethod
    def runs(statement: ClauseElement, dialect: Dialect) -> bool:
        """Whether ``statement`` can run directly on ``dialect``: SQLite, parameters that
        SQLAlchemy does not rewrite per execution (an IN of a list, a literal LIMIT), and a
        SQLAlchemy whose compiled form still has what this reads (else its own execution)."""
        return _plan(statement, dialect) is not None

    def _compile(self, dialect: Dialect) -> _Compiled:
        plan = _plan(self.statement, dialect)
        if plan is None:
            raise ValueError("a Direct statement runs on SQLite, with plain positional "
                             "parameters only")
        return plan

    def run(self, conn: Connection, params: Mapping[str, Any]) -> Result:
        """Execute on ``conn`` (a SQLite connection in a transaction) with ``params``."""
        return self._execute(conn, [params], many=False)

    def run_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute once per parameter set of ``rows`` (the driver's executemany)."""
        if rows:
            self._execute(conn, rows, many=True)

    def _execute(self, conn: Connection, given: Sequence[Mapping[str, Any]], *,
                 many: bool) -> Result:
        dialect = conn.dialect
        compiled = self._compiled
        if compiled is None:
            compiled = self._compiled = self._compile(dialect)
        values = [_positional(compiled, params) for params in given]
        parameters: Any = values if many else values[0]
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
        try:
            dispatch = conn.dispatch
            dispatch.before_cursor_execute(conn, cursor, compiled.sql, parameters, None, many)
            try:
                if many:
                    cursor.executemany(compiled.sql, parameters)
                else:
                    cursor.execute(compiled.sql, parameters)
                rows = cursor.fetchall() if compiled.results else []
            except dialect.loaded_dbapi.Error as exc:
                raise DBAPIError.instance(compiled.sql, parameters, exc,
                                          dialect.loaded_dbapi.Error, dialect=dialect) from exc
            dispatch.after_cursor_execute(conn, cursor, compiled.sql, parameters, None, many)
            count = cursor.rowcount
        finally:
            cursor.close()
        if any(compiled.results):
            rows = [tuple(value if process is None else process(value)
                          for process, value in zip(compiled.results, row, strict=True))
                    for row in rows]
        return Result(rows, count)


def _plan(statement: ClauseElement, dialect: Dialect) -> _Compiled | None:
    """What running ``statement`` directly on ``dialect`` needs, or None where it cannot."""
    if dialect.name != SQLITE:
        return None
    compiled = statement.compile(dialect=dialect)
    if (not isinstance(compiled, SQLCompiler) or compiled.positiontup is None
            or any(bind.expanding or bind.literal_execute for bind in compiled.binds.values())):
        return None
    try:
        # SQLAlchemy's own compiled processors (2.0 and 2.1 keep them under these names): the
        # values go through exactly what its execution would apply.
        processors = cast(Mapping[str, Callable[[Any], Any]], compiled._bind_processors)
        results = tuple(entry.type._cached_result_processor(dialect, None)
                        for entry in compiled._result_columns)
    except AttributeError:
        return None
    return _Compiled(compiled.string,
                     tuple((name, processors.get(name)) for name in compiled.positiontup),
                     compiled, results)


def _positional(compiled: _Compiled, params: Mapping[str, Any]) -> list[Any]:
    """``params`` with the statement's literal values, in its parameters' order, processed."""
    merged = compiled.compiled.construct_params(params, _check=False)
    return [merged[name] if process is None or merged[name] is None
            else process(merged[name])
            for name, process in compiled.params]


@dataclass(frozen=True)
class Result:
    """What a ``Direct`` statement returned: its rows (processed) and the driver's row count."""

    rows: list[tuple[Any, ...]]
    rowcount: int

    def one_or_none(self) -> tuple[Any, ...] | None:
        """The only row, or None (more than one is an error, as SQLAlchemy's)."""
        if len(self.rows) > 1:
            raise ValueError(f"expected at most one row, got {len(self.rows)}")
        return self.rows[0] if self.rows else None


def column_defaults(table: Table, given: Iterable[str]) -> dict[str, Callable[[], Any]] | None:
    """The Python-side defaults of ``table``'s columns that are not ``given``, each a function
    of no argument (SQLAlchemy's execution fills them in an INSERT); None when one of them is
    an SQL expression, which a direct INSERT cannot fill."""
    given = set(given)
    found: dict[str, Callable[[], Any]] = {}
    for column in table.columns:
        default = column.default
        if default is None or column.name in given:
            continue
        if isinstance(default, ScalarElementColumnDefault):
            found[column.name] = functools.partial(_same, default.arg)
        elif isinstance(default, CallableColumnDefault):
            # SQLAlchemy wraps a function of no argument into one of the execution context,
            # which it then ignores (the schema's are list and dict: test_store_direct).
            found[column.name] = functools.partial(default.arg, None)  # type: ignore[arg-type]
        else:
            return None
    return found


def _same(value: Any) -> Any:
    return value


class DirectInsert:
    """An INSERT of given columns into a table on SQLite's cursor, the columns it leaves out
    filled with their Python-side defaults as SQLAlchemy's execution would fill them; once
    only with ``conflict_skipped`` (``ON CONFLICT DO NOTHING``), reading back ``returning``."""

    def __init__(self, table: Table, columns: Sequence[str], defaults: dict[str, Callable[[], Any]],
                 conflict_skipped: bool = False, returning: Sequence[str] = ()) -> None:
        self.defaults = defaults
        names = [*columns, *defaults]
        stmt: Any = sqlite_insert(table).values(
            {name: bindparam(name, type_=table.c[name].type) for name in names})
        if conflict_skipped:
            stmt = stmt.on_conflict_do_nothing()
        if returning:
            stmt = stmt.returning(*(table.c[name] for name in returning))
        self.direct = Direct.for_sqlite(stmt)

    @classmethod
    def of(cls, table: Table, columns: Sequence[str], conflict_skipped: bool = False,
           returning: Sequence[str] = ()) -> DirectInsert | None:
        """The direct INSERT of ``columns``, or None when a default cannot be filled here."""
        defaults = column_defaults(table, columns)
        if defaults is None:
            return None
        made = cls(table, columns, defaults, conflict_skipped, returning)
        return made if made.direct is not None else None

    def _filled(self, row: Mapping[str, Any]) -> Mapping[str, Any]:
        if not self.defaults:
            return row
        return {**{name: make() for name, make in self.defaults.items()}, **row}

    def run(self, conn: Connection, row: Mapping[str, Any]) -> Result:
        """INSERT one row."""
        assert self.direct is not None  # (``of`` makes none without one)
        return self.direct.run(conn, self._filled(row))

    def run_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """INSERT ``rows`` (the driver's executemany)."""
        assert self.direct is not None
        self.direct.run_many(conn, [self._filled(row) for row in rows])
