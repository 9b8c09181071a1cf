"""The award: the auction decided on its answers (``decision.decide`` with the task's
strategy), bound in the store with the winner reserved (``bind``, in ``reserve``'s loop), and
routed to the winner (or the caller's result failed with the reason).

One entry point per input: ``award_answers`` for answers in hand (read off the bid board, or
proxy bids made for a slow strategy), ``award_made_inside`` for proxy bids made inside the
bind's transaction from the states it reads under its lock. Both return the bound award, or
None when there is none to route (someone else closed the auction).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from bidding import clock, tracing
from bidding.auction.bid import NodeHistory
from bidding.auction.bind import (
    ROW_WAIT,
    AwardJob,
    Decided,
    Unbound,
    bind,
    row_appears,
)
from bidding.auction.board import sorted_answers
from bidding.auction.decision import (
    NO_VALID_BIDS,
    decide,
    fallback_node,
    fallback_pool,
    refresh_loads,
)
from bidding.auction.history import in_flight_counts, rooms_of
from bidding.auction.loads import note_award
from bidding.auction.placement import Room, placed
from bidding.auction.reserve import AGAIN, Again, reserve
from bidding.config import Settings
from bidding.context import Context
from bidding.errors import ConfigurationError, NoBidsError
from bidding.execution.dispatch import mark_undelivered, send_execution
from bidding.execution.report import fail_caller
from bidding.lifecycle import events, states
from bidding.models import Announcement, Award, Bid, Refusal
from bidding.nodes.profile import exec_queue
from bidding.nodes.registry import live_nodes
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow
from bidding.strategies.protocol import NodeCapability, SelectionStrategy, decides_at_once
from bidding.strategies.resolver import resolve_strategy

logger = logging.getLogger(__name__)

#: ``closed_by`` of an auction its announcer closed with proxy bids.
PROXY_CLOSE = "proxy bids"


@dataclass(frozen=True)
class Closing:
    """How an auction closed: by what (its last answer, the deadline, proxy bids) and among
    how many candidates."""

    by: str
    candidates: int


@dataclass(frozen=True)
class AnswersInside:
    """Answers made inside the award's transaction (proxy bids with a scoring strategy):
    ``make(session, states)`` bids for ``nodes`` from the states (``history.lock_states``:
    in-flight work, record, recent failures) the award has just read under its lock, so one
    read of the bidders' state serves both their bids and the award, and nothing changes in
    between."""

    nodes: Sequence[str]
    make: Callable[[Session, dict[str, NodeHistory]], Sequence[Bid | Refusal]]
    #: When the bids are made (recent failures are counted back from it).
    now: float


@dataclass
class RefusedStrategy:
    """Stands in for a strategy this process will not import (not in its allowlist): it
    selects no bid, and the award's error says why. The node refuses; it never imports it."""

    name: str
    last_reasoning: str

    def select(self, bids: Sequence[Bid], announcement: Announcement,
               capabilities: Mapping[str, NodeCapability]) -> Bid | None:
        """No winner: the strategy was refused."""
        return None


def strategy_of(settings: Settings, announcement: Announcement) -> SelectionStrategy:
    """``announcement``'s strategy as this process may run it: a built-in or registered name, or a
    dotted path in its ``bidding_allowed_strategies``; else a ``RefusedStrategy``, logged."""
    try:
        return resolve_strategy(announcement.strategy, settings.strategy_allowlist)
    except ConfigurationError as exc:
        logger.error("auction %s: strategy refused: %s", announcement.task_id, exc)
        return RefusedStrategy(announcement.strategy, f"refused here: {exc}")


