"""The bid board's protocol: all that callers use of a board, whichever it is.

An auction's board carries its bid requests to the candidates (``send_requests``; a node takes
its own with ``consume_requests``), collects their answers (``post``, ``post_many``) and joins
them (``close``: every closer sees the same answers, and an answer posted later is late).
``writes_on_award`` says whether the answers still have to reach the store in the award's
transaction; ``redis`` hands out the board's Redis to what shares it (the write-behind
journal, the nodes' history versions), or None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import redis
from celery import Celery
from kombu.messaging import Consumer

from bidding.auction.bid_request import BidRequest
from bidding.models import Bid, Refusal

Answer = Bid | Refusal


@dataclass(frozen=True)
class Posted:
    """What posting an answer found."""

    #: Answers in, this one included (0 when late or unknown).
    received: int
    #: The auction was closed (or unknown) before this answer: it cannot win.
    late: bool
    #: Every candidate has answered: the poster closes the auction.
    complete: bool = False


@dataclass(frozen=True)
class RedisConnections:
    """A board's Redis, for what lives in it beside the board."""

    #: For calls of a few milliseconds (a socket timeout of seconds).
    client: redis.Redis[bytes]
    #: For blocking reads (BRPOP, XREADGROUP ... BLOCK): a pool of its own, with a socket
    #: timeout longer than any wait.
    blocking: redis.Redis[bytes]


class RequestIntake(Protocol):
    """A node's intake of its bid requests (``BidBoard.consume_requests``)."""

    def start(self, channel: Any = None) -> list[Consumer]:
        """Start taking requests (again, after ``stop``): the kombu consumers that Celery's
        consumer step is to run on ``channel``, or none when the intake is a thread of its
        own."""

    def stop(self) -> None:
        """Stop taking requests (idempotent); one being taken is still handed over."""


class BidBoard(Protocol):
    """Where the requests and answers of open auctions go."""

    #: True when the award must write the answers to the store (they are not there yet).
    writes_on_award: bool

    @property
    def redis(self) -> RedisConnections | None:
        """The board's Redis (None: the board is not Redis)."""

    def send_requests(self, app: Celery, requests: Sequence[BidRequest], *,
                      ttl: float) -> None:
        """Send each request to its node, all at once. A request nobody takes within ``ttl``
        seconds may be dropped; ``app``'s broker carries them where the board has no
        transport of its own."""

    def consume_requests(self, node: str, *, answer_here: Callable[[BidRequest], Any],
                         hand_over: Callable[[BidRequest], Any]) -> RequestIntake:
        """``node``'s intake of its requests, each read with ``BidRequest.from_json`` (one it
        cannot read is logged and dropped). An intake with a thread of its own answers a
        request there (``answer_here``); one run in Celery's event loop, which must not wait
        for a bid, hands it over (``hand_over``)."""

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
