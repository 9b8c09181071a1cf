"""The store's batched writes: rows in one INSERT, the message log written at commit, and
pooled PostgreSQL connections that a server ended are replaced before use."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import event, select, text

from bidding.auction.opening import row_values
from bidding.config import Settings
from bidding.lifecycle import journal, states
from bidding.models import Announcement
from bidding.store import read_session, write_session
from bidding.store.engine import get_engine
from bidding.store.rows import insert_rows
from bidding.store.schema import AnnouncementRow, BidRow, Message
from tests.unit.conftest import end_server_session, postgres_database, psycopg_commands


def _statements(url: str) -> list[str]:
    """The statements the store's engine runs from now on (a list that fills up)."""
    seen: list[str] = []

    @event.listens_for(get_engine(url), "before_cursor_execute")
    def _seen(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        seen.append(statement.split()[0].upper())

    return seen


def test_a_transactions_messages_are_written_in_order_with_one_statement_at_commit(
        settings: Settings) -> None:
    url = settings.database_url
    seen = _statements(url)
    # given a transaction that logs three messages, one with nested JSON detail
    with write_session(url) as session:
        journal.record(session, "t1", journal.ANNOUNCED, at=1.0, candidates=["a", "b"])
        journal.write(session, [journal.message("t1", journal.BID, node="a", at=2.0),
                                journal.message("t1", journal.BID, node="b", at=3.0,
                                                payload={"x": [1, None, "é"]})])
        # then nothing is sent before the commit
        assert seen == []
    # and the commit sends them in one INSERT (on PostgreSQL, with the COMMIT, past
    # SQLAlchemy: see the next test)
    assert seen.count("INSERT") == (1 if url.startswith("sqlite") else 0)
    # and the log has them in the order they were made, with their details
    with read_session(url) as session:
        rows = session.execute(select(Message.kind, Message.node, Message.detail)
                               .order_by(Message.id)).all()
    assert [(r.kind, r.node) for r in rows] == [
        ("ANNOUNCED", None), ("BID", "a"), ("BID", "b")]
    assert rows[0].detail == {"candidates": ["a", "b"]}
    assert rows[2].detail == {"payload": {"x": [1, None, "é"]}}


def test_on_postgresql_a_transactions_messages_travel_with_its_commit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with postgres_database() as url:
        sent = psycopg_commands(monkeypatch)
        announcement = Announcement(
            task_id="t1", task_name="tasks.t", task_type="t", announced_at=1.0
        )
        # given a transaction that adds a row and logs a message
        with write_session(url) as session:
            session.add(AnnouncementRow(**row_values(announcement, states.BIDDING, [])))
            journal.record(session, "t1", journal.ANNOUNCED, at=1.0)
        # then its COMMIT went in one pipeline with the message's INSERT, and no other
        assert [c for c in sent if c[0] == "COMMIT"] == [("COMMIT", True)]
        # and both the row and the message are stored
        with read_session(url) as session:
            assert session.scalars(select(AnnouncementRow.task_id)).all() == ["t1"]
            assert session.scalars(select(Message.kind)).all() == ["ANNOUNCED"]


def test_on_postgresql_a_message_that_fails_at_commit_takes_the_transaction_with_it() -> None:
    from sqlalchemy.exc import DataError

    with postgres_database() as url:
        announcement = Announcement(
            task_id="t1", task_name="tasks.t", task_type="t", announced_at=1.0
        )
        # given a transaction that adds a row and logs a message the log cannot hold (a node
        # name longer than its column)
        with pytest.raises(DataError) as raised, write_session(url) as session:
            session.add(AnnouncementRow(**row_values(announcement, states.BIDDING, [])))
            journal.record(session, "t1", journal.ANNOUNCED, node="n" * 40, at=1.0)
        assert "too long" in str(raised.value)
        # then neither is stored, and the pooled connection works for the next transaction
        with write_session(url) as session:
            journal.record(session, "t2", journal.ANNOUNCED, at=2.0)
        with read_session(url) as session:
            assert session.scalars(select(AnnouncementRow.task_id)).all() == []
            assert session.scalars(select(Message.task_id)).all() == ["t2"]


def test_on_postgresql_a_server_lost_at_commit_is_the_error_an_outage_is_waited_out_on() -> None:
    from sqlalchemy.exc import OperationalError

    from bidding.store.outage import retryable

    with postgres_database() as url:
        # given a transaction that logs a message, whose server session ends before it commits
        with pytest.raises(OperationalError) as raised, write_session(url) as session:
            pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
            journal.record(session, "t1", journal.ANNOUNCED, at=1.0)
            with get_engine(url).connect() as other:
                other.execute(text("SELECT pg_terminate_backend(:pid, 5000)"), {"pid": pid})
                other.commit()
        # then the commit fails with SQLAlchemy's error for a lost connection, which the writes
        # that must not fail retry (store.outage)
        assert raised.value.connection_invalidated
        assert retryable(url, raised.value)
        # and the next transaction runs on a new connection
        with write_session(url) as session:
            journal.record(session, "t2", journal.ANNOUNCED, at=2.0)
        with read_session(url) as session:
            assert session.scalars(select(Message.task_id)).all() == ["t2"]


def test_on_postgresql_reads_run_without_a_transaction_and_writes_keep_theirs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with postgres_database() as url:
        with read_session(url) as session:  # the pool's connection, made and handed back
            session.execute(text("SELECT 1"))
        sent = psycopg_commands(monkeypatch)
        # when a read session runs a statement
        with read_session(url) as session:
            session.execute(text("SELECT 1"))
        # then no BEGIN or ROLLBACK went to the server: one round trip, the statement
        assert sent == []
        # and a write session on the same pooled connection still rolls back as a whole
        with pytest.raises(RuntimeError), write_session(url) as session:
            journal.record(session, "t1", journal.ANNOUNCED, at=1.0)
            session.execute(
                text(
                    "INSERT INTO bidding_messages (task_id, kind, attempt, "
                    "detail, at) VALUES ('t0', 'ANNOUNCED', 1, '{}', 0)"
                )
            )
            raise RuntimeError("boom")
        assert ("BEGIN", False) in sent and ("ROLLBACK", False) in sent
        with read_session(url) as session:
            assert session.scalars(select(Message.task_id)).all() == []


def test_a_transaction_that_rolls_back_logs_nothing(settings: Settings) -> None:
    url = settings.database_url
    # given a transaction that logs a message and then fails
    with pytest.raises(RuntimeError), write_session(url) as session:
        journal.record(session, "t1", journal.ANNOUNCED, at=1.0)
        raise RuntimeError("boom")
    # when the next transaction commits a message of its own
    with write_session(url) as session:
        journal.record(session, "t2", journal.ANNOUNCED, at=2.0)
    # then only that one is in the log
    with read_session(url) as session:
        assert session.scalars(select(Message.task_id)).all() == ["t2"]


def test_rows_go_in_with_their_ids_returned_in_their_order(settings: Settings) -> None:
    url = settings.database_url
    # given an announcement with bids stored already
    announcement = Announcement(task_id="t1", task_name="tasks.t", task_type="t", announced_at=1.0)
    with write_session(url) as session:
        session.add(AnnouncementRow(**row_values(announcement, states.BIDDING, [])))

    def bids(names: list[str]) -> list[dict[str, Any]]:
        return [{"task_id": "t1", "attempt": 1, "node": name, "will_bid": name != "n1",
                 "reason": "", "payload": {"i": i}, "breakdown": {}, "score": i / 10,
                 "is_winner": name == "n2", "late": False, "bid_at": float(i)}
                for i, name in enumerate(names)]

    with write_session(url) as session:
        earlier = insert_rows(session, BidRow.__table__, bids(["e0", "e1", "e2"]),
                              returning=("id",))
    # (the newest of them pruned since: its id may be given again)
    with write_session(url) as session:
        session.execute(text("DELETE FROM bidding_bids WHERE node = 'e2'"))
    # when 250 rows are inserted, returning their ids and two of their columns
    names = [f"n{i}" for i in range(250)]
    seen = _statements(url)
    with write_session(url) as session:
        got = insert_rows(session, BidRow.__table__, bids(names),
                          returning=("id", "node", "is_winner"))
    # then each row is stored as given, and what is returned is theirs, in their order,
    # typed as the columns are (none of the earlier rows among them); on SQLite in one
    # INSERT on the driver's cursor, between a read of the largest id and the read-back
    if url.startswith("sqlite"):
        assert seen == ["SELECT", "INSERT", "SELECT"]
    assert [node for _, node, _ in got] == names
    assert [is_winner for _, _, is_winner in got] == [name == "n2" for name in names]
    assert all(type(is_winner) is bool for _, _, is_winner in got)
    assert not {row_id for row_id, *_ in got} & {row_id for row_id, in earlier[:2]}
    with read_session(url) as session:
        stored = {b.id: b for b in session.scalars(select(BidRow))}
    assert all(stored[row_id].node == node for row_id, node, _ in got)
    by_node = {b.node: b for b in stored.values()}
    assert by_node["n2"].is_winner and not by_node["n1"].will_bid
    assert by_node["n7"].payload == {"i": 7} and by_node["n7"].score == pytest.approx(0.7)


def test_a_pooled_connection_the_server_ended_is_replaced_before_use() -> None:
    with postgres_database() as url:
        # given a pooled connection whose server session is then terminated (a restart, an
        # administrator's pg_terminate_backend)
        with read_session(url) as session:
            pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        end_server_session(url, pid)
        # when the next session is opened, then it works (no error reaches the caller)
        with write_session(url) as session:
            now = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        # on another server session
        assert now != pid


def test_the_pool_size_follows_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from celery import Celery

    from bidding.config import get_settings

    with postgres_database() as url:
        app = Celery("pool", set_as_current=False)
        app.conf.update(bidding_database_url=url, bidding_db_pool_size=12)
        monkeypatch.setattr("bidding.config._pool_size", [5])
        get_settings(app)
        from bidding.store.engine import dispose_all

        dispose_all()
        assert get_engine(url).pool.size() == 12  # type: ignore[attr-defined]


def test_an_award_waiting_for_a_nodes_lock_counts_the_work_awarded_meanwhile() -> None:
    import threading

    from bidding.auction.history import lock_states
    from bidding.nodes.heartbeat import heartbeat
    from bidding.nodes.profile import NodeProfile

    with postgres_database() as url:
        settings = Settings(database_url=url, auto_migrate=False)
        heartbeat(settings, NodeProfile(name="redfin", capabilities=["pdf"]))
        announcement = Announcement(
            task_id="t1", task_name="tasks.t", task_type="t", announced_at=1.0
        )
        counted: list[int] = []
        # given an award that holds redfin's lock and assigns it a task
        with write_session(url) as first:
            lock_states(first, ["redfin"], lock=True, task_type="t", since=0.0)
            first.add(
                AnnouncementRow(
                    **{
                        **row_values(announcement, states.ASSIGNED, ["redfin"]),
                        "assigned_node": "redfin",
                    }
                )
            )

            # when a second award reads redfin's state meanwhile (it waits for the lock)
            def second() -> None:
                with write_session(url) as session:
                    counted.append(
                        lock_states(session, ["redfin"], lock=True, task_type="t", since=0.0)[
                            "redfin"
                        ].in_flight
                    )

            waiter = threading.Thread(target=second)
            waiter.start()
            waiter.join(0.5)
            assert waiter.is_alive()  # held back by the lock
        # then, once the first commits, the second counts the task it assigned
        waiter.join(10)
        assert counted == [1]
