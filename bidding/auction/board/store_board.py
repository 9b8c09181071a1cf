"""The store's bid board, for any broker but Redis (RabbitMQ): each answer is a bid row,
inserted with ``bids_received + 1`` in one transaction, and the announcement's state says
whether it is late. Bid requests are kombu messages on the broker's queue ``bids.<node>``,
consumed by a Celery ``ConsumerStep`` in the node worker's main process."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery
from kombu.entity import Queue
from kombu.message import Message
from kombu.messaging import Consumer
from pydantic import ValidationError
from sqlalchemy import select, update

from bidding.auction.bid_request import BidRequest
from bidding.auction.board.answers import parse_answer, write_answer
from bidding.auction.board.protocol import Answer, Posted, RequestIntake
from bidding.lifecycle import states
from bidding.nodes.profile import bid_queue
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow, BidRow

logger = logging.getLogger(__name__)


def request_queue(node: str) -> Queue:
    """The queue of ``node``'s bid requests (on the default exchange, routed by name)."""
    return Queue(bid_queue(node), routing_key=bid_queue(node),  # type: ignore[no-untyped-call]
                 durable=False, auto_delete=False)


class QueueIntake:
    """A node's bid requests from its kombu queue, for Celery's consumer step to consume in
    the worker's event loop; each request is handed over (to a bid thread)."""

    def __init__(self, node: str, hand_over: Callable[[BidRequest], Any]) -> None:
        self.node = node
        self.hand_over = hand_over

    def start(self, channel: Any = None) -> list[Consumer]:
        """One consumer of the node's queue on ``channel``, acknowledging on receipt: a bid
        lost with its node is a bid that should not win."""
        return [Consumer(channel, queues=[request_queue(self.node)],  # type: ignore[no-untyped-call]
                         on_message=self.on_message, no_ack=True)]

    def stop(self) -> None:
        """Nothing to stop: the consumer step stops the consumers it runs."""

    def on_message(self, message: Message) -> None:
        """Read the request and hand it over; the event loop stays free."""
        try:
            request = BidRequest.from_json(message.body)
        except ValidationError as exc:
            logger.error("malformed bid request for %s dropped: %s", self.node, exc)
            return
        self.hand_over(request)


class StoreBoard:
    """Answers as bid rows; the announcement's ``bids_received`` is the join counter."""

    writes_on_award = False
    redis = None

    def __init__(self, database_url: str) -> None:
        self.database_url = database_url

    def send_requests(self, app: Celery, requests: Sequence[BidRequest], *,
                      ttl: float) -> None:
        """Publish each request on its node's queue, in one batch, through ``app``'s broker.
        ``ttl`` is not needed: a node drops a request taken after its window unread."""
        with app.producer_or_acquire() as producer, producer.batch():
            for request in requests:
                queue = request_queue(request.node)
                producer.publish(request.to_json(), exchange="",
                                 routing_key=queue.routing_key, declare=[queue],
                                 content_type="application/json",
                                 content_encoding="utf-8", retry=True)

    def consume_requests(self, node: str, *, answer_here: Callable[[BidRequest], Any],
                         hand_over: Callable[[BidRequest], Any]) -> RequestIntake:
        """``node``'s queue, consumed in Celery's event loop: requests are handed over."""
        return QueueIntake(node, hand_over)

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
