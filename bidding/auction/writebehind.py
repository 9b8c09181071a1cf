"""The write-behind journal of new proxy awards (``bidding_award_journal``).

A new task whose candidates the caller may all bid for is decided in the caller, from one
read of the bidders' state; what the award's transaction wrote (the announcement, the scored
bids, the award and their messages) goes instead into a Redis stream, in one Lua call that
also reserves the winner, and the caller sends the execution at once. The node workers'
writers (one loop each, a consumer group) write the entries to the store in batches, one
transaction per batch, and acknowledge them after its commit; the winner waits for its
entry's row before it starts, and writes it itself if no writer has (``settle``).
docs/architecture.md section 19a lists the invariants and the crash points; in short:

- The Lua call is the award: the task, its bids and its winner are in Redis (the ``pending``
  hash and the stream) or in the store, never neither, and nothing else can award the task
  until it is in the store (it has a fresh id: no other closer knows it).
- Writing is idempotent: an entry's announcement is inserted once and the rest only with it,
  so a batch replayed after a writer was killed between its commit and its acknowledgement,
  or an entry a winner wrote first, is written once.
- Reservations: the winner's task id is in its Redis set from the award until its entry is in
  the store, and the next award counts it; the set is read before the store, so an award may
  count a task twice for a moment, never not at all. Each node's reservations have a version,
  counted up by every reserve and release; the award's compare-and-set on its winner's
  version makes concurrent awards spread as the store's row locks do (a count could fall and
  rise back between the read and the append, and two awards take the same slot).
- An append whose reply was lost (a timeout, a reset connection) may have been taken: the
  caller asks the journal before it falls back to the store, and when Redis cannot say, the
  store's award inserts the announcement once, so that it and a writer's never both land
  (``AppendUnknown``, ``announce._award_behind``).
- An entry the store refuses, or that this version cannot read, does not hold up the others
  of its batch (``write_isolated``, ``Writer``): refused, its task ends FAILED and leaves the
  journal (``refused.fail_unrecorded``); unreadable, it waits for a writer that can read it
  (a newer version's), for ``UNREADABLE_GRACE`` at most.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from textwrap import shorten
from typing import Any

import redis
from celery import Celery
from pydantic import ValidationError
from sqlalchemy import bindparam, select

from bidding.auction.award import RESERVATION_TRIES, decide_award, strategy_of, write_award
from bidding.auction.board import RedisConnections, get_board, parse_answer
from bidding.auction.history import lock_states
from bidding.auction.opening import record_new
from bidding.auction.proxy import PROXY_CLOSE, answers_inside
from bidding.auction.refused import REASON_CHARS, Failed, fail_unrecorded, reason_of, refuses
from bidding.config import Settings
from bidding.models import Announcement, Award, Bid, Refusal, describe_validation
from bidding.nodes.registry import LiveNode
from bidding.store import read_session, write_session
from bidding.store.schema import Announcement as AnnouncementRow

logger = logging.getLogger(__name__)

#: The consumer group of the node workers' writers.
GROUP = "writers"
#: Entries a writer takes in one batch (one transaction).
BATCH = 100
#: Milliseconds a writer waits for new entries before it looks again (and can be stopped).
BLOCK_MS = 500
#: Seconds between two passes of a writer's loop that found nothing (its read blocks anyway).
WRITER_PAUSE = 0.01
#: Seconds a winner waits for a writer to write its task's entry before it writes it itself.
WINNER_WAIT = 0.05
#: Seconds an entry no writer can read (written by a newer version, during a rolling upgrade)
#: is left for one that can, counted from its append; then it is failed as refused.
UNREADABLE_GRACE = 600.0
#: A writer silent for this many reclaim times (``bidding_journal_reclaim_seconds``) and
#: holding no entry is gone (a worker that stopped or was killed): it leaves the group.
GONE_AFTER_RECLAIMS = 2

# KEYS: the pending hash, the stream, the winner's reservations (any key when none), the
# nodes' reservation versions (a hash).
# ARGV: task id, entry JSON, the winner ('' when none), the version of its reservations
# expected (-1: not checked).
_APPEND = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 'duplicate' end
if ARGV[3] ~= '' and ARGV[4] ~= '-1'
   and tonumber(redis.call('HGET', KEYS[4], ARGV[3]) or '0') ~= tonumber(ARGV[4]) then
  return 'stale'
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] ~= '' then
  redis.call('SADD', KEYS[3], ARGV[1])
  redis.call('HINCRBY', KEYS[4], ARGV[3], 1)
end
return redis.call('XADD', KEYS[2], '*', 'task', ARGV[1])
"""

