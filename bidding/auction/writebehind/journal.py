"""The journal itself: a Redis stream of award entries, their pending hash and the nodes'
reservations, appended to in one Lua call; what an entry holds and how it is read back."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from textwrap import shorten
from typing import Any

import redis
from pydantic import ValidationError

from bidding.auction.board import RedisConnections, get_board, parse_answer
from bidding.auction.refused import REASON_CHARS, reason_of
from bidding.context import Context
from bidding.models import Announcement, Award, Bid, Refusal, describe_validation

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

    announcement: Announcement
    candidates: list[str]
    answers: list[Bid | Refusal]
    award: Award
    #: The bidders' in-flight counts the award saw (the stored bids' loads).
    counts: dict[str, int]

    def to_json(self) -> str:
        """The entry as JSON (JSON only, as every message of ours)."""
        return json.dumps({
            "rfp": self.announcement.model_dump(mode="json"), "candidates": self.candidates,
            "answers": [a.model_dump(mode="json") for a in self.answers],
            "award": self.award.model_dump(mode="json"), "counts": self.counts})

    @classmethod
    def from_json(cls, raw: bytes | str) -> Entry:
        """An entry from ``to_json``'s form."""
        data = json.loads(raw)
        return cls(announcement=Announcement.model_validate(data["rfp"]),
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
            announcement = Announcement.model_validate({**known, "task_id": self.task_id})
        except ValueError:
            announcement = Announcement(task_id=self.task_id,
                               task_name=str(spec.get("task_name") or "unknown"),
                               task_type=str(spec.get("task_type") or "unknown")[:64])
        winner = _object(data.get("award")).get("winner")
        candidates = data.get("candidates")
        return (announcement, [str(c) for c in candidates] if isinstance(candidates, list) else [],
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
            args=[entry.announcement.task_id, entry.to_json(), winner or "",
                  -1 if expect is None else expect])
        text = result.decode() if isinstance(result, bytes) else str(result)
        if text == "duplicate":
            raise AlreadyJournaled(f"task {entry.announcement.task_id} is in the journal already")
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
        self.release([(e.announcement.task_id, e.award.winner) for e in entries])

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


def get_journal(ctx: Context) -> Journal | None:
    """The journal of ``app``'s store, or None when ``bidding_award_journal`` is off or the bid
    board is not Redis (then every award is written in its own transaction)."""
    if not ctx.settings.award_journal:
        return None
    key = (ctx.settings.bid_board, str(ctx.app.conf.broker_url or ""), ctx.settings.database_url)
    found = _journals.get(key)
    if found is not None:
        return found
    shared = get_board(ctx).redis
    if shared is None:
        logger.warning("bidding_award_journal needs the Redis bid board; awards are written "
                       "to the store in their own transaction")
        return None
    journal = _journals[key] = Journal(shared, ctx.settings.database_url)
    return journal
