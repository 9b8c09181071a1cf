"""Planning an auction: which route it takes, decided once, from what is known before any of it
runs (pure: no Celery, no store).

The steps are the Kubernetes scheduler's: *filter* the live nodes to the candidates
(``candidates.select_candidates``), then *score* (the bids and the strategy), *reserve* (the
winner's slot, under a lock or the journal's compare-and-set) and *bind* (the award written and
the execution sent to the winner). The plan says how the auction gets from filter to bind:

- ``JOURNAL``: the announcer makes every candidate's bid and awards at once into the
  write-behind journal (``bidding_award_journal``); a writer stores it behind.
- ``PROXY``: the announcer makes every candidate's bid and awards at once in the store (for a
  new task decided by a scoring strategy, its row, bids and award in one transaction).
- ``MIXED``: the announcer posts the bids it made for some candidates and asks the others.
- ``ASK``: every candidate is asked; its node answers.
- ``WAIT``: no live candidate, but capable nodes are coming back: announced again soon.
- ``DEFER``: no candidate, and the task's fallbacks defer it (or escalate it after too many).
- ``NONE``: no candidate: the auction closes at once with the no-bid outcome.

A route that cannot commit its award (the journal down, a proxy award that raised) falls back to
the plan's ``fallback``, decided with it: journal, then proxy, then asking every candidate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from bidding.auction.candidates import split_by_bidder
from bidding.auction.request_view import bidder_view
from bidding.models import Announcement, BidMode
from bidding.nodes.registry import LiveNode


class Route(Enum):
    """How an auction goes from its candidates to its award (see the module)."""

    JOURNAL = "journal"
    PROXY = "proxy"
    MIXED = "mixed"
    ASK = "ask"
    WAIT = "wait"
    DEFER = "defer"
    NONE = "none"


class RowStep(Enum):
    """When the announcement's row is written (a new task's insert, or a due task's move back
    to BIDDING), relative to the rest of the route."""

    #: Before anything else: the route reads or answers it.
    FIRST = "first"
    #: In the award's own transaction (a new task decided at once by a scoring strategy), or,
    #: for the journal, by a writer behind.
    WITH_AWARD = "with award"
    #: After the bid requests are out (a new task on a board that keeps the answers until
    #: the award): the insert overlaps the bidding instead of delaying it.
    AFTER_ASKING = "after asking"
    #: Written already, by the route this plan is the fallback of.
    WRITTEN = "written"


@dataclass(frozen=True)
class Circumstances:
    """What the plan depends on besides the announcement and its candidates."""

    #: The task is new (a caller's ``.delay()``), not a due retry, deferral or scheduled start.
    new: bool
    #: Its id was generated for this call, so no other auction can have it.
    fresh_id: bool
    #: Who bids for whom (the announcement's ``bid_mode``, else ``bidding_bid_mode``).
    bid_mode: BidMode
    #: The task's strategy decides at once (a scoring strategy, not an LLM judge).
    decides_at_once: bool
    #: ``bidding_award_journal`` is on.
    journal: bool
    #: The bid board keeps the answers until the award (Redis), so requests may go out before
    #: the row is written.
    board_keeps_answers: bool
    #: ``bidding_bid_request_limit``: a request carrying a cut announcement needs its row.
    request_limit: int
    #: The task's deadline has not passed.
    in_time: bool


@dataclass(frozen=True)
class AuctionPlan:
    """One auction's route and everything it needs to run it."""

    route: Route
    row: RowStep
    candidates: tuple[str, ...] = ()
    #: The candidates the announcer bids for, and those it asks.
    proxied: tuple[str, ...] = ()
    asked: tuple[str, ...] = ()
    #: Capable nodes coming back (``Route.WAIT``).
    waiting: tuple[str, ...] = ()
    #: What to do when this route cannot commit its award (None: nothing else to try).
    fallback: AuctionPlan | None = None


def plan_auction(announcement: Announcement, live: Sequence[LiveNode],
                 candidates: Sequence[str], waiting: Sequence[str],
                 known: Circumstances) -> AuctionPlan:
    """The route of ``announcement``'s auction among the filtered ``candidates`` (of the
    ``live`` nodes), or, with none, the nodes it is ``waiting`` for."""
    if not candidates:
        if waiting:
            return AuctionPlan(Route.WAIT, RowStep.FIRST, waiting=tuple(waiting))
        if announcement.fallbacks.on_capability_unavailable == "defer" and known.in_time:
            return AuctionPlan(Route.DEFER, RowStep.FIRST)
        return AuctionPlan(Route.NONE, RowStep.FIRST)
    proxied, asked = split_by_bidder(known.bid_mode, live, candidates)
    if asked:
        return _asking(announcement, candidates, proxied, asked, known)
    ask_all = _asking(announcement, candidates, [], candidates, known)
    if not (known.new and known.decides_at_once):
        # A due task's row is moved back to BIDDING first; a slow strategy (an LLM judge)
        # decides outside the award's transaction, on answers stored first.
        return AuctionPlan(Route.PROXY, RowStep.FIRST, tuple(candidates), tuple(candidates),
                           fallback=AuctionPlan(Route.ASK, RowStep.WRITTEN, tuple(candidates),
                                                asked=tuple(candidates)))
    proxy = AuctionPlan(Route.PROXY, RowStep.WITH_AWARD, tuple(candidates), tuple(candidates),
                        fallback=ask_all)
    if known.journal and known.fresh_id:
        return AuctionPlan(Route.JOURNAL, RowStep.WITH_AWARD, tuple(candidates),
                           tuple(candidates), fallback=proxy)
    return proxy


def _asking(announcement: Announcement, candidates: Sequence[str], proxied: Sequence[str],
            asked: Sequence[str], known: Circumstances) -> AuctionPlan:
    """The plan that asks ``asked`` (after posting the bids made for ``proxied``)."""
    # A new auction on a board that keeps its answers asks before its row is written (the
    # award waits for the row). Only for an id generated for this call: a caller's own id may
    # be an existing task's, whose open auction must not get answers meant for this one. And
    # only when the requests carry the whole announcement: else the answering node reads it
    # from the row.
    whole = bidder_view(announcement, known.request_limit)[1]
    first = known.new and known.fresh_id and known.board_keeps_answers and whole
    return AuctionPlan(Route.MIXED if proxied else Route.ASK,
                       RowStep.AFTER_ASKING if first else RowStep.FIRST,
                       tuple(candidates), tuple(proxied), tuple(asked))
