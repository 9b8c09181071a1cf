"""Closing an auction: collect bids, rank them, award once, route the execution.

``decide`` is pure: eligibility (min_confidence, min_trust, budget), the strategy's pick with
every bid's score, and the no-bid outcomes of seeds 000 and 001. ``receive_bid`` and
``close_auction`` apply it to the store with a compare-and-set on the announcement's state, so
the last bid, the deadline closer and any duplicate all race safely: exactly one awards.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

from celery import Celery
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from bidding import journal, lifecycle, scoring
from bidding.config import Settings
from bidding.errors import NoBidsError
from bidding.models import Announcement, Award, Bid, Refusal, Score
from bidding.profile import exec_queue
from bidding.registry import LiveNode, live_nodes
from bidding.store import read_session, write_session
from bidding.store.schema import Announcement as AnnouncementRow
from bidding.store.schema import BidRow, Node
from bidding.strategies import (
    ScoringStrategy,
    SelectionStrategy,
    capabilities_of,
    resolve_strategy,
    run_select,
    strategy_name,
)
from bidding.transition import transition

logger = logging.getLogger(__name__)

NO_BIDDERS = "No bidders registered"
NO_BIDS = "No bids received"
NO_CONFIDENT_BIDS = "No bids met minimum confidence"
NO_VALID_BIDS = "No valid bids"

#: Header names carried by an execution message.
ATTEMPT_HEADER = "bidding_attempt"
#: Cost differences below this are float rounding, not overspending.
BUDGET_EPSILON = 1e-9
#: Decisions re-made when concurrent awards reserve the same nodes; the last one commits as is.
RESERVATION_TRIES = 3
NODE_HEADER = "bidding_node"


def ineligibility(bid: Bid, rfp: Announcement) -> str | None:
    """Why ``bid`` may not win ``rfp`` (seed 001's min_confidence, AITP's min_trust and budget)."""
    if bid.confidence < rfp.min_confidence:
        return f"confidence {bid.confidence:.2f} below min_confidence {rfp.min_confidence:.2f}"
    if bid.trust < rfp.min_trust:
        return f"trust {bid.trust:.1f} below min_trust {rfp.min_trust:.1f}"
    # A tolerance, so a bid of exactly the budget left is not lost to float rounding
    # (1.0 - 0.8 is 0.19999999999999996).
    if rfp.budget is not None and bid.cost > rfp.budget - rfp.spent + BUDGET_EPSILON:
        left = rfp.budget - rfp.spent
        spent = f" ({rfp.spent:.4f} already spent)" if rfp.spent else ""
        return f"cost {bid.cost:.4f} exceeds remaining budget {left:.4f}{spent}"
    return None


def decide(
    rfp: Announcement,
    bids: Sequence[Bid],
    refusals: Sequence[Refusal],
    strategy: SelectionStrategy,
    *,
    closed_by: str,
    candidates: int,
) -> Award:
    """Rank the bids of ``rfp`` and name the winner, or say why there is none."""
    name = strategy_name(strategy)
    eligible: list[Bid] = []
    scores: list[Score] = []
    caps = capabilities_of(bids)
    for bid in bids:
        why = ineligibility(bid, rfp)
        if why is None:
            eligible.append(bid)
        else:
            scores.append(Score(node=bid.node, total=0.0, eligible=False, reason=why))
    if not eligible:
        return Award(task_id=rfp.task_id, attempt=rfp.attempt, outcome="failed", strategy=name,
                     closed_by=closed_by, scores=scores,
                     error=_no_winner_message(rfp, bids, refusals, scores, candidates))
    if isinstance(strategy, ScoringStrategy):
        scores.extend(strategy.score_all(eligible, rfp, caps))
    winner = run_select(strategy, eligible, rfp, caps)
    reasoning = getattr(strategy, "last_reasoning", "")
    if winner is None:
        return Award(task_id=rfp.task_id, attempt=rfp.attempt, outcome="failed", strategy=name,
                     closed_by=closed_by, scores=scores,
                     error=f"{NO_VALID_BIDS}: strategy {name} selected none of "
                           f"{len(eligible)} eligible bid(s)")
    if reasoning:
        scores = [s.model_copy(update={"reason": reasoning}) if s.node == winner.node else s
                  for s in scores]
    return Award(task_id=rfp.task_id, attempt=rfp.attempt, outcome="awarded", winner=winner.node,
                 strategy=name, closed_by=closed_by, scores=scores)


def _no_winner_message(
    rfp: Announcement,
    bids: Sequence[Bid],
    refusals: Sequence[Refusal],
    scores: Sequence[Score],
    candidates: int,
) -> str:
    if candidates == 0:
        skills = ", ".join(rfp.required_skills) or "any skill"
        return f"{NO_BIDDERS}: no live node offers {skills}"
    if not bids:
        if refusals:
            reasons = "; ".join(f"{r.node}: {r.reason}" for r in refusals)
            return f"{NO_BIDS}: every answering node refused ({reasons})"
        return f"{NO_BIDS}: none of {candidates} candidate(s) answered within {rfp.window:g}s"
    reasons = "; ".join(f"{s.node}: {s.reason}" for s in scores)
    if all(s.reason.startswith("confidence") for s in scores):
        return f"{NO_CONFIDENT_BIDS} ({rfp.min_confidence:.2f}): {reasons}"
    return f"{NO_VALID_BIDS}: {reasons}"


def fallback_node(live: Sequence[LiveNode], in_flight: dict[str, int],
                  rng: random.Random | None = None) -> str | None:
    """Seed 000's fallback assignment: the least busy live node (in-flight / capacity), ties at
    random. Not the load score: its 0.1 floor would make every saturated node tie."""
    if not live:
        return None
    rng = rng or random.Random()
    busy = {n.name: in_flight.get(n.name, 0) / max(1, n.capacity) for n in live}
    least = min(busy.values())
    return rng.choice(sorted(name for name, b in busy.items() if b == least))


def refresh_loads(bids: Sequence[Bid], in_flight: dict[str, int]) -> list[Bid]:
    """Bring each bid's load up to date with work awarded since it was made.

    Bids of concurrent auctions are made before any of them is awarded, so all of them see
    idle nodes; awards raise a node's in-flight count at once, and the award uses it here so
    concurrent auctions spread instead of piling onto the same node.
    """
    out = []
    for bid in bids:
        now_busy = in_flight.get(bid.node, 0)
        if now_busy > bid.in_flight:
            fresh = scoring.load_score(now_busy, bid.capacity)
            bid = bid.model_copy(update={"load": min(bid.load, fresh), "in_flight": now_busy})
        out.append(bid)
    return out


def count_in_flight(session: Session, nodes: Sequence[str]) -> dict[str, int]:
    """Tasks awarded and unfinished, per node (derived from announcement states, never leaked)."""
    if not nodes:
        return {}
    rows = session.execute(
        select(AnnouncementRow.assigned_node, func.count())
        .where(AnnouncementRow.assigned_node.in_(list(nodes)),
               AnnouncementRow.state.in_(lifecycle.IN_FLIGHT_STATES))
        .group_by(AnnouncementRow.assigned_node)
    ).all()
    return {str(node): int(n) for node, n in rows}


def in_flight_counts(settings: Settings, nodes: Sequence[str]) -> dict[str, int]:
    """``count_in_flight`` in a read session of its own."""
    with read_session(settings.database_url) as session:
        return count_in_flight(session, nodes)


def receive_bid(settings: Settings, app: Celery, response: Bid | Refusal) -> None:
    """Record a bid or refusal; the answer that completes the auction closes it at once."""
    now = time.time()
    with write_session(settings.database_url) as session:
        counted = session.execute(
            update(AnnouncementRow)
            .where(AnnouncementRow.task_id == response.task_id,
                   AnnouncementRow.attempt == response.attempt)
            .values(bids_received=AnnouncementRow.bids_received + 1)
            .returning(AnnouncementRow.bids_received, AnnouncementRow.expected_bids,
                       AnnouncementRow.state)
        ).one_or_none()
        if counted is None:
            logger.warning("bid from %s for unknown task %s (attempt %s) dropped",
                           response.node, response.task_id, response.attempt)
            return
        received, expected, state = counted
        late = state != lifecycle.BIDDING
        session.add(_bid_row(response, late))
        kind = journal.BID if isinstance(response, Bid) else journal.REFUSED
        detail: dict[str, Any] = {"late": late}
        if isinstance(response, Refusal):
            detail["reason"] = response.reason
        journal.record(session, response.task_id, kind, node=response.node,
                       attempt=response.attempt, at=now, **detail)
    if not late and received >= expected:
        close_auction(settings, app, response.task_id, response.attempt, closed_by="all bids in")


def _bid_row(response: Bid | Refusal, late: bool) -> BidRow:
    if isinstance(response, Refusal):
        return BidRow(task_id=response.task_id, attempt=response.attempt, node=response.node,
                      will_bid=False, reason=response.reason, payload=response.model_dump(),
                      late=late, bid_at=response.bid_at)
    return BidRow(
        task_id=response.task_id, attempt=response.attempt, node=response.node, will_bid=True,
        capability=response.capability, experience=response.experience, load=response.load,
        confidence=response.confidence, cost=response.cost, latency_ms=response.latency_ms,
        trust=response.trust, payload=response.model_dump(), late=late, bid_at=response.bid_at,
    )


def close_auction(settings: Settings, app: Celery, task_id: str, attempt: int,
                  closed_by: str) -> Award | None:
    """Award ``task_id``'s auction if it is still open; None when someone else already did."""
    with read_session(settings.database_url) as session:
        row = session.get(AnnouncementRow, task_id)
        if row is None or row.state != lifecycle.BIDDING or row.attempt != attempt:
            return None
        rfp = Announcement.model_validate(row.spec)
        candidates = len(row.candidates)
        bid_rows = session.scalars(
            select(BidRow).where(BidRow.task_id == task_id, BidRow.attempt == attempt,
                                 BidRow.late.is_(False))
        ).all()
        bids = [Bid.model_validate(r.payload) for r in bid_rows if r.will_bid]
        refusals = [Refusal.model_validate(r.payload) for r in bid_rows if not r.will_bid]
    strategy = resolve_strategy(rfp.strategy)
    bidders = sorted(b.node for b in bids)

    def make_award(counts: dict[str, int]) -> Award:
        award = decide(rfp, refresh_loads(bids, counts), refusals, strategy,
                       closed_by=closed_by, candidates=candidates)
        if award.outcome == "failed" and rfp.no_bid == "fallback":
            live = live_nodes(settings)
            node = fallback_node(live, in_flight_counts(settings, [n.name for n in live]))
            if node is not None:
                award = award.model_copy(update={"outcome": "fallback", "winner": node})
        return award

    result: Award | _Commit = _Commit.STALE
    for attempt_no in range(1, RESERVATION_TRIES + 1):
        if attempt_no < RESERVATION_TRIES:
            # Optimistic: decide without holding locks (a strategy may be slow, e.g. an LLM
            # judge); the commit re-checks the counts and sends us round if they moved.
            counts = in_flight_counts(settings, bidders)
            result = _commit_award(settings, rfp, bidders, make_award, (make_award(counts), counts))
        else:
            # Contended: decide inside the locked transaction, so this one cannot be stale.
            result = _commit_award(settings, rfp, bidders, make_award, None)
        if result is not _Commit.STALE:
            break
    if not isinstance(result, Award):
        return None
    award = result
    if award.winner is not None:
        send_execution(app, rfp, award.winner, settings)
    else:
        app.backend.mark_as_failure(task_id, NoBidsError(award.error or NO_VALID_BIDS))
    logger.info("auction %s closed by %s: %s %s", task_id, closed_by, award.outcome,
                award.winner or award.error)
    return award


