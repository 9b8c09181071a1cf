"""Bid requests, answered in the node worker's main process.

Bid requests (``bid_request.BidRequest``) are answered by a few threads of the worker's main
process, so they never wait behind executions in the worker pool: a node busy with long tasks
still answers at once, with a low load score, instead of missing the auction. A node whose
profile names a bidder of its own answers when that bidder has judged the built-in draft
(``auction.bidder``, on threads of its own, with a timeout). The bid board carries them
(``BidBoard.send_requests``, ``BidBoard.consume_requests``): on Redis, one push for all
candidates and a listener thread popping each node's; otherwise as kombu messages on
``bids.<node>`` consumed by this module's Celery ``ConsumerStep`` (RabbitMQ).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from celery import Celery, bootsteps
from kombu.messaging import Consumer

from bidding import clock, tracing
from bidding.auction.bid_request import BidRequest
from bidding.auction.bidder import NodeBidder, node_bidder
from bidding.auction.board import RequestIntake, get_board, write_answer
from bidding.auction.close import close_auction
from bidding.auction.history import place_bid
from bidding.auction.request_view import bidder_view
from bidding.config import Settings, get_settings
from bidding.context import Context
from bidding.models import Announcement, Bid, Refusal
from bidding.nodes.bounded import BoundedPool
from bidding.nodes.profile import NodeProfile, current_profile, profile_source
from bidding.store import write_session

logger = logging.getLogger(__name__)

#: Runs an award elsewhere (a bid thread) so that the answering thread takes the next request.
Defer = Callable[[Callable[[], None]], None]


def request_bids(ctx: Context, announcement: Announcement,
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
    expires_at = announcement.announced_at + announcement.window
    expected = len(candidates) if expected is None else expected
    shown, full = (
        view if view is not None else bidder_view(announcement, ctx.settings.bid_request_limit)
    )
    requests = [
        BidRequest(
            announcement=shown,
            node=node,
            expires_at=expires_at,
            expected=expected,
            partial=not full,
        )
        for node in candidates
    ]
    get_board(ctx).send_requests(ctx.app, requests, ttl=announcement.window + 1.0)


def answer(
    ctx: Context,
    profile: NodeProfile | None,
    request: BidRequest,
    defer: Defer | None = None,
    bidder: NodeBidder | None = None,
) -> Bid | Refusal | None:
    """Answer one bid request and record the answer; never raises. None when dropped, or
    when the node's own ``bidder`` answers later (on its thread, ``auction.bidder``).

    When the answer completes the auction, the award runs here, or through ``defer`` (an
    executor's ``submit``) so that the caller can take the next request meanwhile.
    """
    if not _open(request):
        return None
    announcement, node, expires_at = request.announcement, request.node, request.expires_at
    expected, full = request.expected, not request.partial
    response: Bid | Refusal
    try:
        if profile is None:
            response = Refusal(
                task_id=announcement.task_id,
                node=node,
                attempt=announcement.attempt,
                reason="this worker has no node profile (bidding_profile)",
            )
        elif profile.name != node:
            response = Refusal(
                task_id=announcement.task_id,
                node=node,
                attempt=announcement.attempt,
                reason=f"profile mismatch: worker runs node {profile.name!r}",
            )
        elif announcement.task_name and announcement.task_name not in ctx.app.tasks:
            # Its pool would drop the message (NotRegistered): never win work it cannot run.
            response = Refusal(
                task_id=announcement.task_id,
                node=node,
                attempt=announcement.attempt,
                reason=f"task {announcement.task_name} is not registered on this node "
                f"(its workers run -A {ctx.app.main})",
            )
        else:
            with tracing.bid_span(announcement, node) as span:
                response = place_bid(ctx.settings, announcement, profile, request.history_version)
                tracing.note_answer(span, response)
    except Exception as exc:  # a bid never raises: the auction must still close
        logger.exception("bid of %s on %s failed", node, announcement.task_id)
        response = Refusal(
            task_id=announcement.task_id,
            node=node,
            attempt=announcement.attempt,
            reason=f"bid failed: {type(exc).__name__}: {exc}",
            failed=True,
        )

    def post(given: Bid | Refusal) -> None:
        try:
            record_answer(ctx, announcement, given, expected, defer, full=full)
        except Exception:
            # The sweeper still closes the auction at its deadline with the bids recorded.
            logger.exception("could not record the bid of %s on %s", node, announcement.task_id)

    if bidder is not None and isinstance(response, Bid):
        # The node's own bidder judges the draft on a thread of its own; its answer (or a
        # refusal at its timeout) is posted from there.
        try:
            bidder.ask(announcement, response, expires_at or None, post)
            return None
        except Exception as exc:  # never raised so far; the auction must still hear from us
            logger.exception("could not ask the bidder of %s on %s", node, announcement.task_id)
            response = Refusal(
                task_id=announcement.task_id,
                node=node,
                attempt=announcement.attempt,
                reason=f"could not ask its bidder: {type(exc).__name__}: {exc}",
                bidder=bidder.spec,
            )
    post(response)
    return response


def _open(request: BidRequest) -> bool:
    """False (logged) when the request's auction has closed: it is dropped unread."""
    if request.expires_at and clock.now() > request.expires_at:
        logger.info(
            "bid request for %s arrived after its auction closed; dropped",
            request.announcement.task_id,
        )
        return False
    return True


def refuse(
    ctx: Context,
    request: BidRequest,
    reason: str,
    defer: Defer | None = None,
) -> Refusal | None:
    """Answer ``request`` at once with a refusal that says ``reason`` (the node could not bid:
    no verdict on the task) and record it; never raises. None when the request is dropped."""
    if not _open(request):
        return None
    announcement, node = request.announcement, request.node
    refusal = Refusal(
        task_id=announcement.task_id,
        node=node,
        attempt=announcement.attempt,
        reason=reason,
        failed=True,
    )
    try:
        record_answer(
            ctx, announcement, refusal, request.expected, defer, full=not request.partial
        )
    except Exception:  # the sweeper still closes the auction at its deadline
        logger.exception("could not record the refusal of %s on %s", node, announcement.task_id)
    return refusal


def record_answer(
    ctx: Context,
    announcement: Announcement,
    response: Bid | Refusal,
    expected: int,
    defer: Defer | None = None,
    *,
    full: bool = True,
) -> None:
    """Post the answer on the bid board; the answer that completes the auction closes it
    (``full``: ``announcement`` is the whole announcement, else the closer reads it from the
    store)."""
    board = get_board(ctx)
    posted = board.post(response, expected=expected, window=announcement.window)
    if posted.late:
        logger.info("%s answered %s after its auction closed", response.node, announcement.task_id)
        if board.writes_on_award:
            try:
                with write_session(ctx.settings.database_url) as session:
                    write_answer(session, response, late=True)
            except Exception:  # an unknown announcement: nothing to attach the answer to
                logger.warning(
                    "late answer of %s for unknown task %s dropped",
                    response.node,
                    announcement.task_id,
                )
        return
    if posted.complete:
        (defer or _now)(lambda: _close(ctx, announcement, expected, full))


def _now(award: Callable[[], None]) -> None:
    award()


def _close(
    ctx: Context, announcement: Announcement, expected: int, full: bool = True
) -> None:
    try:
        # A partial announcement (the bidder's view) is not what the award sends: the closer
        # reads the task's own from the store.
        close_auction(
            ctx,
            announcement.task_id,
            announcement.attempt,
            closed_by="all bids in",
            announcement=announcement if full else None,
            candidates=expected if full else None,
        )
    except Exception:  # the sweeper closes it at the deadline
        logger.exception("award of %s failed", announcement.task_id)


class BidThreads:
    """A node's bid threads (``bidding_bid_threads``) with room for ``bidding_bid_queue_size``
    requests waiting. A request that finds them full is refused at once, saying the node is
    overloaded; an award finding them full runs on the thread whose answer completed its
    auction (it must not be dropped: that thread waits for it instead)."""

    def __init__(
        self, settings: Settings, app: Celery, profile: NodeProfile, bidder: NodeBidder | None
    ) -> None:
        self.settings = settings
        self.app = app
        self.profile = profile
        self.bidder = bidder
        self.pool = BoundedPool(
            settings.bid_threads, settings.bid_queue_size, f"bid-{profile.name}"
        )
        #: Refusing for overload now (logged when it starts and when it ends, not per request).
        self._overloaded = False

    def submit(self, request: BidRequest) -> bool:
        """Answer ``request`` on a bid thread; False when it was refused at once instead."""
        if self.pool.try_submit(
            answer, Context(self.settings, self.app), self.profile, request, bidder=self.bidder
        ):
            if self._overloaded:
                self._overloaded = False
                logger.warning("node %s: bid requests are queued again", self.profile.name)
            return True
        reason = (
            f"node {self.profile.name} overloaded: {self.pool.threads} bid thread(s) "
            f"busy and {self.pool.queue} request(s) waiting (bidding_bid_queue_size)"
        )
        if not self._overloaded:
            self._overloaded = True
            logger.warning("%s; bid requests are refused at once until it catches up", reason)
        refuse(Context(self.settings, self.app), request, reason, defer=self.defer)
        return False

    def answer_here(self, request: BidRequest) -> None:
        """Answer ``request`` on this thread; an award it leads to runs on a bid thread."""
        answer(
            Context(self.settings, self.app),
            self.profile,
            request,
            defer=self.defer,
            bidder=self.bidder,
        )

    def defer(self, award: Callable[[], None]) -> None:
        """Run ``award()`` on a bid thread, or here when every one is taken."""
        if not self.pool.try_submit(award):
            award()

    def shutdown(self) -> None:
        """Finish the bids in progress; drop those waiting."""
        self.pool.shutdown(wait=True, cancel_futures=True)


class BidConsumerStep(bootsteps.ConsumerStep):  # type: ignore[misc]  # Celery is untyped
    """Take this node's bid requests from the bid board, in the worker's main process, and
    answer them on the listener's thread or from a thread pool."""

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
        self.intake: RequestIntake | None = None

    def get_consumers(self, channel: Any) -> list[Consumer]:
        """The board's intake of this node's requests, (re)started: a consumer of its queue
        for Celery to run on ``channel``, or none when it is a thread of its own (the Redis
        board's listener). Nothing for a worker without a profile."""
        if self.profile is None:
            return []
        if self.threads is None:
            self.threads = BidThreads(self.settings, self.app, self.profile, self.bidder)
        if self.intake is None:
            # A listener thread answers on itself; Celery's event loop hands requests to the
            # bid threads. Awards go to the pool either way.
            self.intake = get_board(Context(self.settings, self.app)).consume_requests(
                self.profile.name, answer_here=self.answer_here, hand_over=self.submit
            )
        return self.intake.start(channel)

    def answer_here(self, request: BidRequest) -> None:
        """Answer ``request`` on this thread; an award it leads to runs on a bid thread."""
        if self.threads is not None:
            self.threads.answer_here(request)

    def submit(self, request: BidRequest) -> None:
        """Answer ``request`` on a bid thread (or refuse it at once: the node is
        overloaded)."""
        if self.threads is not None:
            self.threads.submit(request)

    def stop(self, consumer: Any) -> None:
        """Stop taking bid requests (the connection is lost, or the worker stops)."""
        if self.intake is not None:
            self.intake.stop()
        super().stop(consumer)

    def shutdown(self, consumer: Any) -> None:
        """Finish the bids in progress, then stop."""
        if self.intake is not None:
            self.intake.stop()
        super().shutdown(consumer)
        if self.threads is not None:
            self.threads.shutdown()
            self.threads = None