# KEYS: the stream. ARGV: the group, the calling consumer (kept), the idle milliseconds after
# which a consumer holding no entry is gone. One call: a consumer cannot take an entry between
# being found empty and being deleted (DELCONSUMER drops what a consumer holds). No stream or
# no group: nothing to delete.
_DROP_GONE = """
local gone = {}
local consumers = redis.pcall('XINFO', 'CONSUMERS', KEYS[1], ARGV[1])
if consumers['err'] then return gone end
for _, consumer in ipairs(consumers) do
  local c = {}
  for i = 1, #consumer, 2 do c[consumer[i]] = consumer[i + 1] end
  if c['name'] ~= ARGV[2] and tonumber(c['pending']) == 0
     and tonumber(c['idle']) >= tonumber(ARGV[3]) then
    redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], c['name'])
    table.insert(gone, c['name'])
  end
end
return gone
"""

STALE = "stale"


class AlreadyJournaled(RuntimeError):
    """The task is in the journal already (with a fresh id: a retried append whose first
    call was taken and its reply lost)."""


class AppendUnknown(RuntimeError):
    """An append failed and the journal may hold its award nonetheless (its reply was lost and
    Redis could not be asked, or the entry is gone from it: written already, or never taken).
    Only the store can tell: its award of the task must insert the announcement once."""


@dataclass(frozen=True)
class Reservations:
    """A node's awards not in the store yet: how many, and the version of that count (counted
    up by every reserve and release, so a count that fell and rose back is not the same)."""

    count: int
    version: int


@dataclass(frozen=True)
class Entry:
    """One award as the caller's transaction would have written it."""

    rfp: Announcement
    candidates: list[str]
    answers: list[Bid | Refusal]
    award: Award
    #: The bidders' in-flight counts the award saw (the stored bids' loads).
    counts: dict[str, int]

    def to_json(self) -> str:
        """The entry as JSON (JSON only, as every message of ours)."""
        return json.dumps({
            "rfp": self.rfp.model_dump(mode="json"), "candidates": self.candidates,
            "answers": [a.model_dump(mode="json") for a in self.answers],
            "award": self.award.model_dump(mode="json"), "counts": self.counts})

    @classmethod
    def from_json(cls, raw: bytes | str) -> Entry:
        """An entry from ``to_json``'s form."""
        data = json.loads(raw)
        return cls(rfp=Announcement.model_validate(data["rfp"]),
                   candidates=list(data["candidates"]),
                   answers=[parse_answer(a) for a in data["answers"]],
                   award=Award.model_validate(data["award"]),
                   counts={str(k): int(v) for k, v in data["counts"].items()})