def close_expired(settings: Settings, app: Celery, now: float | None = None,
                  limit: int = 100) -> int:
    """Close every open auction past its window (the deadline closer); returns how many."""
    now = time.time() if now is None else now
    with read_session(settings.database_url) as session:
        due = session.execute(
            select(AnnouncementRow.task_id, AnnouncementRow.attempt)
            .where(AnnouncementRow.state == lifecycle.BIDDING, AnnouncementRow.closes_at <= now)
            .order_by(AnnouncementRow.closes_at)
            .limit(limit)
        ).all()
    closed = 0
    for task_id, attempt in due:
        if close_auction(settings, app, task_id, attempt, closed_by="deadline") is not None:
            closed += 1
    return closed


class _Commit(Enum):
    #: Someone else closed the auction first.
    LOST = "lost"
    #: In-flight counts moved since the decision: decide again.
    STALE = "stale"


def _commit_award(
    settings: Settings,
    rfp: Announcement,
    bidders: Sequence[str],
    make_award: Callable[[dict[str, int]], Award],
    decided: tuple[Award, dict[str, int]] | None,
) -> Award | _Commit:
    """Write the award if the auction is still open (compare-and-set on its state).

    The bidders' node rows are locked and their in-flight counts re-read first. An award
    ``decided`` outside on other counts is not written (STALE): another award reserved one of
    these nodes meanwhile. With ``decided=None`` the award is made here, under the lock.
    SQLite's BEGIN IMMEDIATE serializes this on its own; PostgreSQL needs the row locks.
    """
    with write_session(settings.database_url) as session:
        if bidders:
            session.execute(select(Node.name).where(Node.name.in_(list(bidders)))
                            .order_by(Node.name).with_for_update())
        now_counts = count_in_flight(session, bidders)
        if decided is None:
            award = make_award(now_counts)
        else:
            award, seen = decided
            if any(now_counts.get(n, 0) != seen.get(n, 0) for n in bidders):
                return _Commit.STALE
        target = lifecycle.ASSIGNED if award.winner is not None else lifecycle.FAILED
        by_node = {s.node: s for s in award.scores}
        winner_score = by_node[award.winner].total if award.winner in by_node else None
        if award.winner is not None:
            kind = journal.AWARDED
            detail = {"outcome": award.outcome, "strategy": award.strategy,
                      "score": winner_score, "closed_by": award.closed_by,
                      "latency_ms": round((award.awarded_at - rfp.announced_at) * 1000, 3)}
        else:
            kind = journal.NO_AWARD
            detail = {"error": award.error, "closed_by": award.closed_by}
        if not transition(
            session, rfp.task_id, target, kind=kind, from_states=(lifecycle.BIDDING,),
            expect_attempt=rfp.attempt, message_node=award.winner, at=award.awarded_at,
            detail=detail,
            assigned_node=award.winner, awarded_at=award.awarded_at,
            winning_score=winner_score, outcome=award.outcome, closed_by=award.closed_by,
            error=award.error, finished_at=None if award.winner else award.awarded_at,
            due_at=start_by(settings, rfp, award.awarded_at) if award.winner else None,
        ):
            return _Commit.LOST
        winning_bid_id = None
        for row in session.scalars(select(BidRow).where(
                BidRow.task_id == rfp.task_id, BidRow.attempt == rfp.attempt,
                BidRow.late.is_(False))):
            score = by_node.get(row.node)
            if score is not None:
                row.score = score.total
                row.breakdown = score.model_dump()
            row.is_winner = row.will_bid and row.node == award.winner
            if row.is_winner:
                winning_bid_id = row.id
        if winning_bid_id is not None:
            session.execute(update(AnnouncementRow)
                            .where(AnnouncementRow.task_id == rfp.task_id)
                            .values(winning_bid_id=winning_bid_id))
    return award


