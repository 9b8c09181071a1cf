"""Proxy bids: the announcing process bids for the candidates and awards at once.

A node's bid is a pure function, ``bid.compute_bid``, of two inputs that are not private to
the node: its profile, which its heartbeat row publishes, and its history in the store
(experience, recent failures, in-flight work, its record). With ``bidding_bid_mode = "proxy"``
the process that announces a task makes the candidates' bids itself, with that same function on
those same inputs, and closes the auction there: no bid request is sent, no node is woken to
answer, and nobody waits for a window. It is how the Kubernetes scheduler scores nodes from the
status they report, and what an auction house calls a proxy bid (the bidder left its rule with
the auctioneer).

What the bids and the award keep: the candidates (filter, cap), each node's sub-scores,
refusals and their reasons, the strategy, min_confidence/min_trust/budget, the in-flight
count and compare-and-set of the award, and the stored bids and messages that ``explain``,
the watchdogs' re-award to the next-best bidder and learned trust read. With a scoring
strategy the bids are made inside the award's transaction, from the counts it reads under its
lock (``award.AnswersInside``). What they do not: a
node that heartbeats but cannot take work is still bid for (as a node whose main process
answers while its pool is stuck is, in "ask" mode); the schedule-to-start watchdog covers both.

In "auto" bid mode (the default) the announcer proxies only the nodes that bid with the
built-in function alone; a node whose profile names a bidder of its own is asked. When both
kinds are candidates, the auction is mixed (``post_proxy_answers``): the proxied bids go on
the bid board at once, before the others are asked, and the auction closes as any asked one
does, when the last answer is in or at the end of its window.

Measured in ``bench/latency.py`` (bench/RESULTS.md), against "ask" with the same nodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sqlalchemy.orm import Session

from bidding import clock, tracing
from bidding.auction.award import (
    PROXY_CLOSE,
    AnswersInside,
    award_answers,
    award_made_inside,
    strategy_of,
)
from bidding.auction.bid import NodeHistory, compute_bid, refusal_reason
from bidding.auction.board import Posted, get_board
from bidding.auction.history import (
    cached_histories,
    histories_inside,
    history_versions,
    with_kin,
    with_records,
)
from bidding.config import Settings
from bidding.context import Context
from bidding.models import Announcement, Award, Bid, Refusal
from bidding.nodes.kin import kin_records
from bidding.nodes.profile import NodeProfile
from bidding.nodes.records import records_of
from bidding.nodes.registry import LiveNode
from bidding.strategies.protocol import decides_at_once

logger = logging.getLogger(__name__)

__all__ = ["PROXY_CLOSE", "answers_inside", "award_by_proxy", "post_proxy_answers",
           "profile_of", "proxy_answers"]


def profile_of(node: LiveNode) -> NodeProfile:
    """The profile ``node`` published with its heartbeat (validated when its worker loaded it;
    ``LiveNode.profile``)."""
    return node.profile


def proxy_answers(settings: Settings, announcement: Announcement, nodes: Sequence[LiveNode],
                  now: float | None = None, versions: dict[str, int | None] | None = None
                  ) -> list[Bid | Refusal]:
    """Each node's answer to ``announcement``, as its own worker would make it (``bid.place_bid``):
    a refusal, or ``compute_bid`` on its published profile and its history in the store.

    ``versions`` (the nodes' history versions on the bid board) let histories read for an
    earlier auction be reused while they hold, as the nodes' own bids do (``cached_history``).
    """
    now = clock.now() if now is None else now
    profiles = [profile_of(node) for node in nodes]
    bidding = [p.name for p in profiles if refusal_reason(announcement, p, now) is None]
    kin = kin_records(settings, announcement.task_type, bidding)
    histories = with_records(with_kin(
        cached_histories(settings, bidding, announcement.task_type, versions or {}, now), kin),
        records_of(settings, announcement.task_type, list(kin)))
    return answers_of(announcement, profiles, histories, now)


def answers_of(announcement: Announcement, profiles: Sequence[NodeProfile],
               histories: dict[str, NodeHistory], now: float) -> list[Bid | Refusal]:
    """``compute_bid`` for each profile, on its history (empty when it was not read); each a
    bid's span when traced."""
    answers: list[Bid | Refusal] = []
    for p in profiles:
        with tracing.bid_span(announcement, p.name) as span:
            answers.append(compute_bid(announcement, p, histories.get(p.name, NodeHistory()), now))
            tracing.note_answer(span, answers[-1])
    return answers


def answers_inside(
    settings: Settings,
    announcement: Announcement,
    nodes: Sequence[LiveNode],
    now: float | None = None,
) -> AnswersInside:
    """The nodes' answers to ``announcement``, made in the award's transaction: their histories
    complete the states (in-flight work, record, failures) the award has just read under its
    lock. Their latest outcomes are read there too, except those cached while the nodes'
    records (read under that lock) count no attempt more (``history.histories_inside``)."""
    now = clock.now() if now is None else now
    profiles = [profile_of(node) for node in nodes]
    bidding = [p.name for p in profiles if refusal_reason(announcement, p, now) is None]

    # Read before the award's transaction, from the cached live nodes and records.
    kin = kin_records(settings, announcement.task_type, bidding)
    # Only a node with kin bids from its whole record (``scores.informed_confidence``); theirs
    # came with the kin's read, from its cache.
    records = records_of(settings, announcement.task_type, list(kin))

    def make(session: Session, known: dict[str, NodeHistory]) -> list[Bid | Refusal]:
        histories = with_records(with_kin(histories_inside(
            session, settings, bidding, announcement.task_type, known, now
        ), kin), records)
        return answers_of(announcement, profiles, histories, now)

    return AnswersInside(bidding, make, now)


def post_proxy_answers(
    ctx: Context,
    announcement: Announcement,
    nodes: Sequence[LiveNode],
    expected: int,
) -> Posted:
    """Post the bids of ``nodes`` on the announcement's bid board, made here
    (``proxy_answers``, from histories cached while the nodes' versions hold), in a mixed
    auction that waits for ``expected`` answers in all; posted before the other candidates
    are asked, so that an asked node's answer is the one that completes the auction."""
    board = get_board(ctx)
    versions = history_versions(ctx, [n.name for n in nodes])
    answers = proxy_answers(ctx.settings, announcement, nodes, versions=versions)
    return board.post_many(answers, expected=expected, window=announcement.window)


def award_by_proxy(
    ctx: Context,
    announcement: Announcement,
    candidates: Sequence[LiveNode],
    opening: Callable[[Session], object] | None = None,
) -> Award | None:
    """Make the candidates' bids for ``announcement`` and commit its award (``award.route_award``
    sends it). Its row is stored in state BIDDING already, or written by ``opening`` in the
    award's own transaction. None when another closer was first.

    With a scoring strategy the bids are made inside the award's transaction (one read of the
    candidates' state, under its lock); a strategy that decides outside it (an LLM judge) gets
    them first, from histories cached while the nodes' versions on the bid board hold.
    """
    if decides_at_once(strategy_of(ctx.settings, announcement)):
        return award_made_inside(
            ctx.settings,
            announcement,
            answers_inside(ctx.settings, announcement, candidates),
            candidates=len(candidates),
            opening=opening,
        )
    if opening is not None:
        raise ValueError(
            f"strategy {announcement.strategy} decides outside the award's transaction: "
            "its announcement must be stored first"
        )
    versions = history_versions(ctx, [n.name for n in candidates])
    answers = proxy_answers(ctx.settings, announcement, candidates, versions=versions)
    return award_answers(
        ctx.settings,
        announcement,
        answers,
        closed_by=PROXY_CLOSE,
        candidates=len(candidates),
        write=True,
    )