@dataclass(frozen=True)
class Unreadable:
    """An entry this version cannot read (a newer version's, during a rolling upgrade)."""

    task_id: str
    raw: str
    #: Why it could not be read.
    error: str

    def salvage(self) -> tuple[Announcement, list[str], str | None]:
        """What can be read of it to fail its task: the announcement (without the options
        this version does not know; at the least its id and name), its candidates and its
        winner (None when not even that can be read)."""
        try:
            data = _object(json.loads(self.raw))
        except ValueError:
            data = {}
        spec = _object(data.get("rfp"))
        known = {k: v for k, v in spec.items() if k in Announcement.model_fields}
        try:
            rfp = Announcement.model_validate({**known, "task_id": self.task_id})
        except ValueError:
            rfp = Announcement(task_id=self.task_id,
                               task_name=str(spec.get("task_name") or "unknown"),
                               task_type=str(spec.get("task_type") or "unknown")[:64])
        winner = _object(data.get("award")).get("winner")
        candidates = data.get("candidates")
        return (rfp, [str(c) for c in candidates] if isinstance(candidates, list) else [],
                winner if isinstance(winner, str) else None)


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def read_entry(task_id: str, raw: bytes | str) -> Entry | Unreadable:
    """``raw`` as an entry, or as unreadable by this version (with why)."""
    try:
        return Entry.from_json(raw)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
        why = describe_validation(exc) if isinstance(exc, ValidationError) else reason_of(exc)
        return Unreadable(task_id, text, shorten(why, REASON_CHARS, placeholder=" ..."))