def start_by(settings: Settings, rfp: Announcement, awarded_at: float) -> float | None:
    """When the winner must have started the task (schedule-to-start), or None for no limit."""
    limit = rfp.schedule_to_start_timeout or settings.schedule_to_start_timeout
    return awarded_at + limit if limit else None


def send_execution(app: Celery, rfp: Announcement, node: str,
                   settings: Settings | None = None) -> None:
    """Send the task itself to ``exec.<node>`` under the id ``.delay()`` returned.

    ``timeout_seconds`` becomes the soft time limit (the body sees SoftTimeLimitExceeded and the
    timeout fallback applies), with a hard limit ``bidding_hard_timeout_grace`` seconds later.
    """
    options: dict[str, Any] = {}
    if rfp.deadline is not None:
        # Celery revokes a message received after ``expires``: a late task is never started.
        options["expires"] = rfp.deadline
    if rfp.timeout_seconds:
        grace = settings.hard_timeout_grace if settings is not None else 5.0
        options["soft_time_limit"] = rfp.timeout_seconds
        options["time_limit"] = rfp.timeout_seconds + max(grace, 0.1)
    app.send_task(
        rfp.task_name,
        args=rfp.args,
        kwargs=rfp.kwargs,
        task_id=rfp.task_id,
        queue=exec_queue(node),
        routing_key=exec_queue(node),
        headers={ATTEMPT_HEADER: rfp.attempt, NODE_HEADER: node},
        **options,
    )
