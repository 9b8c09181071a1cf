"""Prebuilt statements run on the driver's cursor: SQLAlchemy compiles them once and runs none
of its execution path.

For a cached Core statement SQLAlchemy still builds an execution context, processes the
parameters through its compiled form, wraps the cursor in a result and dispatches its events:
on an auction's statements that is about two and a half times what SQLite itself does for
them (bench/instructions.py). A ``Direct`` keeps what compiling gave once: the SQL, the order
of its parameters with their literal values and bind processors, its result columns'
processors. ``run`` executes it on the cursor of the session's connection, in the session's
transaction, and keeps what callers and tools rely on: the engine's ``before_cursor_execute``
and ``after_cursor_execute`` events fire (statement counters, the benchmark's phase timers), and
the driver's errors are raised as SQLAlchemy raises them (``DBAPIError`` subclasses: the store's
outage handling reads "database is locked" from them), and a connection the error says is lost
leaves the pool, as SQLAlchemy's execution would invalidate it.

SQLite (pysqlite, positional parameters) and PostgreSQL through psycopg (named parameters),
and only statements without expanding or post-compiled parameters. On PostgreSQL a statement
still costs its round trip; what this takes off is the client's Python around it (psycopg
prepares the statement after a few runs, as it would under SQLAlchemy: the text is the same).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, cast

from sqlalchemy import (
    ClauseElement,
    Connection,
    CursorResult,
    Dialect,
    Executable,
    Insert,
    Table,
    bindparam,
    insert,
)
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.schema import CallableColumnDefault, ScalarElementColumnDefault
from sqlalchemy.sql.type_api import TypeEngine

#: The dialects a ``Direct`` runs on, and the driver of each.
DRIVERS: Final = {"sqlite": "pysqlite", "postgresql": "psycopg"}


@dataclass(frozen=True)
class _Compiled:
    sql: str
    #: Each parameter, in the statement's order: its name and its bind processor (or None).
    params: tuple[tuple[str, Callable[[Any], Any] | None], ...]
    #: The driver takes the parameters by name (psycopg), else by position (SQLite).
    named: bool
    #: The compiled statement, for its literal values (``construct_params``).
    compiled: SQLCompiler
    #: Each result column's type; empty without result columns. (Their processors depend on
    #: the type the driver reports, PostgreSQL's numerics: made at the first run, ``_processors``.)
    results: tuple[TypeEngine[Any], ...]


class Direct:
    """``statement``, compiled once per dialect and run on the driver's cursor (``run``)."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._compiled: dict[str, _Compiled] = {}
        #: Each dialect's result processors, from the driver's first description of the rows.
        self._processors: dict[str, tuple[Callable[[Any], Any] | None, ...]] = {}

    @classmethod
    def on(cls, statement: ClauseElement, dialect: Dialect) -> Direct | None:
        """A ``Direct`` of ``statement`` for ``dialect``, or None when it cannot run directly
        there (``runs``)."""
        made = cls(statement)
        return made if made._plan(dialect) is not None else None

    @staticmethod
    def runs(statement: ClauseElement, dialect: Dialect) -> bool:
        """Whether ``statement`` can run directly on ``dialect``: SQLite, or PostgreSQL through
        psycopg; parameters that SQLAlchemy does not rewrite per execution (an IN of a list, a
        literal LIMIT); and a SQLAlchemy whose compiled form still has what this reads (else
        its own execution)."""
        return _plan(statement, dialect) is not None

    def _plan(self, dialect: Dialect) -> _Compiled | None:
        """The statement compiled for ``dialect`` (once), or None where it cannot run so."""
        plan = self._compiled.get(dialect.name)
        if plan is None:
            plan = _plan(self.statement, dialect)
            if plan is not None:
                self._compiled[dialect.name] = plan
        return plan

    def run(self, conn: Connection, params: Mapping[str, Any]) -> Result:
        """Execute on ``conn`` (in the transaction of its session, or on its own where the
        connection commits each statement) with ``params``."""
        return self._execute(conn, [params], many=False)

    def run_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Execute once per parameter set of ``rows`` (the driver's executemany)."""
        if rows:
            self._execute(conn, rows, many=True)

    def _execute(self, conn: Connection, given: Sequence[Mapping[str, Any]], *,
                 many: bool) -> Result:
        dialect = conn.dialect
        compiled = self._plan(dialect)
        if compiled is None:
            raise ValueError("a Direct statement runs on SQLite or on PostgreSQL through "
                             "psycopg, with plain parameters only")
        values = [_values(compiled, params) for params in given]
        rows, count, description = on_cursor(conn, compiled.sql,
                                             values if many else values[0], many=many,
                                             fetch=bool(compiled.results))
        if not compiled.results:
            return Result(rows, count)
        processors = self._processors.get(dialect.name)
        if processors is None:
            # (The type codes the driver reports: None from SQLite, each column's from psycopg.)
            codes = ([column[1] for column in description] if description
                     else [None] * len(compiled.results))
            processors = self._processors[dialect.name] = tuple(
                kind._cached_result_processor(dialect, code)
                for kind, code in zip(compiled.results, codes, strict=True))
        if any(processors):
            rows = [tuple(value if process is None else process(value)
                          for process, value in zip(processors, row, strict=True))
                    for row in rows]
        return Result(rows, count)


@functools.lru_cache(maxsize=512)
def direct_of(statement: ClauseElement, dialect: Dialect) -> Direct | None:
    """``statement`` as a ``Direct`` for ``dialect``, made once per statement and dialect; None
    where it cannot run directly (the caller runs it through SQLAlchemy)."""
    return Direct.on(statement, dialect)


def execute(conn: Connection, statement: Executable,
            params: Mapping[str, Any]) -> Result | CursorResult[Any]:
    """Run ``statement`` with ``params`` on ``conn``: directly where it can (``direct_of``),
    else through SQLAlchemy. Either result has ``one_or_none()`` and ``rowcount``."""
    direct = direct_of(statement, conn.dialect)
    if direct is not None:
        return direct.run(conn, params)
    return cast(CursorResult[Any], conn.execute(statement, params))


def on_cursor(conn: Connection, sql: str, parameters: Any, *, many: bool = False,
              fetch: bool = False) -> tuple[list[Any], int, Sequence[Any] | None]:
    """Run the driver's ``sql`` with ``parameters`` on a cursor of ``conn``'s connection: its
    rows (when ``fetch``), its row count and its description of the rows. The engine's cursor
    events fire around it; a driver error is raised as SQLAlchemy raises it, and a connection
    it says is lost is invalidated (it leaves the pool, and the session's transaction must
    roll back)."""
    dialect = conn.dialect
    driver = conn.connection.driver_connection
    cursor = driver.cursor()  # type: ignore[union-attr]
    try:
        dispatch = conn.dispatch
        dispatch.before_cursor_execute(conn, cursor, sql, parameters, None, many)
        try:
            if many:
                cursor.executemany(sql, parameters)
            else:
                cursor.execute(sql, parameters)
            rows = cursor.fetchall() if fetch else []
        except dialect.loaded_dbapi.Error as exc:
            raise as_sqlalchemy_error(conn, exc, sql, parameters, cursor) from exc
        dispatch.after_cursor_execute(conn, cursor, sql, parameters, None, many)
        return rows, cursor.rowcount, cursor.description if fetch else None
    finally:
        cursor.close()


def as_sqlalchemy_error(conn: Connection, exc: Exception, sql: str, parameters: Any,
                        cursor: Any = None) -> DBAPIError:
    """The driver's error ``exc`` as SQLAlchemy's execution raises it (an ``OperationalError``
    for a lost server, which ``store.outage`` waits out). A connection it left unusable is
    invalidated first, as SQLAlchemy does, else the pool would hand it out again: lost
    (``dialect.is_disconnect``), broken (psycopg), or left in pipeline mode by a connection
    severed mid-pipeline ("cannot exit pipeline mode while busy": the pool's reset would fail
    on it, loudly)."""
    driver = conn.connection.driver_connection
    lost = bool(conn.dialect.is_disconnect(exc, driver, cursor))  # type: ignore[arg-type]
    lost = lost or bool(getattr(driver, "broken", False))
    pgconn = getattr(driver, "pgconn", None)
    if pgconn is not None and not lost:
        from psycopg.pq import PipelineStatus

        lost = pgconn.pipeline_status != PipelineStatus.OFF
    if lost:
        conn.invalidate(exc)
    dbapi_error = conn.dialect.loaded_dbapi.Error
    return cast(DBAPIError, DBAPIError.instance(sql, parameters, exc, dbapi_error,
                                                dialect=conn.dialect,
                                                connection_invalidated=lost))


def _plan(statement: ClauseElement, dialect: Dialect) -> _Compiled | None:
    """What running ``statement`` directly on ``dialect`` needs, or None where it cannot."""
    if DRIVERS.get(dialect.name) != dialect.driver:
        return None
    if isinstance(statement, Insert) and (statement._values is None
                                          and statement.select is None
                                          and not statement._multi_values):
        # An INSERT without its columns named: SQLAlchemy compiles it for the keys of each
        # execution's parameters (and fills the defaults of the rest); here every column
        # would be a parameter, and one not given NULL.
        return None
    compiled = statement.compile(dialect=dialect)
    if not isinstance(compiled, SQLCompiler) or any(
            bind.expanding or bind.literal_execute for bind in compiled.binds.values()):
        return None
    if compiled.insert_prefetch or compiled.update_prefetch:
        return None  # Python-side defaults SQLAlchemy's execution computes (columns left out)
    named = compiled.positiontup is None
    if named and (dialect.paramstyle != "pyformat" or compiled.escaped_bind_names):
        return None  # (names SQLAlchemy escapes in the SQL: none of the store's need it)
    try:
        # SQLAlchemy's own compiled processors (2.0 and 2.1 keep them under these names): the
        # values go through exactly what its execution would apply.
        processors = cast(Mapping[str, Callable[[Any], Any]], compiled._bind_processors)
        results = tuple(entry.type for entry in compiled._result_columns)
    except AttributeError:
        return None
    if not all(hasattr(kind, "_cached_result_processor") for kind in results):
        return None
    names = (tuple(dict.fromkeys(compiled.bind_names.values())) if named
             else tuple(compiled.positiontup or ()))
    return _Compiled(compiled.string, tuple((name, processors.get(name)) for name in names),
                     named, compiled, results)


def _values(compiled: _Compiled, params: Mapping[str, Any]) -> list[Any] | dict[str, Any]:
    """``params`` with the statement's literal values, processed: in its parameters' order,
    or by name for a driver that takes them so."""
    merged = compiled.compiled.construct_params(params, _check=False)
    if compiled.named:
        return {name: merged[name] if process is None or merged[name] is None
                else process(merged[name])
                for name, process in compiled.params}
    return [merged[name] if process is None or merged[name] is None
            else process(merged[name])
            for name, process in compiled.params]


@dataclass(frozen=True)
class Result:
    """What a ``Direct`` statement returned: its rows (processed) and the driver's row count."""

    rows: list[tuple[Any, ...]]
    rowcount: int

    def all(self) -> list[tuple[Any, ...]]:
        """Every row (as SQLAlchemy's result gives them)."""
        return self.rows

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


def insert_for(dialect: str, table: Table) -> Any:
    """The named dialect's own INSERT of ``table`` (its ``ON CONFLICT`` is the dialect's)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert

        return postgresql_insert(table)
    if dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert as sqlite_insert

        return sqlite_insert(table)
    return insert(table)


class DirectInsert:
    """An INSERT of given columns into a table on the driver's cursor, the columns it leaves
    out filled with their Python-side defaults as SQLAlchemy's execution would fill them; once
    only with ``conflict_skipped`` (``ON CONFLICT DO NOTHING``), reading back ``returning``."""

    def __init__(self, direct: Direct, defaults: dict[str, Callable[[], Any]]) -> None:
        self.direct = direct
        self.defaults = defaults

    @classmethod
    def of(cls, table: Table, columns: Sequence[str], dialect: Dialect,
           conflict_skipped: bool = False, returning: Sequence[str] = ()) -> DirectInsert | None:
        """The direct INSERT of ``columns`` on ``dialect``, or None when a default cannot be
        filled here or the statement cannot run directly there."""
        defaults = column_defaults(table, columns)
        if defaults is None or (conflict_skipped and dialect.name not in DRIVERS):
            return None
        stmt: Any = insert_for(dialect.name, table).values(
            {name: bindparam(name, type_=table.c[name].type) for name in [*columns, *defaults]})
        if conflict_skipped:
            stmt = stmt.on_conflict_do_nothing()
        if returning:
            stmt = stmt.returning(*(table.c[name] for name in returning))
        direct = Direct.on(stmt, dialect)
        return cls(direct, defaults) if direct is not None else None

    def _filled(self, row: Mapping[str, Any]) -> Mapping[str, Any]:
        if not self.defaults:
            return row
        return {**{name: make() for name, make in self.defaults.items()}, **row}

    def run(self, conn: Connection, row: Mapping[str, Any]) -> Result:
        """INSERT one row."""
        return self.direct.run(conn, self._filled(row))

    def run_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """INSERT ``rows`` (the driver's executemany)."""
        self.direct.run_many(conn, [self._filled(row) for row in rows])