class Journal:
    """The journal's keys in one Redis, for one store: a hash of the entries not written yet
    (by task id), the stream that orders them for the writers, and each node's reservations.
    The keys share a hash tag, so a Lua call may touch them all on a Redis Cluster too."""

    def __init__(self, shared: RedisConnections, database_url: str) -> None:
        tag = hashlib.sha1(database_url.encode()).hexdigest()[:16]
        prefix = f"bidding:journal:{{{tag}}}"
        self.client = shared.client
        self.blocking = shared.blocking
        self.stream = f"{prefix}:stream"
        self.pending = f"{prefix}:pending"
        self.reserved_prefix = f"{prefix}:reserved:"
        #: Each node's reservation version (``Reservations``), one hash.
        self.versions = f"{prefix}:versions"
        self._append = self.client.register_script(_APPEND)
        self._drop_gone = self.client.register_script(_DROP_GONE)
        self._group_ready = False

    def reserved_key(self, node: str) -> str:
        """The set of ``node``'s awards not in the store yet."""
        return self.reserved_prefix + node

    def reserved(self, nodes: Sequence[str]) -> dict[str, int]:
        """How many awards not in the store yet each of ``nodes`` has (one round trip)."""
        return {node: r.count for node, r in self.reservations(nodes).items()}

    def reservations(self, nodes: Sequence[str]) -> dict[str, Reservations]:
        """Each of ``nodes``' reservations with their version (one round trip)."""
        if not nodes:
            return {}
        pipe = self.client.pipeline(transaction=True)
        for node in nodes:
            pipe.scard(self.reserved_key(node))
        pipe.hmget(self.versions, list(nodes))
        *counts, versions = pipe.execute()
        return {node: Reservations(int(n), int(v or 0))
                for node, n, v in zip(nodes, counts, versions, strict=True)}

    def append(self, entry: Entry, expect: int | None) -> str:
        """Award ``entry``: keep it, reserve its winner and queue it for the writers, in one
        call. ``STALE`` when the version of the winner's reservations is not ``expect`` any
        more (another award took it, or one left it, meanwhile: decide again); else the stream
        id. Raises ``AlreadyJournaled`` when the task is in the journal already."""
        winner = entry.award.winner
        result = self._append(
            keys=[self.pending, self.stream, self.reserved_key(winner or ""), self.versions],
            args=[entry.rfp.task_id, entry.to_json(), winner or "",
                  -1 if expect is None else expect])
        text = result.decode() if isinstance(result, bytes) else str(result)
        if text == "duplicate":
            raise AlreadyJournaled(f"task {entry.rfp.task_id} is in the journal already")
        return text

    def entries(self, task_ids: Sequence[str]) -> list[Entry | Unreadable | None]:
        """The entries of ``task_ids`` not written yet (None: written, or never journaled), each
        read on its own: one this version cannot read is ``Unreadable``."""
        if not task_ids:
            return []
        found = self.client.hmget(self.pending, list(task_ids))
        return [None if raw is None else read_entry(task_id, raw)
                for task_id, raw in zip(task_ids, found, strict=True)]

    def forget(self, entries: Sequence[Entry]) -> None:
        """``entries`` are in the store: drop them and their reservations."""
        self.release([(e.rfp.task_id, e.award.winner) for e in entries])

    def release(self, tasks: Sequence[tuple[str, str | None]]) -> None:
        """Drop the entries of ``tasks`` (task id, winner) and their winners' reservations, in
        one transaction; each release counts its winner's version up."""
        if not tasks:
            return
        pipe = self.client.pipeline(transaction=True)
        for task_id, winner in tasks:
            if winner:
                pipe.srem(self.reserved_key(winner), task_id)
                pipe.hincrby(self.versions, winner, 1)
        pipe.hdel(self.pending, *[task_id for task_id, _ in tasks])
        pipe.execute()

    def ensure_group(self) -> None:
        """Create the writers' group (from the stream's start) unless it exists."""
        if self._group_ready:
            return
        try:
            self.client.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        self._group_ready = True

    def read(self, consumer: str, *, own: bool = False,
             block_ms: int = BLOCK_MS) -> list[tuple[str, str]]:
        """Up to ``BATCH`` entries for ``consumer`` as (stream id, task id): new ones (waiting
        up to ``block_ms``), or with ``own`` those it took before and has not acknowledged."""
        got = self._with_group(lambda: (self.blocking if not own else self.client).xreadgroup(
            GROUP, consumer, {self.stream: "0" if own else ">"}, count=BATCH,
            block=None if own else block_ms))
        return _pairs(got[0][1] if got else [])

    def _with_group(self, call: Callable[[], Any]) -> Any:
        """``call()``, after making the writers' group again if Redis lost it (restarted
        without persistence, or the stream deleted): what it had is gone with it."""
        try:
            return call()
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
        self._group_ready = False
        self.ensure_group()
        return call()

    def reclaim(self, consumer: str, idle_ms: int) -> list[tuple[str, str]]:
        """Entries another writer took more than ``idle_ms`` ago and never acknowledged (it
        was killed), now ``consumer``'s."""
        got = self._with_group(lambda: self.client.xautoclaim(
            self.stream, GROUP, consumer, min_idle_time=idle_ms, start_id="0-0", count=BATCH))
        return _pairs(got[1])

    def drop_gone(self, consumer: str, idle_ms: int) -> list[str]:
        """Delete the writers (consumers) other than ``consumer`` that have held no entry and
        been silent for ``idle_ms``: each worker process's writer has a name of its own, so a
        restarted worker leaves its old one behind. A live writer deleted while idle comes
        back with its next read. Returns the names deleted."""
        gone = self._drop_gone(keys=[self.stream], args=[GROUP, consumer, idle_ms])
        return [g.decode() if isinstance(g, bytes) else str(g) for g in gone or []]

    def now_ms(self) -> int:
        """Redis's clock in milliseconds (the one its stream ids are made from)."""
        seconds, micros = self.client.time()
        return int(seconds) * 1000 + int(micros) // 1000

    def ack(self, ids: Sequence[str]) -> None:
        """The entries ``ids`` are written: acknowledge and delete them (the stream stays
        as short as the backlog)."""
        if not ids:
            return
        pipe = self.client.pipeline(transaction=True)
        pipe.xack(self.stream, GROUP, *ids)
        pipe.xdel(self.stream, *ids)
        pipe.execute()

    def backlog(self) -> int:
        """Entries not written to the store yet."""
        return int(self.client.hlen(self.pending))


def _pairs(messages: Sequence[Any]) -> list[tuple[str, str]]:
    pairs = []
    for stream_id, fields in messages:
        if not fields:  # deleted meanwhile (XAUTOCLAIM reports them so)
            continue
        sid = stream_id.decode() if isinstance(stream_id, bytes) else str(stream_id)
        task = fields.get(b"task", fields.get("task"))
        pairs.append((sid, task.decode() if isinstance(task, bytes) else str(task)))
    return pairs


_journals: dict[tuple[str, str, str], Journal] = {}


