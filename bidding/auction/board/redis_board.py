"""The Redis bid board, the default when the broker is Redis.

An auction's answers are one hash, ``bidding:bids:<task>:<attempt>``. Posting an answer is one
Lua call that stores it and returns how many are in, so the answer that completes the auction
knows at once. Closing marks the hash closed and reads it in the same call, so every closer
sees the same answers and a bid posted later is known to be late. The answers reach the store
in the award's own transaction: no SQL write per bid, and no writers queueing on the store while
the auction is open (bench/latency.py).

Bid requests are lists, ``bidding:requests:<node>``: one Lua call pushes all of an auction's,
and a listener thread in each node worker's main process pops its node's with BRPOP, reading the
node's history version (``nodes.history_version``) in the same round trip.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

import redis
from celery import Celery
from kombu.messaging import Consumer
from pydantic import ValidationError

from bidding.auction.bid_request import BidRequest
from bidding.auction.board.answers import parse_answer
from bidding.auction.board.protocol import Answer, Posted, RedisConnections, RequestIntake
from bidding.nodes import history_version
from bidding.nodes.periodic import Periodic

logger = logging.getLogger(__name__)

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
#: Push one request on each node's list (KEYS[i] gets ARGV[i + 1]; ARGV[1]: the ttl in ms).
_REQUEST = """
for i = 1, #KEYS do
  redis.call('LPUSH', KEYS[i], ARGV[i + 1])
  -- only ever raised: a short window must not expire a longer one's waiting request
  if redis.call('PTTL', KEYS[i]) < tonumber(ARGV[1]) then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
  end
end
return #KEYS
"""
#: Wakes a node's listener from its BRPOP at once (it stops): pushed on the popping end, so it
#: comes before any waiting request; a list it creates expires (nobody may pop it).
_WAKE = """
redis.call('RPUSH', KEYS[1], ARGV[1])
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 1
"""
#: What ``_WAKE`` pushes: no request (a listener that pops it pops again, or stops).
WAKE = b"\x00wake"
_CLOSE = """
redis.call('HSET', KEYS[1], ARGV[2], '1')
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return redis.call('HGETALL', KEYS[1])
"""


class RedisBoard:
    """Answers in one Redis hash per auction (``bidding:bids:<task>:<attempt>``), requests
    in one list per node (``bidding:requests:<node>``)."""

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
        self._redis = RedisConnections(self.client, self.blocking)
        self._post = self.client.register_script(_POST)
        self._post_many = self.client.register_script(_POST_MANY)
        self._close = self.client.register_script(_CLOSE)
        self._request = self.client.register_script(_REQUEST)
        self._wake = self.client.register_script(_WAKE)

    @property
    def redis(self) -> RedisConnections:
        """The board's Redis, shared with the write-behind journal and the history versions."""
        return self._redis

    @staticmethod
    def requests_key(node: str) -> str:
        """The list of ``node``'s bid requests."""
        return f"bidding:requests:{node}"

    def send_requests(self, app: Celery, requests: Sequence[BidRequest], *,
                      ttl: float) -> None:
        """Push each request on its node's list, all in one round trip (``app`` is not
        needed). A dead node's requests expire after ``ttl`` seconds."""
        if not requests:
            return
        self._request(keys=[self.requests_key(r.node) for r in requests],
                      args=[int(ttl * 1000), *(r.to_json() for r in requests)])

    def wake(self, node: str, *, ttl: float) -> None:
        """Return ``node``'s listener from its wait for a request (``next_request`` returns
        None); a wake-up nobody pops is gone after ``ttl`` seconds with its list, unless
        requests keep the list longer."""
        self._wake(keys=[self.requests_key(node)], args=[WAKE, int(ttl * 1000)])

    def next_request(self, node: str, timeout: float) -> BidRequest | None:
        """Wait up to ``timeout`` seconds for ``node``'s next bid request (oldest first),
        with the node's history version as it is when the request is taken: read in the same
        round trip, pipelined behind the BRPOP. Raises ``ValidationError`` for a request it
        cannot read (it is gone)."""
        pipe = self.blocking.pipeline(transaction=False)
        pipe.brpop([self.requests_key(node)], timeout=max(timeout, 0.01))
        history_version.read_after(pipe, node)
        got, version = pipe.execute()
        if got is None or got[1] == WAKE:
            return None
        return BidRequest.from_json(got[1], history_version=history_version.version_of(version))

    def consume_requests(self, node: str, *, answer_here: Callable[[BidRequest], Any],
                         hand_over: Callable[[BidRequest], Any]) -> RequestIntake:
        """A listener thread that pops ``node``'s requests and answers each on itself (a bid
        is a millisecond of CPU: a hand-off to another thread cost a fifth of that)."""
        return RequestListener(self, node, answer_here)

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


class RequestListener:
    """Pops a node's bid requests from the Redis board and answers each with ``handle``, on
    a thread of its own."""

    #: Seconds one BRPOP waits. ``stop`` wakes it (``wake``), so the wait is long: each return
    #: of an idle listener costs CPU, and a federation of idle nodes pays it per node.
    POLL = 5.0
    #: Seconds before popping again after Redis failed (the broker restarts).
    RETRY = 1.0
    #: Seconds ``stop`` waits for the listener's thread (woken, it returns at once).
    STOP_WAIT = 2.0

    def __init__(self, board: RedisBoard, node: str, handle: Callable[[BidRequest], Any]
                 ) -> None:
        self.board = board
        self.node = node
        self.handle = handle
        self._pause = 0.0
        # The loop pops back to back; after a failed pop it pauses.
        self._loop = Periodic(f"bid-requests-{node}", lambda: self._pause, self._pop)

    def start(self, channel: Any = None) -> list[Consumer]:
        """Start listening (idempotent); no kombu consumer (``channel`` is not used)."""
        self._pause = 0.0
        self._loop.start()
        return []

    def stop(self) -> None:
        """Stop listening; a request being popped is still handed over. Waits ``STOP_WAIT``
        at most: the consumer's restart after a lost broker connection waits on this, and a
        listener blocked on a half-open connection returns only at its socket timeout."""
        self._loop.stop(timeout=self.STOP_WAIT, wake=self._wake_soon)

    def _wake_soon(self) -> None:
        # On a thread of its own: with Redis unreachable the call could block for its
        # connect timeout, and the stop must not.
        threading.Thread(target=self.wake, name=f"bid-requests-wake-{self.node}",
                         daemon=True).start()

    def wake(self) -> None:
        """Return the listener from its wait now (another worker of the node may pop the
        wake-up instead: this one then returns within ``POLL``)."""
        try:
            self.board.wake(self.node, ttl=self.POLL * 4)
        except Exception as exc:  # Redis down: the pop fails or returns within POLL anyway
            logger.debug("waking the bid-request listener of %s failed: %s", self.node, exc)

    def _pop(self) -> None:
        try:
            request = self.board.next_request(self.node, self.POLL)
        except ValidationError as exc:  # popped, and unreadable: gone
            self._pause = 0.0
            logger.error("malformed bid request for %s dropped: %s", self.node, exc)
            return
        except Exception:  # the broker restarts: keep trying, the window will tell
            logger.warning("bid requests of %s: Redis unavailable, retrying", self.node,
                           exc_info=True)
            self._pause = self.RETRY
            return
        self._pause = 0.0
        if request is not None:
            self.handle(request)
