"""Bid requests, answered in the node worker's main process.

Bid requests are small JSON messages answered by a few threads of the worker's main process, so
they never wait behind executions in the worker pool: a node busy with long tasks still answers
at once, with a low load score, instead of missing the auction. A node whose profile names a
bidder of its own answers when that bidder has judged the built-in draft (``auction.bidder``,
on threads of its own, with a timeout). They travel on the bid board's
Redis list ``bidding:requests:<node>`` when the board is Redis (one pipelined push for all
candidates, one BRPOP per request), and otherwise as kombu messages on ``bids.<node>`` consumed by
a Celery ``ConsumerStep`` (RabbitMQ).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery, bootsteps
from kombu.entity import Queue
from kombu.message import Message
from kombu.messaging import Consumer
from pydantic import ValidationError

from bidding import clock
from bidding.auction.bidder import NodeBidder, node_bidder
from bidding.auction.board import RedisBoard, get_board, write_answer
from bidding.auction.close import close_auction
from bidding.auction.history import place_bid
from bidding.auction.request_view import bidder_view
from bidding.config import Settings, get_settings
from bidding.models import Announcement, Bid, Refusal
from bidding.nodes.bounded import BoundedPool
from bidding.nodes.periodic import Periodic
from bidding.nodes.profile import NodeProfile, bid_queue, current_profile, profile_source
from bidding.store import write_session

logger = logging.getLogger(__name__)


def request_queue(node: str) -> Queue:
    """The queue of ``node``'s bid requests (on the default exchange, routed by name)."""
    return Queue(bid_queue(node), routing_key=bid_queue(node),  # type: ignore[no-untyped-call]
                 durable=False, auto_delete=False)


def request_body(rfp: Announcement, node: str, expires_at: float,
                 expected: int = 0, partial: bool = False) -> dict[str, Any]:
    """The JSON body of one bid request (``expected``: how many answers the auction waits for;
    ``partial``: ``rfp`` is the bidder's view, not the whole announcement)."""
    body: dict[str, Any] = {"announcement": rfp.model_dump(mode="json"), "node": node,
                            "expires_at": expires_at, "expected": expected}
    if partial:
        body["partial"] = True
    return body


def request_bids(settings: Settings, app: Celery, rfp: Announcement,
                 candidates: Sequence[str], *, expected: int | None = None,
                 view: tuple[Announcement, bool] | None = None) -> None:
    """Ask every candidate to bid: one request each, sent in one batch.

    A request carries the announcement as a node's bidder may see it (``view``, computed here
    when not given: ``request_view.bidder_view``). ``expected``: the answers the auction waits
    for, when some are not asked for (proxied bids in a mixed auction); default: one per
    candidate. No closer message is sent: node workers sweep the store for auctions past
    their window.
    """
    # A request still queued after the window is worthless: the node drops it unread.
    expires_at = rfp.announced_at + rfp.window
    expected = len(candidates) if expected is None else expected
    shown, full = view if view is not None else bidder_view(rfp, settings.bid_request_limit)
    board = get_board(settings, app)
    if isinstance(board, RedisBoard):
        # The announcement is serialized once, not once per candidate.
        spec = shown.model_dump_json()
        partial = "" if full else '"partial": true, '
        bodies = {node: (f'{{"node": {json.dumps(node)}, "expires_at": {expires_at!r}, '
                         f'"expected": {expected}, {partial}"announcement": {spec}}}')
                  for node in candidates}
        board.request(bodies, ttl=rfp.window + 1.0)
        return
    with app.producer_or_acquire() as producer, producer.batch():
        for node in candidates:
            queue = request_queue(node)
            producer.publish(request_body(shown, node, expires_at, expected, not full),
                             exchange="", routing_key=queue.routing_key, declare=[queue],
                             serializer="json", retry=True)