def award_answers(settings: Settings, announcement: Announcement,
                  answers: Sequence[Bid | Refusal], *, closed_by: str, candidates: int,
                  write: bool) -> Award | None:
    """Decide the auction on ``answers`` in hand (read off the bid board, or proxy bids made
    for a slow strategy) and bind the award (not routed yet); None when someone else closed
    it first or its row never appeared. ``write``: the answers are not in the store yet (a
    Redis board's, proxy bids): they are written, scored, with the award.

    A scoring strategy decides under the bind's lock, in one transaction. A slow one (an LLM
    judge) decides outside it, on the counts read then; the bind re-checks them (on the last
    try only its winner's), never running the judge under the lock."""
    bidders = sorted(b.node for b in answers if isinstance(b, Bid))
    decide, at_once = _decider(settings, announcement, Closing(closed_by, candidates))
    job = AwardJob(settings, announcement, bidders, decide, lambda _s, _k: answers, write)
    if at_once:
        return reserve(lambda _last: _outcome(job, bind(job)))

    def decided_outside(last: bool) -> Award | Again | None:
        counts = in_flight_counts(settings, bidders)
        rooms = rooms_of(settings, bidders) if placed(announcement) else None
        award = job.decide(answers, counts, rooms)
        checked = ([award.winner] if award.winner else []) if last else bidders
        return _outcome(job, bind(job, Decided(award, counts, checked)))

    return reserve(decided_outside)


def award_made_inside(settings: Settings, announcement: Announcement, inside: AnswersInside,
                      *, candidates: int, opening: Callable[[Session], object] | None = None
                      ) -> Award | None:
    """Make the proxy bids ``inside`` the award's transaction, from the bidders' states read
    under its lock, decide and bind (a scoring strategy: it decides in microseconds under the
    lock); ``opening`` writes the announcement's own row in the same transaction first."""
    decide, at_once = _decider(settings, announcement, Closing(PROXY_CLOSE, candidates))
    job = AwardJob(settings, announcement, sorted(set(inside.nodes)), decide, inside.make,
                   write=True, made_at=inside.now, opening=opening)
    if not at_once:
        raise ValueError(f"strategy {announcement.strategy} decides outside the award's "
                         "transaction: its announcement and answers must be stored first")
    return reserve(lambda _last: _outcome(job, bind(job)))


def _decider(settings: Settings, announcement: Announcement, closing: Closing
             ) -> tuple[Callable[[Sequence[Bid | Refusal], dict[str, int],
                                  Mapping[str, Room] | None], Award], bool]:
    """The award on some answers and counts, with the strategy resolved once; and whether
    that strategy decides at once."""
    strategy = strategy_of(settings, announcement)

    def decide(given: Sequence[Bid | Refusal], counts: dict[str, int],
               rooms: Mapping[str, Room] | None) -> Award:
        return decide_award(settings, announcement, strategy, given, counts, closing,
                            rooms=rooms)

    return decide, decides_at_once(strategy)


def _outcome(job: AwardJob, bound: Award | Unbound) -> Award | Again | None:
    """What a bind's answer means to the reservation loop."""
    if bound is Unbound.STALE:
        return AGAIN
    if bound is Unbound.NOT_YET:
        task_id = job.announcement.task_id
        if row_appears(job.settings, task_id):
            return AGAIN  # the caller's insert committed meanwhile: decide again
        logger.warning("auction %s: no announcement in the store after %gs (the caller's "
                       "insert failed or is stuck); left to the deadline sweeper", task_id,
                       ROW_WAIT)
        return None
    return None if bound is Unbound.LOST else bound


