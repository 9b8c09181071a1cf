"""The bid board: where answers wait while an auction is open, and the join that closes it.

Two boards behind one small protocol (``bidding_bid_board``):

- ``RedisBoard``, the default when the broker is Redis: an auction's answers are one hash in
  Redis. Posting an answer is one Lua call that stores it and returns how many are in, so the
  answer that completes the auction knows at once. Closing marks the hash closed and reads it in
  the same call, so every closer sees the same answers and a bid posted later is known to be
  late. The answers reach the store in the award's own transaction: no SQL write per bid, and
  no writers queueing on the store while the auction is open (bench/latency.py).
- ``StoreBoard``, for any other broker (RabbitMQ): each answer is a bid row, inserted with
  ``bids_received + 1`` in one transaction; the announcement's state says whether it is late.

Either way the sweepers close an auction at its deadline with the answers on the board; if the
board is lost (Redis restarted), the auction still closes, with the answers that remain.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis
from celery import Celery
from pydantic import ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from bidding.config import Settings
from bidding.lifecycle import journal, states
from bidding.models import Bid, Refusal
from bidding.store import read_session, write_session
from bidding.store.schema import Announcement as AnnouncementRow
from bidding.store.schema import BidRow

logger = logging.getLogger(__name__)

Answer = Bid | Refusal

#: Hash field that marks an auction closed (node names never start with a NUL byte).
CLOSED_FIELD = "\x00closed"
#: Seconds a closed auction's answers stay on a Redis board, so a duplicate closer reads the
#: same answers and a bid still in flight at the close is recognised as late.
CLOSED_TTL = 60.0
#: Socket timeout of the BRPOP connection: longer than any BRPOP wait (the listener's poll).
BLOCKING_TIMEOUT = 10.0
#: Socket timeout of every other board call (one Lua call or HGET/HMGET, a millisecond): a
#: half-open connection must fail the call, not block a node's bid or sweeper thread for ever.
CALL_TIMEOUT = 5.0
#: Hash of every node's history version (finished attempts, as counted by the board).
HISTORY_KEY = "bidding:history"
#: Seconds an open auction's answers outlive its window (the sweepers close it well before).
OPEN_GRACE = 300.0

_POST = """
if redis.call('HEXISTS', KEYS[1], ARGV[4]) == 1 then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return redis.call('HLEN', KEYS[1])
"""
#: Several answers at once (the announcer's proxied bids in a mixed auction).
_POST_MANY = """
if redis.call('HEXISTS', KEYS[1], ARGV[2]) == 1 then return -1 end
for i = 3, #ARGV, 2 do redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1]) end
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return redis.call('HLEN', KEYS[1])
"""
#: Push one request per node, each stamped with the node's history version (read atomically
#: here, so the bidder needs no round trip of its own to validate its cached history).
_REQUEST = """
local history = KEYS[#KEYS]
for i = 1, #KEYS - 1 do
  local version = redis.call('HGET', history, ARGV[2 * i]) or '0'
  local body = ARGV[2 * i + 1]
  redis.call('LPUSH', KEYS[i], '{"history_version": ' .. version .. ', ' .. string.sub(body, 2))
  -- only ever raised: a short window must not expire a longer one's waiting request
  if redis.call('PTTL', KEYS[i]) < tonumber(ARGV[1]) then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
  end
end
return #KEYS - 1
"""
_CLOSE = """
redis.call('HSET', KEYS[1], ARGV[2], '1')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return redis.call('HGETALL', KEYS[1])
"""


@dataclass(frozen=True)
class Posted:
    """What posting an answer found."""

    #: Answers in, this one included (0 when late or unknown).
    received: int
    #: The auction was closed (or unknown) before this answer: it cannot win.
    late: bool
    #: Every candidate has answered: the poster closes the auction.
    complete: bool = False


class BidBoard(Protocol):
    """Where the answers of open auctions are collected."""

    #: True when the award must write the answers to the store (they are not there yet).
    writes_on_award: bool

    def post(self, answer: Answer, *, expected: int, window: float) -> Posted:
        """Record ``answer``; say how many answers its auction has, or that it is late."""

    def post_many(self, answers: Sequence[Answer], *, expected: int,
                  window: float) -> Posted:
        """Record several answers of one auction at once (``post``'s count after the last)."""

    def close(self, task_id: str, attempt: int, keep: float = 60.0) -> list[Answer]:
        """The answers of an auction that is closing; answers posted after this are late.

        The board keeps them ``keep`` seconds more, for duplicate closers and late answers.
        """

    def peek(self, task_id: str, attempt: int) -> list[Answer]:
        """The answers so far, without closing (for ``explain`` of an open auction)."""

    def history_version(self, node: str) -> int | None:
        """A number that changes whenever ``node`` finishes an attempt (None: not tracked)."""

    def history_versions(self, nodes: Sequence[str]) -> dict[str, int | None]:
        """``history_version`` of several nodes at once."""

    def bump_history(self, node: str) -> None:
        """``node`` finished an attempt: cached histories of it are stale."""


def parse_answer(data: dict[str, Any]) -> Answer:
    """A bid or refusal from its JSON form (a refusal has a ``reason`` and no scores)."""
    if "capability" in data:
        return Bid.model_validate(data)
    return Refusal.model_validate(data)


def answer_message(answer: Answer, *, late: bool) -> dict[str, Any]:
    """The BID or REFUSED message of an answer (``journal.write`` form)."""
    detail: dict[str, Any] = {"late": late}
    if isinstance(answer, Refusal):
        detail["reason"] = answer.reason
    return journal.message(answer.task_id,
                           journal.BID if isinstance(answer, Bid) else journal.REFUSED,
                           node=answer.node, attempt=answer.attempt, at=answer.bid_at, **detail)


def write_answer(session: Session, answer: Answer, *, late: bool) -> None:
    """Store one answer as it came: its bid row and its message (unscored). A late one is kept
    for ``explain``; it cannot win."""
    session.add(bid_row(answer, late=late))
    journal.write(session, [answer_message(answer, late=late)])


def bid_values(answer: Answer, *, late: bool = False) -> dict[str, Any]:
    """The bids-table columns of a bid or refusal (every column, so rows batch together)."""
    values: dict[str, Any] = {
        "task_id": answer.task_id, "attempt": answer.attempt, "node": answer.node,
        "will_bid": isinstance(answer, Bid), "reason": "", "capability": None,
        "experience": None, "load": None, "confidence": None, "cost": None,
        "latency_ms": None, "trust": None, "payload": answer.model_dump(mode="json"),
        "score": None, "breakdown": {}, "is_winner": False, "late": late,
        "bid_at": answer.bid_at,
    }
    if isinstance(answer, Refusal):
        values["reason"] = answer.reason
    else:
        values.update(capability=answer.capability, experience=answer.experience,
                      load=answer.load, confidence=answer.confidence, cost=answer.cost,
                      latency_ms=answer.latency_ms, trust=answer.trust)
    return values


def bid_row(answer: Answer, *, late: bool = False) -> BidRow:
    """The store row (ORM object) of a bid or refusal."""
    return BidRow(**bid_values(answer, late=late))


class StoreBoard:
    """Answers as bid rows; the announcement's ``bids_received`` is the join counter."""

    writes_on_award = False

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url

    def post(self, answer: Answer, *, expected: int, window: float) -> Posted:
        """Insert the bid row and count it, in one transaction."""
        with write_session(self.database_url) as session:
            counted = session.execute(
                update(AnnouncementRow)
                .where(AnnouncementRow.task_id == answer.task_id,
                       AnnouncementRow.attempt == answer.attempt)
                .values(bids_received=AnnouncementRow.bids_received + 1)
                .returning(AnnouncementRow.bids_received, AnnouncementRow.expected_bids,
                           AnnouncementRow.state)
            ).one_or_none()
            if counted is None:
                return Posted(0, late=True)
            received, expected, state = counted
            late = state != states.BIDDING
            write_answer(session, answer, late=late)
        return Posted(int(received), late, complete=not late and received >= expected)

    def post_many(self, answers: Sequence[Answer], *, expected: int,
                  window: float) -> Posted:
        """``post`` each answer (one transaction each; the store board is RabbitMQ's)."""
        posted = Posted(0, late=False)
        for answer in answers:
            posted = self.post(answer, expected=expected, window=window)
        return posted

    def close(self, task_id: str, attempt: int, keep: float = 60.0) -> list[Answer]:
        """The auction's bid rows that were not late."""
        return self.peek(task_id, attempt)

    def peek(self, task_id: str, attempt: int) -> list[Answer]:
        """The bid rows of the auction, in the order they came."""
        with read_session(self.database_url) as session:
            payloads = session.scalars(
                select(BidRow.payload)
                .where(BidRow.task_id == task_id, BidRow.attempt == attempt,
                       BidRow.late.is_(False))
                .order_by(BidRow.id)
            ).all()
        return [parse_answer(p) for p in payloads]

    def history_version(self, node: str) -> int | None:
        """Not tracked: cached histories expire by age only."""
        return None

    def history_versions(self, nodes: Sequence[str]) -> dict[str, int | None]:
        """Not tracked."""
        return dict.fromkeys(nodes)

    def bump_history(self, node: str) -> None:
        """Not tracked."""


class RedisBoard:
    """Answers in one Redis hash per auction (``bidding:bids:<task>:<attempt>``)."""

    writes_on_award = True

    def __init__(self, url: str) -> None:
        self.url = url
        self.client: redis.Redis[bytes] = redis.Redis.from_url(
            url, socket_timeout=CALL_TIMEOUT, socket_connect_timeout=CALL_TIMEOUT,
            socket_keepalive=True, health_check_interval=30)
        # BRPOP holds its connection while it waits: a pool of its own, with a socket timeout
        # longer than any wait (a half-open connection must fail, not block for ever).
        self.blocking: redis.Redis[bytes] = redis.Redis.from_url(
            url, socket_timeout=BLOCKING_TIMEOUT, socket_keepalive=True, health_check_interval=30)
        self._post = self.client.register_script(_POST)
        self._post_many = self.client.register_script(_POST_MANY)
        self._close = self.client.register_script(_CLOSE)
        self._request = self.client.register_script(_REQUEST)

    @staticmethod
    def requests_key(node: str) -> str:
        """The list of ``node``'s bid requests."""
        return f"bidding:requests:{node}"

    def request(self, bodies: dict[str, str], ttl: float) -> None:
        """Push one JSON bid request (an object) per node, all in one round trip; each gets
        the node's ``history_version``. A dead node's requests expire after ``ttl`` seconds."""
        if not bodies:
            return
        args: list[Any] = [int(ttl * 1000)]
        for node, body in bodies.items():
            args += [node, body]
        self._request(keys=[*(self.requests_key(n) for n in bodies), HISTORY_KEY], args=args)

    def next_request(self, node: str, timeout: float) -> str | None:
        """Wait up to ``timeout`` seconds for ``node``'s next bid request (oldest first)."""
        got = self.blocking.brpop([self.requests_key(node)], timeout=max(timeout, 0.01))
        if got is None:
            return None
        raw = got[1]
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    @staticmethod
    def key(task_id: str, attempt: int) -> str:
        """The hash of one auction's answers."""
        return f"bidding:bids:{task_id}:{attempt}"

    def post(self, answer: Answer, *, expected: int, window: float) -> Posted:
        """Store the answer unless the auction is closed; one round trip."""
        ttl_ms = int((window + OPEN_GRACE) * 1000)
        count = int(self._post(keys=[self.key(answer.task_id, answer.attempt)],
                               args=[answer.node, answer.model_dump_json(), ttl_ms,
                                     CLOSED_FIELD]))
        if count < 0:
            return Posted(0, late=True)
        return Posted(count, late=False, complete=expected > 0 and count >= expected)

    def post_many(self, answers: Sequence[Answer], *, expected: int,
                  window: float) -> Posted:
        """Store the answers (of one auction) unless it is closed; one round trip."""
        if not answers:
            return Posted(0, late=False)
        first = answers[0]
        args: list[Any] = [int((window + OPEN_GRACE) * 1000), CLOSED_FIELD]
        for answer in answers:
            args += [answer.node, answer.model_dump_json()]
        count = int(self._post_many(keys=[self.key(first.task_id, first.attempt)], args=args))
        if count < 0:
            return Posted(0, late=True)
        return Posted(count, late=False, complete=expected > 0 and count >= expected)

    def close(self, task_id: str, attempt: int, keep: float = CLOSED_TTL) -> list[Answer]:
        """Mark the auction closed and read its answers, atomically."""
        flat = self._close(keys=[self.key(task_id, attempt)],
                           args=[int(max(keep, 1.0) * 1000), CLOSED_FIELD])
        return self._parse(dict(zip(flat[::2], flat[1::2], strict=True)))

    def peek(self, task_id: str, attempt: int) -> list[Answer]:
        """The answers so far."""
        return self._parse(self.client.hgetall(self.key(task_id, attempt)))

    def history_version(self, node: str) -> int | None:
        """How many attempts ``node`` has finished (as counted here)."""
        raw = self.client.hget(HISTORY_KEY, node)
        return int(raw) if raw is not None else 0

    def history_versions(self, nodes: Sequence[str]) -> dict[str, int | None]:
        """How many attempts each of ``nodes`` has finished, in one round trip."""
        if not nodes:
            return {}
        raw = self.client.hmget(HISTORY_KEY, list(nodes))
        return {node: int(v) if v is not None else 0 for node, v in zip(nodes, raw, strict=True)}

    def bump_history(self, node: str) -> None:
        """Count one more finished attempt of ``node``."""
        self.client.hincrby(HISTORY_KEY, node, 1)

    @staticmethod
    def _parse(fields: dict[Any, Any]) -> list[Answer]:
        out: list[Answer] = []
        for name, raw in fields.items():
            name = name.decode() if isinstance(name, bytes) else str(name)
            if name == CLOSED_FIELD:
                continue
            try:
                out.append(parse_answer(json.loads(raw)))
            except (ValueError, ValidationError):
                logger.exception("unreadable answer of %s on the bid board dropped", name)
        out.sort(key=lambda a: a.bid_at)
        return out


def redis_url(broker_url: str) -> str | None:
    """The redis-py URL of a Celery broker URL, or None when the broker is not Redis."""
    url = broker_url.split(";")[0].strip()
    if url.startswith(("redis://", "rediss://", "unix://")):
        return url
    if url.startswith("redis+socket://"):
        return "unix://" + url[len("redis+socket://"):]
    return None


_boards: dict[tuple[str, str, str], BidBoard] = {}


def get_board(settings: Settings, app: Celery) -> BidBoard:
    """The board ``bidding_bid_board`` names: "auto" (Redis when the broker is Redis, else the
    store), "store", or a Redis URL. One per process and configuration."""
    broker = str(app.conf.broker_url or "")
    key = (settings.bid_board, broker, settings.database_url)
    found = _boards.get(key)
    if found is not None:
        return found
    choice = settings.bid_board
    board: BidBoard
    if choice == "store":
        board = StoreBoard(settings.database_url)
    elif choice == "auto":
        url = redis_url(broker)
        board = RedisBoard(url) if url else StoreBoard(settings.database_url)
    else:
        url = redis_url(choice)
        # Settings admits only "auto", "store" and the URL schemes redis_url accepts.
        assert url is not None
        board = RedisBoard(url)
    _boards[key] = board
    return board


def sorted_answers(answers: Sequence[Answer]) -> tuple[list[Bid], list[Refusal]]:
    """Split answers into bids and refusals."""
    bids = [a for a in answers if isinstance(a, Bid)]
    refusals = [a for a in answers if isinstance(a, Refusal)]
    return bids, refusals


def history_changed(settings: Settings, app: Celery, node: str) -> None:
    """``node`` finished an attempt: its next bid must read its record afresh. Called before
    Celery stores the result, so a caller that waits on it and announces again is not bid on
    with the record from before. Never raises (the cache also expires by age)."""
    try:
        get_board(settings, app).bump_history(node)
    except Exception:
        logger.warning("could not mark the history of %s changed", node, exc_info=True)
