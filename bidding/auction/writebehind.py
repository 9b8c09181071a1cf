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
  count a task twice for a moment, never not at all. The compare-and-set on the winner's set
  size makes concurrent awards spread as the store's row locks do.
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
from typing import Any

import redis
from celery import Celery
from sqlalchemy import bindparam, select

from bidding.auction.award import RESERVATION_TRIES, decide_award, strategy_of, write_award
from bidding.auction.board import RedisBoard, get_board, parse_answer
from bidding.auction.history import lock_states
from bidding.auction.opening import record_new
from bidding.auction.proxy import PROXY_CLOSE, answers_inside
from bidding.config import Settings
from bidding.models import Announcement, Award, Bid, Refusal
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

# KEYS: the pending hash, the stream, the winner's reservations (any key when none).
# ARGV: task id, entry JSON, 1 when there is a winner, the reservations expected on it
# (-1: not checked).
_APPEND = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 'duplicate' end
if ARGV[3] == '1' and ARGV[4] ~= '-1'
   and redis.call('SCARD', KEYS[3]) ~= tonumber(ARGV[4]) then return 'stale' end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[3] == '1' then redis.call('SADD', KEYS[3], ARGV[1]) end
return redis.call('XADD', KEYS[2], '*', 'task', ARGV[1])
"""

STALE = "stale"


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


class Journal:
    """The journal's keys in one Redis, for one store: a hash of the entries not written yet
    (by task id), the stream that orders them for the writers, and each node's reservations.
    The keys share a hash tag, so a Lua call may touch them all on a Redis Cluster too."""

    def __init__(self, board: RedisBoard, database_url: str) -> None:
        tag = hashlib.sha1(database_url.encode()).hexdigest()[:16]
        prefix = f"bidding:journal:{{{tag}}}"
        self.client = board.client
        self.blocking = board.blocking
        self.stream = f"{prefix}:stream"
        self.pending = f"{prefix}:pending"
        self.reserved_prefix = f"{prefix}:reserved:"
        self._append = self.client.register_script(_APPEND)
        self._group_ready = False

    def reserved_key(self, node: str) -> str:
        """The set of ``node``'s awards not in the store yet."""
        return self.reserved_prefix + node

    def reserved(self, nodes: Sequence[str]) -> dict[str, int]:
        """How many awards not in the store yet each of ``nodes`` has (one round trip)."""
        if not nodes:
            return {}
        pipe = self.client.pipeline(transaction=False)
        for node in nodes:
            pipe.scard(self.reserved_key(node))
        return {node: int(n) for node, n in zip(nodes, pipe.execute(), strict=True)}

    def append(self, entry: Entry, expect: int | None) -> str:
        """Award ``entry``: keep it, reserve its winner and queue it for the writers, in one
        call. ``STALE`` when the winner's reservations are not ``expect`` any more (another
        award took it meanwhile: decide again); else the stream id."""
        winner = entry.award.winner
        result = self._append(
            keys=[self.pending, self.stream, self.reserved_key(winner or "")],
            args=[entry.rfp.task_id, entry.to_json(), "1" if winner else "0",
                  -1 if expect is None else expect])
        text = result.decode() if isinstance(result, bytes) else str(result)
        if text == "duplicate":
            raise RuntimeError(f"task {entry.rfp.task_id} is in the journal already")
        return text

    def entries(self, task_ids: Sequence[str]) -> list[Entry | None]:
        """The entries of ``task_ids`` not written yet (None: written, or never journaled)."""
        if not task_ids:
            return []
        found = self.client.hmget(self.pending, list(task_ids))
        return [None if raw is None else Entry.from_json(raw) for raw in found]

    def forget(self, entries: Sequence[Entry]) -> None:
        """``entries`` are in the store: drop them and their reservations."""
        if not entries:
            return
        pipe = self.client.pipeline(transaction=True)
        for entry in entries:
            if entry.award.winner:
                pipe.srem(self.reserved_key(entry.award.winner), entry.rfp.task_id)
        pipe.hdel(self.pending, *[e.rfp.task_id for e in entries])
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
    board = get_board(settings, app)
    if not isinstance(board, RedisBoard):
        logger.warning("bidding_award_journal needs the Redis bid board; awards are written "
                       "to the store in their own transaction")
        return None
    journal = _journals[key] = Journal(board, settings.database_url)
    return journal


def award_behind(settings: Settings, app: Celery, rfp: Announcement,
                 nodes: Sequence[LiveNode]) -> Award | None:
    """Bid for ``nodes`` and award ``rfp`` (a new task with a fresh id) into the journal; the
    caller routes the award. None when the journal is off.

    The bidders' state is read outside any transaction, with their reservations, and the
    award's append compare-and-sets the winner's reservations, so two concurrent awards do not
    both take a node's last slot; the last try appends as decided (as the store's path does).
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
        held = journal.reserved(bidders)
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
            expect = held[award.winner] if award.winner in held else \
                journal.reserved([award.winner])[award.winner]
        entry = Entry(rfp=rfp, candidates=candidates, answers=answers, award=award,
                      counts=counts)
        if journal.append(entry, expect) != STALE:
            return award
    raise AssertionError("unreachable: the last try appends unchecked")


_PRESENT = select(AnnouncementRow.task_id).where(
    AnnouncementRow.task_id.in_(bindparam("ids", expanding=True)))


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
    if entry is None:
        return False
    write_entries(settings, [entry])
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
    entries first, then a dead writer's, then new ones), writes it and acknowledges it."""

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
        if not batch:
            batch = journal.read(self.consumer)
        if not batch:
            return 0
        self._own = True  # if this batch fails, it is read again next pass
        found = journal.entries([task for _, task in batch])
        entries = [e for e in found if e is not None]
        written = write_entries(self.settings, entries)
        journal.forget(entries)
        journal.ack([sid for sid, _ in batch])
        self._own = False
        return written