def decide_award(settings: Settings, announcement: Announcement, strategy: SelectionStrategy,
                 answers: Sequence[Bid | Refusal], counts: dict[str, int], closing: Closing,
                 extra_load: Mapping[str, int] | None = None,
                 rooms: Mapping[str, Room] | None = None) -> Award:
    """The award of ``announcement`` on ``answers`` with the bidders' in-flight ``counts``: the
    strategy's pick among the eligible bids, or the no-bid outcome (a fallback node when the
    task's ``no_bid`` says so). ``extra_load``: awards not in the store yet, by node (the
    write-behind journal's reservations), counted for a fallback's choice too. ``rooms``:
    the bidders' room for a task that needs resources or warm items (``placement``)."""
    bids, refusals = sorted_answers(answers)
    award = decide(announcement, refresh_loads(bids, counts), refusals, strategy,
                   closed_by=closing.by, candidates=closing.candidates, rooms=rooms,
                   fit=settings.fit)
    if award.outcome == "failed" and announcement.no_bid == "fallback":
        pool = (fallback_pool(announcement, live_nodes(settings))
                # never "none to fall back to" from a cached list: read it again first
                or fallback_pool(announcement, live_nodes(settings, fresh=True)))
        loads = in_flight_counts(settings, [n.name for n in pool])
        for name, extra in (extra_load or {}).items():
            if name in loads:
                loads[name] += extra
        node = fallback_node(pool, loads)
        if node is not None:
            award = award.model_copy(update={"outcome": "fallback", "winner": node})
        else:
            skills = ", ".join(announcement.required_skills) or "any skill"
            award = award.model_copy(update={"error": (
                f"{award.error}; no live node with {skills} to fall back to")})
    return award


def route_award(ctx: Context, announcement: Announcement, award: Award) -> None:
    """Act on a committed award: send the execution to the winner, or fail the caller's
    result with the reason there is none.

    The award is committed before the execution is sent, so a send that fails (the broker
    down past Celery's publish retries) must not lose the task: it is marked undelivered and a
    sweeper sends it again (``sweeper.resend``) once the broker is back.
    """
    with tracing.award_span(announcement, award):  # the execution's parent
        _route(ctx, announcement, award)


def _route(ctx: Context, announcement: Announcement, award: Award) -> None:
    """``route_award``, within the award's span."""
    if award.winner is not None:
        note_award(ctx.settings, award.winner)  # ranks the next auctions (auction.loads)
        # Before the execution, so that Flower has it before the winner's own events.
        events.awarded(ctx.app, announcement, award.winner, exec_queue(award.winner),
                       outcome=award.outcome)
        try:
            send_execution(ctx.app, announcement, award.winner, ctx.settings)
        except Exception as exc:
            mark_undelivered(ctx.settings, announcement, award.winner, exc)
            return
    else:
        fail_caller(ctx, announcement, NoBidsError(award.error or NO_VALID_BIDS))
    logger.info(
        "auction %s closed by %s: %s %s",
        announcement.task_id,
        award.closed_by,
        award.outcome,
        award.winner or award.error,
    )


_AWARDED = select(
    AnnouncementRow.state,
    AnnouncementRow.attempt,
    AnnouncementRow.assigned_node,
    AnnouncementRow.outcome,
    AnnouncementRow.strategy,
    AnnouncementRow.closed_by,
    AnnouncementRow.error,
    AnnouncementRow.awarded_at,
).where(AnnouncementRow.task_id == bindparam("task_id"))


def stored_award(settings: Settings, task_id: str) -> Award | None:
    """``task_id``'s award as the store holds it, while it is still to be routed (ASSIGNED to
    its winner, or FAILED by an award without one); None when there is none, or the task has
    moved on (started, or failed by something other than its award)."""
    with read_session(settings.database_url) as session:
        row = session.execute(_AWARDED, {"task_id": task_id}).one_or_none()
    if row is None or row.outcome not in ("awarded", "fallback", "failed"):
        return None
    if not (
        (row.state == states.ASSIGNED and row.assigned_node)
        or (row.state == states.FAILED and row.assigned_node is None and row.outcome == "failed")
    ):
        return None
    return Award(
        task_id=task_id,
        attempt=row.attempt,
        outcome=row.outcome,
        winner=row.assigned_node,
        strategy=row.strategy,
        closed_by=row.closed_by or "",
        error=row.error,
        awarded_at=row.awarded_at or clock.now(),
    )