def get_journal(settings: Settings, app: Celery) -> Journal | None:
    """The journal of ``app``'s store, or None when ``bidding_award_journal`` is off or the bid
    board is not Redis (then every award is written in its own transaction)."""
    if not settings.award_journal:
        return None
    key = (settings.bid_board, str(app.conf.broker_url or ""), settings.database_url)
    found = _journals.get(key)
    if found is not None:
        return found
    shared = get_board(settings, app).redis
    if shared is None:
        logger.warning("bidding_award_journal needs the Redis bid board; awards are written "
                       "to the store in their own transaction")
        return None
    journal = _journals[key] = Journal(shared, settings.database_url)
    return journal


def award_behind(settings: Settings, app: Celery, rfp: Announcement,
                 nodes: Sequence[LiveNode]) -> Award | None:
    """Bid for ``nodes`` and award ``rfp`` (a new task with a fresh id) into the journal; the
    caller routes the award. None when the journal is off.

    The bidders' state is read outside any transaction, with their reservations, and the
    award's append compare-and-sets the version of the winner's reservations, so two
    concurrent awards do not both take a node's last slot; the last try appends as decided (as
    the store's path does).

    An append that fails, or finds the task in the journal already (redis-py sent it again
    after a lost reply), may have been taken: the award the journal holds is returned if it
    holds one; else ``AppendUnknown`` says that only the store can tell.
    """
    journal = get_journal(settings, app)
    if journal is None:
        return None
    strategy = strategy_of(settings, rfp)
    inside = answers_inside(settings, rfp, nodes)
    bidders = sorted(set(inside.nodes))
    candidates = [node.name for node in nodes]
    for try_no in range(1, RESERVATION_TRIES + 1):
        # Reservations before the store: a reservation written meanwhile is then counted
        # twice (in the store and the set) for a moment, never missed.
        seen = journal.reservations(bidders)
        held = {name: r.count for name, r in seen.items()}
        with read_session(settings.database_url) as session:
            known = lock_states(session, bidders, lock=False, task_type=rfp.task_type,
                                since=inside.now - settings.recent_failure_seconds)
            known = {name: replace(state, in_flight=state.in_flight + held.get(name, 0))
                     for name, state in known.items()}
            answers = list(inside.make(session, known))
        counts = {name: state.in_flight for name, state in known.items()}
        award = decide_award(settings, rfp, strategy, answers, counts, closed_by=PROXY_CLOSE,
                             candidates=len(nodes), extra_load=held)
        expect = None
        if award.winner is not None and try_no < RESERVATION_TRIES:
            # A fallback winner is no bidder: its reservations are read now.
            found = seen[award.winner] if award.winner in seen else \
                journal.reservations([award.winner])[award.winner]
            expect = found.version
        entry = Entry(rfp=rfp, candidates=candidates, answers=answers, award=award,
                      counts=counts)
        try:
            if journal.append(entry, expect) != STALE:
                return award
        except (redis.RedisError, AlreadyJournaled) as exc:
            return _taken(journal, rfp.task_id, exc)
    raise AssertionError("unreachable: the last try appends unchecked")


def _taken(journal: Journal, task_id: str, exc: Exception) -> Award:
    """The award the journal holds for ``task_id`` after its append failed with ``exc``; raises
    ``AppendUnknown`` when Redis cannot be asked, or the entry is not there (never taken, or
    written to the store and dropped already: the store tells those apart)."""
    try:
        (held,) = journal.entries([task_id])
    except redis.RedisError as again:
        raise AppendUnknown(f"journaling the award of {task_id} failed ({reason_of(exc)}) and "
                            f"Redis cannot say whether it took it ({reason_of(again)})") from exc
    if isinstance(held, Entry):
        logger.warning("journaling the award of %s reported %s, but the journal took it",
                       task_id, reason_of(exc))
        return held.award
    raise AppendUnknown(f"journaling the award of {task_id} failed ({reason_of(exc)}) and the "
                        "journal does not hold it (never taken, or written already)") from exc