def answer(settings: Settings, app: Celery, profile: NodeProfile | None,
           body: dict[str, Any], defer: Callable[..., Any] | None = None,
           bidder: NodeBidder | None = None) -> Bid | Refusal | None:
    """Answer one bid request and record the answer; never raises. None when dropped, or
    when the node's own ``bidder`` answers later (on its thread, ``auction.bidder``).

    When the answer completes the auction, the award runs here, or through ``defer`` (an
    executor's ``submit``) so that the caller can take the next request meanwhile.
    """
    request = _request(body)
    if request is None:
        return None
    rfp, node, expires_at, expected, full = request
    response: Bid | Refusal
    try:
        if profile is None:
            response = Refusal(task_id=rfp.task_id, node=node, attempt=rfp.attempt,
                               reason="this worker has no node profile (bidding_profile)")
        elif profile.name != node:
            response = Refusal(task_id=rfp.task_id, node=node, attempt=rfp.attempt,
                               reason=f"profile mismatch: worker runs node {profile.name!r}")
        elif rfp.task_name and rfp.task_name not in app.tasks:
            # Its pool would drop the message (NotRegistered): never win work it cannot run.
            response = Refusal(task_id=rfp.task_id, node=node, attempt=rfp.attempt,
                               reason=f"task {rfp.task_name} is not registered on this node "
                                      f"(its workers run -A {app.main})")
        else:
            version = body.get("history_version")  # stamped by the Redis board
            if version is None:
                version = get_board(settings, app).history_version(node)
            response = place_bid(settings, rfp, profile, version)
    except Exception as exc:  # a bid never raises: the auction must still close
        logger.exception("bid of %s on %s failed", node, rfp.task_id)
        response = Refusal(task_id=rfp.task_id, node=node, attempt=rfp.attempt,
                           reason=f"bid failed: {type(exc).__name__}: {exc}", failed=True)

    def post(given: Bid | Refusal) -> None:
        try:
            record_answer(settings, app, rfp, given, expected, defer, full=full)
        except Exception:
            # The sweeper still closes the auction at its deadline with the bids recorded.
            logger.exception("could not record the bid of %s on %s", node, rfp.task_id)

    if bidder is not None and isinstance(response, Bid):
        # The node's own bidder judges the draft on a thread of its own; its answer (or a
        # refusal at its timeout) is posted from there.
        try:
            bidder.ask(rfp, response, expires_at or None, post)
            return None
        except Exception as exc:  # never raised so far; the auction must still hear from us
            logger.exception("could not ask the bidder of %s on %s", node, rfp.task_id)
            response = Refusal(task_id=rfp.task_id, node=node, attempt=rfp.attempt,
                               reason=f"could not ask its bidder: {type(exc).__name__}: {exc}",
                               bidder=bidder.spec)
    post(response)
    return response


def _request(body: dict[str, Any]) -> tuple[Announcement, str, float, int, bool] | None:
    """A bid request's announcement, node, expiry, expected answers and whether the
    announcement is whole; None (logged) when it is malformed or its auction has closed."""
    try:
        rfp = Announcement.model_validate(body["announcement"])
        node = str(body["node"])
        expires_at = float(body.get("expires_at") or 0)
        expected = int(body.get("expected") or 0)
        full = not body.get("partial")
    except (KeyError, TypeError, ValueError, ValidationError):
        logger.exception("malformed bid request dropped: %.200r", body)
        return None
    if expires_at and clock.now() > expires_at:
        logger.info("bid request for %s arrived after its auction closed; dropped", rfp.task_id)
        return None
    return rfp, node, expires_at, expected, full


def refuse(settings: Settings, app: Celery, body: dict[str, Any], reason: str,
           defer: Callable[..., Any] | None = None) -> Refusal | None:
    """Answer ``body`` at once with a refusal that says ``reason`` (the node could not bid:
    no verdict on the task) and record it; never raises. None when the request is dropped."""
    request = _request(body)
    if request is None:
        return None
    rfp, node, _, expected, full = request
    refusal = Refusal(task_id=rfp.task_id, node=node, attempt=rfp.attempt, reason=reason,
                      failed=True)
    try:
        record_answer(settings, app, rfp, refusal, expected, defer, full=full)
    except Exception:  # the sweeper still closes the auction at its deadline
        logger.exception("could not record the refusal of %s on %s", node, rfp.task_id)
    return refusal


