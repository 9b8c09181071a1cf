"""Statements run on the driver's cursor (``store.direct``), SQLite's and psycopg's: the same
rows, values, events and errors as SQLAlchemy's execution of them."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import bindparam, event, select, text, update
from sqlalchemy.exc import IntegrityError, OperationalError

from bidding.auction.opening import row_values
from bidding.lifecycle import states
from bidding.models import Announcement
from bidding.store import read_session, write_session
from bidding.store.direct import Direct
from bidding.store.engine import core, get_engine
from bidding.store.rows import insert_rows
from bidding.store.schema import AnnouncementRow
from tests.unit.conftest import end_server_session, postgres_database

_TABLE: Any = AnnouncementRow.__table__


def _announced(url: str, task_id: str) -> None:
    with write_session(url) as session:
        session.add(AnnouncementRow(**row_values(
            Announcement(task_id=task_id, task_name="t.work", task_type="extract",
                         announced_at=10.0),
            states.ASSIGNED, ["north"])))


@contextmanager
def _store(kind: str, sqlite_url: str) -> Iterator[str]:
    if kind == "sqlite":
        yield sqlite_url
    else:
        with postgres_database() as url:
            yield url


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_an_update_returns_its_rows_decoded_and_fires_the_engines_events(
        store_url: str, kind: str) -> None:
    with _store(kind, store_url) as url:
        _an_update_returns_its_rows(url)


def _an_update_returns_its_rows(sqlite_url: str) -> None:
    # given an assigned task, and a listener on the engine's cursor events
    _announced(sqlite_url, "t1")
    seen: list[tuple[str, str]] = []
    engine = get_engine(sqlite_url)

    @event.listens_for(engine, "before_cursor_execute")
    def _before(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        seen.append(("before", statement.split()[0]))

    @event.listens_for(engine, "after_cursor_execute")
    def _after(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        seen.append(("after", statement.split()[0]))

    moved = Direct(update(_TABLE)
                   .where(_TABLE.c.task_id == bindparam("t"), _TABLE.c.state == states.ASSIGNED)
                   .values(state=states.EXECUTING, started_at=bindparam("at"))
                   .returning(_TABLE.c.spec, _TABLE.c.candidates, _TABLE.c.started_at))
    # when it moves the task on the cursor, and once more (the state no longer matches)
    with write_session(sqlite_url) as session:
        first = moved.run(core(session), {"t": "t1", "at": 12.5})
        second = moved.run(core(session), {"t": "t1", "at": 13.0})
    # then the first returned the row with its JSON decoded, the second nothing
    row = first.one_or_none()
    assert row is not None and row[0]["task_id"] == "t1"
    assert (row[1], row[2], first.rowcount) == (["north"], 12.5, 1)
    assert second.rowcount == 0 and second.one_or_none() is None
    # and the change is committed with the session's transaction
    with read_session(sqlite_url) as session:
        stored = session.execute(select(_TABLE.c.state, _TABLE.c.started_at)).one()
    assert tuple(stored) == (states.EXECUTING, 12.5)
    # and each run fired the engine's cursor events, as SQLAlchemy's execution does
    assert seen.count(("before", "UPDATE")) == 2 and seen.count(("after", "UPDATE")) == 2


def test_a_drivers_error_is_raised_as_sqlalchemys(store_url: str) -> None:
    sqlite_url = store_url
    # given a task's row
    _announced(sqlite_url, "t1")
    # when the same key is inserted on the cursor
    with pytest.raises(IntegrityError, match="UNIQUE"), write_session(sqlite_url) as session:
        insert_rows(session, _TABLE, [row_values(
            Announcement(task_id="t1", task_name="t.work", task_type="x", announced_at=1.0),
            states.BIDDING, [])])
    # then the error is SQLAlchemy's (what the store's outage handling reads), and nothing of
    # the transaction is kept
    with read_session(sqlite_url) as session:
        assert session.execute(select(_TABLE.c.task_type)).scalars().all() == ["extract"]


def test_only_sqlite_and_plain_parameters_run_directly(store_url: str) -> None:
    sqlite_url = store_url
    # given a statement with an expanding IN, and one with plain parameters
    expanding = Direct(select(_TABLE.c.task_id).where(
        _TABLE.c.task_id.in_(bindparam("ids", expanding=True))))
    plain = Direct(select(_TABLE.c.task_id).where(_TABLE.c.task_id == bindparam("t")))
    # when each is run where it cannot be, then it is refused, saying why
    assert not Direct.runs(expanding.statement, get_engine(sqlite_url).dialect)
    with write_session(sqlite_url) as session, pytest.raises(ValueError, match="plain"):
        expanding.run(core(session), {"ids": ["t1"]})
    assert Direct.runs(plain.statement, get_engine(sqlite_url).dialect)
    # and on a driver it does not know (psycopg 2), the same
    from sqlalchemy.dialects.postgresql import psycopg2

    assert not Direct.runs(plain.statement, psycopg2.dialect())


def test_on_postgresql_a_connection_lost_under_a_direct_statement_leaves_the_pool() -> None:
    from bidding.store.outage import retryable

    moved = Direct(update(_TABLE).where(_TABLE.c.task_id == bindparam("t"))
                   .values(started_at=bindparam("at")))
    with postgres_database() as url:
        _announced(url, "t1")
        # given a transaction whose server session ends before its direct statement runs
        with pytest.raises(OperationalError) as raised, write_session(url) as session:
            pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
            end_server_session(url, pid)
            moved.run(core(session), {"t": "t1", "at": 5.0})
        # then the error is SQLAlchemy's for a lost connection, which the writes that must not
        # fail wait out (store.outage)
        assert raised.value.connection_invalidated
        assert retryable(url, raised.value)
        # and the next transaction runs on a new server session, the statement with it
        with write_session(url) as session:
            assert session.execute(text("SELECT pg_backend_pid()")).scalar_one() != pid
            assert moved.run(core(session), {"t": "t1", "at": 6.0}).rowcount == 1
        with read_session(url) as session:
            assert session.execute(select(_TABLE.c.started_at)).scalar_one() == 6.0


def test_every_tables_python_defaults_can_be_filled_without_sqlalchemys_execution() -> None:
    from bidding.store.direct import column_defaults
    from bidding.store.schema import Base

    # given every table of the store, none of its columns given
    for table in Base.metadata.sorted_tables:
        # when its Python-side defaults are made as a direct INSERT makes them
        made = column_defaults(table, ())
        # then each can be made (none needs SQLAlchemy's execution context), a new value
        # each time for a mutable one
        assert made is not None, table.name
        for name, make in made.items():
            first, second = make(), make()
            assert first == second, (table.name, name)
            if isinstance(first, (list, dict)):
                assert first is not second, (table.name, name)


def test_a_direct_insert_fills_the_columns_left_out_as_sqlalchemy_does(store_url: str) -> None:
    from bidding.store.direct import DirectInsert

    # given a new task's row with only the columns an announcement gives, inserted directly
    given = row_values(Announcement(task_id="t2", task_name="t.work", task_type="x",
                                    announced_at=1.0), states.BIDDING, ["north"])
    del given["content"]  # (left out too: filled with its default)
    direct = DirectInsert.of(_TABLE, tuple(given), get_engine(store_url).dialect)
    assert direct is not None
    with write_session(store_url) as session:
        direct.run(core(session), given)
        # and the same row inserted through SQLAlchemy
        session.execute(_TABLE.insert(), {**given, "task_id": "t3", "spec": {
            **given["spec"], "task_id": "t3"}})
    # then both rows hold the same defaults
    with read_session(store_url) as session:
        rows = session.execute(select(_TABLE).where(_TABLE.c.task_id.in_(["t2", "t3"]))
                               .order_by(_TABLE.c.task_id)).mappings().all()
    differ = {k for k in rows[0] if rows[0][k] != rows[1][k]}
    assert differ == {"task_id", "spec"}
    assert rows[0]["progress"] == {} and rows[0]["content"] == "" and rows[0]["bids_received"] == 0


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
def test_the_auctions_statements_run_on_the_drivers_cursor(kind: str) -> None:
    from sqlalchemy.dialects import postgresql, sqlite

    from bidding.auction.opening import _direct_new
    from bidding.execution.episodes import (
        _RECORD,
        CLAIMS,
        _episode_with_claims,
        _record_attempt,
        _typed,
    )
    from bidding.lifecycle import journal
    from bidding.lifecycle.transition import _update, _with_messages
    from bidding.store.once import _direct_once
    from bidding.store.rows import _direct_insert

    # given the installed SQLAlchemy (a release that renamed what Direct reads would send
    # these back through its own execution, silently slower: this says so)
    dialect = sqlite.dialect() if kind == "sqlite" else postgresql.psycopg.dialect()
    begin = _update(("ASSIGNED",), "EXECUTING", (True, True, False), ("started_at",), (),
                    ("spec",))
    new = row_values(Announcement(task_id="t", task_name="t.w", task_type="x",
                                  announced_at=1.0), states.BIDDING, [])
    message = journal.message("t", journal.ANNOUNCED, at=1.0)
    # then a task's transition, its new row, its messages, an insert-once and the node's
    # records each run directly
    assert Direct.runs(begin, dialect)
    assert _direct_new(tuple(new), dialect) is not None
    assert _direct_insert(journal.MESSAGES, tuple(message), dialect) is not None
    assert _direct_once(_TABLE, tuple(new), True, dialect) is not None
    assert Direct.runs(_RECORD, dialect) and Direct.runs(_typed(kind), dialect)
    # and the episode: SQLite's with its bid's claims; PostgreSQL's with its ledger entry and
    # records, and a node's start with its message, each one statement
    from bidding.store.schema import Episode, LedgerEntry

    every = tuple(c.name for c in Episode.__table__.columns
                  if c.name != "id" and c.name not in CLAIMS)
    if kind == "sqlite":
        assert Direct.runs(_episode_with_claims(every), dialect)
    else:
        charge = tuple(c.name for c in LedgerEntry.__table__.columns if c.name != "id")
        assert Direct.runs(_record_attempt(every, charge), dialect)
        assert Direct.runs(_with_messages(begin, 1, ("spec",)), dialect)
        # (an attempt's end: its transitions with its entry, episode and records)
        from bidding.execution.episodes import _record_attempt, _returning_node

        end = _update(("EXECUTING",), "SUCCESS", (True, True, False), ("result",), (),
                      ("task_id",))
        assert Direct.runs(_with_messages(end, 2, ("task_id",), (
            _returning_node(_record_attempt(every, charge)),)), dialect)
    # and a transition from several states (an IN SQLAlchemy expands) does not
    several = _update(("ASSIGNED", "EXECUTING"), "FAILED", (True, True, False), (), (), ())
    assert not Direct.runs(several, dialect)


def test_a_statement_whose_python_defaults_sqlalchemy_computes_does_not_run_directly() -> None:
    from sqlalchemy import insert
    from sqlalchemy.dialects import postgresql, sqlite

    from bidding.execution.episodes import _episode_with_claims

    # given INSERTs that leave out columns with Python-side defaults (an episode's skills, a
    # task's progress), which SQLAlchemy's execution computes for a top-level INSERT
    partial = _episode_with_claims(("task_id", "attempt", "node", "task_type", "success"))
    # then they run through SQLAlchemy, which fills those defaults
    assert not Direct.runs(partial, sqlite.dialect())
    assert not Direct.runs(insert(_TABLE), postgresql.psycopg.dialect())