_PRESENT = select(AnnouncementRow.task_id).where(
    AnnouncementRow.task_id.in_(bindparam("ids", expanding=True)))


@dataclass(frozen=True)
class Written:
    """What ``write_isolated`` did."""

    #: Entries written here (not those in the store already).
    count: int
    #: The entries the store refused, each with its reason.
    refused: list[tuple[Entry, str]]


def write_isolated(settings: Settings, entries: Sequence[Entry]) -> Written:
    """Write ``entries`` as ``write_entries`` does, in one transaction; if the store refuses
    it (a value of one entry: the same write would fail every time), write them one by one, so
    that only the entries the store refuses are left out (returned, with its reason). Raises
    when the store cannot be reached (``refused.refuses``): the batch is tried again later.

    One transaction per entry only after a refused batch: the common batch costs nothing more
    (a savepoint per entry would cost two statements each, every time)."""
    try:
        return Written(write_entries(settings, entries), [])
    except Exception as exc:
        if not refuses(exc):
            raise
        if len(entries) == 1:
            return Written(0, [(entries[0], reason_of(exc))])
    written, refused = 0, []
    for entry in entries:
        try:
            written += write_entries(settings, [entry])
        except Exception as exc:
            if not refuses(exc):
                raise
            refused.append((entry, reason_of(exc)))
    return Written(written, refused)


def write_entries(settings: Settings, entries: Sequence[Entry]) -> int:
    """Write ``entries`` to the store in one transaction, skipping those there already
    (idempotent: each one's announcement is inserted once, ``store.once``, and the rest only
    with it); returns how many were written here."""
    if not entries:
        return 0
    with write_session(settings.database_url) as session:
        seen: set[str] = set()
        written = 0
        for entry in entries:
            if entry.rfp.task_id in seen:
                continue
            seen.add(entry.rfp.task_id)
            # Once: written before (a replay), or by a winner writing its own (settle).
            if not record_new(session, entry.rfp, entry.candidates, once=True):
                continue
            if not write_award(session, settings, entry.rfp, entry.answers, entry.award,
                               entry.counts, write=True):
                raise AssertionError(f"{entry.rfp.task_id}: a new announcement was not open")
            written += 1
    return written


def settle(settings: Settings, app: Celery, task_id: str, *, wait: float = 0.0) -> bool:
    """Write ``task_id``'s entry now if it is still only in the journal (its winner, before it
    starts; ``explain``, so that it shows the award). True when it was written here.

    ``wait``: seconds to give a writer that is writing it first. A writer takes an entry the
    moment it is appended, while the execution is still on its way to the winner, so the
    winner usually finds it written, or being written, and waits rather than writing it too.
    """
    journal = get_journal(settings, app)
    if journal is None:
        return False
    deadline = time.monotonic() + wait
    pause = 0.0005
    while journal.client.hexists(journal.pending, task_id):
        if time.monotonic() >= deadline:
            break
        time.sleep(pause)
        pause = min(pause * 1.5, 0.005)
    else:
        return False  # not (or no longer) in the journal: in the store
    (entry,) = journal.entries([task_id])
    if not isinstance(entry, Entry):
        return False  # written meanwhile; or unreadable here: left to the writers
    if write_isolated(settings, [entry]).refused:
        return False  # the writer that holds it fails its task (it can acknowledge it)
    journal.forget([entry])
    return True