def record_answer(settings: Settings, app: Celery, rfp: Announcement,
                  response: Bid | Refusal, expected: int,
                  defer: Callable[..., Any] | None = None, *, full: bool = True) -> None:
    """Post the answer on the bid board; the answer that completes the auction closes it
    (``full``: ``rfp`` is the whole announcement, else the closer reads it from the store)."""
    board = get_board(settings, app)
    posted = board.post(response, expected=expected, window=rfp.window)
    if posted.late:
        logger.info("%s answered %s after its auction closed", response.node, rfp.task_id)
        if board.writes_on_award:
            try:
                with write_session(settings.database_url) as session:
                    write_answer(session, response, late=True)
            except Exception:  # an unknown announcement: nothing to attach the answer to
                logger.warning("late answer of %s for unknown task %s dropped",
                               response.node, rfp.task_id)
        return
    if posted.complete:
        (defer or _now)(_close, settings, app, rfp, expected, full)


def _now(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _close(settings: Settings, app: Celery, rfp: Announcement, expected: int,
           full: bool = True) -> None:
    try:
        # A partial announcement (the bidder's view) is not what the award sends: the closer
        # reads the task's own from the store.
        close_auction(settings, app, rfp.task_id, rfp.attempt, closed_by="all bids in",
                      rfp=rfp if full else None, candidates=expected if full else None)
    except Exception:  # the sweeper closes it at the deadline
        logger.exception("award of %s failed", rfp.task_id)


class RequestListener:
    """Pops this node's bid requests from the Redis board and answers each with ``handle``."""

    #: Seconds one BRPOP waits, so that ``stop`` is seen promptly.
    POLL = 1.0
    #: Seconds before popping again after Redis failed (the broker restarts).
    RETRY = 1.0

    def __init__(self, board: RedisBoard, node: str, handle: Callable[[dict[str, Any]], Any]
                 ) -> None:
        self.board = board
        self.node = node
        self.handle = handle
        self._pause = 0.0
        # The loop pops back to back; after a failed pop it pauses.
        self._loop = Periodic(f"bid-requests-{node}", lambda: self._pause, self._pop)

    def start(self) -> None:
        """Start listening (idempotent)."""
        self._pause = 0.0
        self._loop.start()

    def stop(self) -> None:
        """Stop listening; a request being popped is still handed over."""
        self._loop.stop(timeout=self.POLL * 4)

    def _pop(self) -> None:
        try:
            raw = self.board.next_request(self.node, self.POLL)
        except Exception:  # the broker restarts: keep trying, the window will tell
            logger.warning("bid requests of %s: Redis unavailable, retrying", self.node,
                           exc_info=True)
            self._pause = self.RETRY
            return
        self._pause = 0.0
        if raw is None:
            return
        try:
            body = json.loads(raw)
        except ValueError:
            logger.error("malformed bid request dropped: %.200r", raw)
            return
        self.handle(body)


class BidThreads:
    """A node's bid threads (``bidding_bid_threads``) with room for ``bidding_bid_queue_size``
    requests waiting. A request that finds them full is refused at once, saying the node is
    overloaded; an award finding them full runs on the thread whose answer completed its
    auction (it must not be dropped: that thread waits for it instead)."""

    def __init__(self, settings: Settings, app: Celery, profile: NodeProfile,
                 bidder: NodeBidder | None) -> None:
        self.settings = settings
        self.app = app
        self.profile = profile
        self.bidder = bidder
        self.pool = BoundedPool(settings.bid_threads, settings.bid_queue_size,
                                f"bid-{profile.name}")
        #: Refusing for overload now (logged when it starts and when it ends, not per request).
        self._overloaded = False

    def submit(self, body: dict[str, Any]) -> bool:
        """Answer ``body`` on a bid thread; False when it was refused at once instead."""
        if self.pool.try_submit(answer, self.settings, self.app, self.profile, body,
                                bidder=self.bidder):
            if self._overloaded:
                self._overloaded = False
                logger.warning("node %s: bid requests are queued again", self.profile.name)
            return True
        reason = (f"node {self.profile.name} overloaded: {self.pool.threads} bid thread(s) "
                  f"busy and {self.pool.queue} request(s) waiting (bidding_bid_queue_size)")
        if not self._overloaded:
            self._overloaded = True
            logger.warning("%s; bid requests are refused at once until it catches up", reason)
        refuse(self.settings, self.app, body, reason, defer=self.defer)
        return False

    def answer_here(self, body: dict[str, Any]) -> None:
        """Answer ``body`` on this thread; an award it leads to runs on a bid thread."""
        answer(self.settings, self.app, self.profile, body, defer=self.defer,
               bidder=self.bidder)

    def defer(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on a bid thread, or here when every one is taken."""
        if not self.pool.try_submit(fn, *args):
            fn(*args)

    def shutdown(self) -> None:
        """Finish the bids in progress; drop those waiting."""
        self.pool.shutdown(wait=True, cancel_futures=True)


class BidConsumerStep(bootsteps.ConsumerStep):  # type: ignore[misc]  # Celery is untyped
    """Consume ``bids.<node>`` in the worker's main process and answer from a thread pool."""

    label = "bidding bids"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.app: Celery = consumer.app
        self.settings = get_settings(self.app)
        self.profile = current_profile(self.settings)
        # Resolved (and checked) when the worker started (app.NodeStep): cached here.
        self.bidder = node_bidder(self.profile, profile_source(self.settings))
        self.threads: BidThreads | None = None
        self.listener: RequestListener | None = None

    def get_consumers(self, channel: Any) -> list[Consumer]:
        """One consumer on this node's bid queue, or a listener on the Redis board's list
        (nothing for a worker without a profile)."""
        if self.profile is None:
            return []
        if self.threads is None:
            self.threads = BidThreads(self.settings, self.app, self.profile, self.bidder)
        board = get_board(self.settings, self.app)
        if isinstance(board, RedisBoard):
            if self.listener is None:
                # Bids are answered on the listener's thread (a bid is a millisecond of CPU: a
                # hand-off to another thread cost a fifth of that); awards go to the pool.
                self.listener = RequestListener(board, self.profile.name, self.answer_here)
            self.listener.start()
            return []
        # Acknowledged on receipt: a bid lost with its node is a bid that should not win.
        return [Consumer(channel, queues=[request_queue(self.profile.name)],  # type: ignore[no-untyped-call]
                         callbacks=[self.on_message], accept=["json"], no_ack=True)]

    def on_message(self, body: dict[str, Any], message: Message) -> None:
        """Hand the request to a bid thread; the event loop stays free."""
        self.submit(body)

    def answer_here(self, body: dict[str, Any]) -> None:
        """Answer ``body`` on this thread; an award it leads to runs on a bid thread."""
        if self.threads is not None:
            self.threads.answer_here(body)

    def submit(self, body: dict[str, Any]) -> None:
        """Answer ``body`` on a bid thread (or refuse it at once: the node is overloaded)."""
        if self.threads is not None:
            self.threads.submit(body)

    def stop(self, consumer: Any) -> None:
        """Stop taking bid requests (the connection is lost, or the worker stops)."""
        if self.listener is not None:
            self.listener.stop()
        super().stop(consumer)

    def shutdown(self, consumer: Any) -> None:
        """Finish the bids in progress, then stop."""
        if self.listener is not None:
            self.listener.stop()
        super().shutdown(consumer)
        if self.threads is not None:
            self.threads.shutdown()
            self.threads = None
