"""Bid requests, answered in the node worker's main process.

Bid requests are small JSON messages on ``bids.<node>``, consumed by a kombu consumer in the
worker's main process (a Celery ``ConsumerStep``) and answered by a few threads. They never
wait behind executions in the worker pool: a node busy with long tasks still answers at once,
with a low load score, instead of missing the auction.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from celery import Celery, bootsteps
from kombu.entity import Queue
from kombu.message import Message
from kombu.messaging import Consumer
from pydantic import ValidationError

from bidding.award import receive_bid
from bidding.bid import place_bid
from bidding.config import Settings
from bidding.models import Announcement, Bid, Refusal
from bidding.node import current_profile
from bidding.profile import NodeProfile, bid_queue
from bidding.settings import get_settings

logger = logging.getLogger(__name__)


def request_queue(node: str) -> Queue:
    """The queue of ``node``'s bid requests (on the default exchange, routed by name)."""
    return Queue(bid_queue(node), routing_key=bid_queue(node),  # type: ignore[no-untyped-call]
                 durable=False, auto_delete=False)


def request_body(rfp: Announcement, node: str, expires_at: float) -> dict[str, Any]:
    """The JSON body of one bid request."""
    return {"announcement": rfp.model_dump(mode="json"), "node": node, "expires_at": expires_at}


def answer(settings: Settings, app: Celery, profile: NodeProfile | None,
           body: dict[str, Any]) -> Bid | Refusal | None:
    """Answer one bid request and record the answer; never raises. None when dropped."""
    try:
        rfp = Announcement.model_validate(body["announcement"])
        node = str(body["node"])
        expires_at = float(body.get("expires_at") or 0)
    except (KeyError, TypeError, ValueError, ValidationError):
        logger.exception("malformed bid request dropped: %.200r", body)
        return None
    if expires_at and time.time() > expires_at:
        logger.info("bid request for %s arrived after its auction closed; dropped", rfp.task_id)
        return None
    response: Bid | Refusal
    try:
        if profile is None:
            response = Refusal(task_id=rfp.task_id, node=node, attempt=rfp.attempt,
                               reason="this worker has no node profile (bidding_profile)")
        elif profile.name != node:
            response = Refusal(task_id=rfp.task_id, node=node, attempt=rfp.attempt,
                               reason=f"profile mismatch: worker runs node {profile.name!r}")
        else:
            response = place_bid(settings, rfp, profile)
    except Exception as exc:  # a bid never raises: the auction must still close
        logger.exception("bid of %s on %s failed", node, rfp.task_id)
        response = Refusal(task_id=rfp.task_id, node=node, attempt=rfp.attempt,
                           reason=f"bid failed: {type(exc).__name__}: {exc}")
    try:
        receive_bid(settings, app, response)
    except Exception:
        # The sweeper still closes the auction at its deadline with the bids recorded.
        logger.exception("could not record the bid of %s on %s", node, rfp.task_id)
    return response


class BidConsumerStep(bootsteps.ConsumerStep):  # type: ignore[misc]  # Celery is untyped
    """Consume ``bids.<node>`` in the worker's main process and answer from a thread pool."""

    label = "bidding bids"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.app: Celery = consumer.app
        self.settings = get_settings(self.app)
        self.profile = current_profile(self.settings)
        self.pool: ThreadPoolExecutor | None = None

    def get_consumers(self, channel: Any) -> list[Consumer]:
        """One consumer on this node's bid queue (none for a worker without a profile)."""
        if self.profile is None:
            return []
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.settings.bid_threads,
                                           thread_name_prefix=f"bid-{self.profile.name}")
        # Acknowledged on receipt: a bid lost with its node is a bid that should not win.
        return [Consumer(channel, queues=[request_queue(self.profile.name)],  # type: ignore[no-untyped-call]
                         callbacks=[self.on_message], accept=["json"], no_ack=True)]

    def on_message(self, body: dict[str, Any], message: Message) -> None:
        """Hand the request to a bid thread; the event loop stays free."""
        if self.pool is not None:
            self.pool.submit(answer, self.settings, self.app, self.profile, body)

    def shutdown(self, consumer: Any) -> None:
        """Finish the bids in progress, then stop."""
        super().shutdown(consumer)
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pool = None