def wait_written(settings: Settings, app: Celery, task_id: str, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``task_id``'s row, writing its entry if it appears
    in the journal (a winner whose execution outran the award's append). False if it never
    does: the award was lost with a Redis that kept nothing on disk."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError):  # Redis back later: look again
            settle(settings, app, task_id)
        with read_session(settings.database_url) as session:
            if session.execute(_PRESENT, {"ids": [task_id]}).first() is not None:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


class Writer:
    """A node worker's journal writer: one pass takes a batch (its own unacknowledged
    entries first, then a dead writer's, then new ones), writes it and acknowledges it.

    An entry the store refuses is failed (``refused.fail_unrecorded``) and acknowledged with
    the rest; one this version cannot read stays unacknowledged for a writer that can (another
    takes it over after the reclaim time), for ``UNREADABLE_GRACE`` at most. Writers gone for
    ``GONE_AFTER_RECLAIMS`` reclaim times and holding nothing are deleted from the group."""

    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.app = app
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self._own = True  # after a failed batch, or at start: its own unacknowledged first
        self._next_reclaim = 0.0

    def run(self) -> int:
        """One pass; returns the number of entries written to the store."""
        journal = get_journal(self.settings, self.app)
        if journal is None:
            time.sleep(BLOCK_MS / 1000)
            return 0
        journal.ensure_group()
        batch: list[tuple[str, str]] = []
        if self._own:
            batch = journal.read(self.consumer, own=True)
            self._own = bool(batch)
        if not batch and time.monotonic() >= self._next_reclaim:
            reclaim = self.settings.journal_reclaim_seconds
            self._next_reclaim = time.monotonic() + reclaim / 2
            batch = journal.reclaim(self.consumer, int(reclaim * 1000))
            if batch:
                logger.warning("journal: took over %d entries of a writer that went silent",
                               len(batch))
            self._drop_gone(journal, reclaim)
        if not batch:
            batch = journal.read(self.consumer)
        if not batch:
            return 0
        self._own = True  # if this batch fails, it is read again next pass
        found = journal.entries([task for _, task in batch])
        entries = [e for e in found if isinstance(e, Entry)]
        unreadable = [(sid, e) for (sid, _), e in zip(batch, found, strict=True)
                      if isinstance(e, Unreadable)]
        written = write_isolated(self.settings, entries)
        for entry, reason in written.refused:
            fail_unrecorded(self.settings, self.app, entry.rfp, entry.candidates,
                            f"the store refused its award ({reason})")
        expired = self._expired(journal, unreadable)
        journal.forget(entries)
        journal.release([(task, winner) for _, task, winner in expired])
        left = {sid for sid, _ in unreadable} - {sid for sid, _, _ in expired}
        journal.ack([sid for sid, _ in batch if sid not in left])
        self._own = False
        return written.count

    def _drop_gone(self, journal: Journal, reclaim: float) -> None:
        """Delete the writers gone from the group (housekeeping: a failure is only logged)."""
        try:
            gone = journal.drop_gone(self.consumer, int(GONE_AFTER_RECLAIMS * reclaim * 1000))
        except redis.RedisError as exc:
            logger.warning("journal: deleting the writers that are gone failed (%s)", exc)
            return
        if gone:
            logger.info("journal: writers %s are gone (silent, holding nothing): deleted",
                        ", ".join(gone))

    def _expired(self, journal: Journal, unreadable: Sequence[tuple[str, Unreadable]]
                 ) -> list[tuple[str, str, str | None]]:
        """Of the entries this version cannot read, those past ``UNREADABLE_GRACE`` since
        their append, failed now: (stream id, task id, winner). The others are left
        unacknowledged, for a writer that can read them (a newer version's takes them over)."""
        if not unreadable:
            return []
        now_ms = journal.now_ms()
        expired = []
        for sid, entry in unreadable:
            if now_ms - int(sid.split("-")[0]) < UNREADABLE_GRACE * 1000:
                logger.warning("journal: task %s's entry cannot be read here (%s); left for a "
                               "writer that can (a newer version's)", entry.task_id,
                               entry.error)
                continue
            rfp, candidates, winner = entry.salvage()
            reason = (f"the journal's writers cannot read its entry ({entry.error}), none for "
                      f"{UNREADABLE_GRACE:g}s since it was made (a newer version's?)")
            if fail_unrecorded(self.settings, self.app, rfp, candidates,
                               reason) is Failed.RECORDED:
                logger.info("journal: task %s's unreadable entry is in the store already",
                            entry.task_id)
            expired.append((sid, entry.task_id, winner))
        return expired
