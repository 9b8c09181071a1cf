"""A node's own bidder: the function its profile names, resolved when its worker starts and
asked, with a timeout, for each bid the node makes.

```toml
bidder = "mypackage.bidders:judge"   # def judge(announcement, draft) -> BidResponse | dict | None
bidder_timeout_s = 5                 # seed 001's default
```

The function gets the announcement as the bid request shows it (``auction.request_view``) and
the draft bid the built-in bidder made, and answers seed 001's ``BidResponse`` (or a dict of
its fields, or None to keep the draft); ``auction.response`` applies the answer. It may be
``async``. ``bidder = "llm"`` is seed 001's bidder agent (``auction.llm_bidder``).

It runs on a pool of its own (``nodes.timed``), so a slow bidder holds up neither the node's
other bids nor its executions: the node answers when the bidder does, or at its timeout (or the
end of the auction's window, if sooner) with a refusal that says so. A bidder that raises or
answers something invalid is a refusal with that reason too; each is logged once, and the
auction goes on with the other answers. A draft that is a refusal already (the node lacks the
skills, the deadline passed) is answered without asking the bidder.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable
from typing import Any

from bidding import clock
from bidding.auction.llm_bidder import llm_bidder
from bidding.auction.response import InvalidResponse, failed_answer, judged
from bidding.errors import ProfileError
from bidding.models import Announcement, Bid, Refusal
from bidding.nodes.profile import LLM_BIDDER, NodeProfile
from bidding.nodes.timed import Outcome, Overloaded, TimedCalls
from bidding.strategies.resolver import IMPORT_ERRORS, import_path

logger = logging.getLogger(__name__)

#: A node's bidder: (the announcement, the built-in draft) -> BidResponse | dict | None.
Bidder = Callable[[Announcement, Bid], Any]

#: Threads a node's bidder calls run on. A call past its timeout keeps its thread until it
#: returns; calls that find every thread busy wait, and are refused at their timeout.
BIDDER_THREADS = 16
#: Calls that may wait for a bidder thread; one more is refused at once (the node is
#: overloaded: its bidder is stuck, or slower than the requests come).
BIDDER_QUEUE = 256


def import_bidder(spec: str, source: str = "<profile>") -> Bidder:
    """The function at ``spec`` ("package.module:function"); a ``ProfileError`` naming the
    profile and its ``bidder`` key when it cannot be imported or is not callable."""
    try:
        obj = import_path(spec)
    except IMPORT_ERRORS as exc:
        raise ProfileError(f"{source}: bidder: cannot import {spec!r} "
                           f"({type(exc).__name__}: {exc})") from None
    if not callable(obj):
        raise ProfileError(f"{source}: bidder: {spec!r} is a {type(obj).__name__}, not a "
                           "function (announcement, draft) -> BidResponse | dict | None")
    return obj  # type: ignore[no-any-return]


def resolve_bidder(profile: NodeProfile, source: str = "<profile>") -> Bidder | None:
    """The bidder ``profile`` names (None: the built-in one alone)."""
    if profile.bidder is None:
        return None
    if profile.bidder == LLM_BIDDER:
        return llm_bidder(profile, source)
    return import_bidder(profile.bidder, source)


def call_bidder(fn: Bidder, announcement: Announcement, draft: Bid) -> Any:
    """``fn(announcement, draft)``, run to completion if it is a coroutine function."""
    value = fn(announcement, draft)
    if inspect.isawaitable(value):
        async def wait() -> Any:
            return await value

        value = asyncio.run(wait())
    return value


class NodeBidder:
    """A node's bidder and the threads it runs on; ``ask`` never blocks its caller."""

    def __init__(self, profile: NodeProfile, fn: Bidder, *, threads: int = BIDDER_THREADS,
                 queue: int = BIDDER_QUEUE) -> None:
        assert profile.bidder is not None
        self.spec: str = profile.bidder
        self.node = profile.name
        self.fn = fn
        self.timeout = profile.bidder_timeout_s
        self.calls = TimedCalls(f"bidder-{profile.name}", threads, queue)
        #: Refusing for overload now (see ``ask``).
        self.overloaded = False

    def ask(self, announcement: Announcement, draft: Bid, expires_at: float | None,
            then: Callable[[Bid | Refusal], None]) -> None:
        """Ask the bidder about ``draft``; ``then`` gets the node's answer (on another thread)
        when the bidder answers, or at its timeout or the end of the auction's window."""
        timeout = self.timeout
        left = None if not expires_at else expires_at - clock.now()
        by_window = left is not None and left < timeout
        if by_window:
            timeout = max(0.001, left or 0.0)

        def done(outcome: Outcome) -> None:
            then(self.answer(draft, outcome, timeout, by_window))

        try:
            self.calls.submit(lambda: call_bidder(self.fn, announcement, draft), timeout, done)
        except Overloaded as exc:
            # Answered at once, on the caller's thread: queued, it would be refused at its
            # timeout anyway, and the queue would grow while the bidder is stuck. Logged when
            # it starts, not for every request refused.
            reason = f"its bidder {self.spec} is overloaded: {str(exc).split(': ', 1)[1]}"
            if not self.overloaded:
                self.overloaded = True
                logger.warning("node %s: %s; bids are refused at once until it catches up",
                               self.node, reason)
            then(failed_answer(draft, self.spec, reason, clock.now()))
        else:
            self.overloaded = False

    def answer(self, draft: Bid, outcome: Outcome, timeout: float,
               by_window: bool = False) -> Bid | Refusal:
        """The node's answer once its bidder's call ended (``outcome``); a failure is logged
        here, once, and answered as a refusal that says what happened."""
        now = clock.now()
        spec = self.spec
        if outcome.timed_out:
            reason = (f"its bidder {spec} did not answer before the auction's window closed "
                      f"({timeout:.2g} s)" if by_window else
                      f"its bidder {spec} did not answer within {timeout:g} s "
                      "(bidder_timeout_s)")
            logger.warning("node %s, task %s: %s", self.node, draft.task_id, reason)
            return failed_answer(draft, spec, reason, now)
        if outcome.error is not None:
            error = outcome.error
            reason = f"its bidder {spec} raised {type(error).__name__}: {error}"
            logger.warning("node %s, task %s: %s", self.node, draft.task_id, reason,
                           exc_info=error)
            return failed_answer(draft, spec, reason, now)
        try:
            return judged(draft, outcome.value, spec, now)
        except InvalidResponse as exc:
            reason = f"its bidder {spec} {exc}"
            logger.warning("node %s, task %s: %s", self.node, draft.task_id, reason)
            return failed_answer(draft, spec, reason, now)



_bidders: dict[tuple[str, str], NodeBidder] = {}


def node_bidder(profile: NodeProfile | None, source: str = "<profile>") -> NodeBidder | None:
    """This process's ``NodeBidder`` for ``profile`` (resolved once; None for the built-in
    bidder). Raises ``ProfileError`` naming ``source`` and the key when it cannot resolve."""
    if profile is None or profile.bidder is None:
        return None
    key = (source, profile.model_dump_json())
    found = _bidders.get(key)
    if found is None:
        fn = resolve_bidder(profile, source)
        assert fn is not None
        found = _bidders[key] = NodeBidder(profile, fn)
    return found
