"""Closing an auction: collect bids, rank them, award once, route the execution.

``decide`` is pure: eligibility (min_confidence, min_trust, budget), the strategy's pick with
every bid's score, and the no-bid outcomes of seeds 000 and 001. ``close_auction`` takes the
answers off the bid board (``bidding.board``) and applies the decision to the store with a
compare-and-set on the announcement's state, so the last bid, the deadline closer and any
duplicate all race safely: exactly one awards.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, cast

from celery import Celery
from sqlalchemy import Table, bindparam, func, insert, select, update
from sqlalchemy.orm import Session

from bidding import journal, lifecycle, scoring
from bidding.board import answer_message, bid_values, get_board, sorted_answers
from bidding.canvas import fail_caller, message_options
from bidding.config import Settings
from bidding.errors import NoBidsError
from bidding.models import Announcement, Award, Bid, Refusal, Score
from bidding.profile import exec_queue
from bidding.registry import LiveNode, live_nodes
from bidding.store import read_session, write_session
from bidding.store.engine import core, is_sqlite
from bidding.store.schema import Announcement as AnnouncementRow
from bidding.store.schema import BidRow, Node
from bidding.strategies import (
    ScoringStrategy,
    SelectionStrategy,
    capabilities_of,
    decides_at_once,
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

#: Bid rows are written in one Core statement (no ORM unit of work on the award's path).
_INSERT_BIDS = insert(cast(Table, BidRow.__table__))
_INSERT_BID_ID = _INSERT_BIDS.returning(cast(Table, BidRow.__table__).c.id)

#: Header names carried by an execution message.
ATTEMPT_HEADER = "bidding_attempt"
#: Cost differences below this are float rounding, not overspending.
BUDGET_EPSILON = 1e-9
#: Decisions re-made when concurrent awards reserve the same nodes; the last one commits as is.
RESERVATION_TRIES = 3
NODE_HEADER = "bidding_node"
#: Seconds an award waits for the announcement's row (bids may complete before the caller's
#: insert commits; SQLite's writers wait up to 30 s for the lock).
ROW_WAIT = 30.0


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


_IN_FLIGHT = (
    select(AnnouncementRow.assigned_node, func.count())
    .where(AnnouncementRow.assigned_node.in_(bindparam("nodes", expanding=True)),
           AnnouncementRow.state.in_(sorted(lifecycle.IN_FLIGHT_STATES)))
    .group_by(AnnouncementRow.assigned_node)
)
_OPEN = (
    select(AnnouncementRow.state, AnnouncementRow.attempt)
    .where(AnnouncementRow.task_id == bindparam("task_id"))
)


def count_in_flight(session: Session, nodes: Sequence[str]) -> dict[str, int]:
    """Tasks awarded and unfinished, per node (derived from announcement states, never leaked)."""
    if not nodes:
        return {}
    rows = core(session).execute(_IN_FLIGHT, {"nodes": list(nodes)}).all()
    return {str(node): int(n) for node, n in rows}


def in_flight_counts(settings: Settings, nodes: Sequence[str]) -> dict[str, int]:
    """``count_in_flight`` in a read session of its own."""
    with read_session(settings.database_url) as session:
        return count_in_flight(session, nodes)


def close_auction(settings: Settings, app: Celery, task_id: str, attempt: int,
                  closed_by: str, *, rfp: Announcement | None = None,
                  candidates: int | None = None) -> Award | None:
    """Award ``task_id``'s auction if it is still open; None when someone else already did.

    The bidder whose answer completed the auction passes the announcement it holds (``rfp``),
    which saves reading it back; the sweepers pass only the id.
    """
    if rfp is None or candidates is None:
        with read_session(settings.database_url) as session:
            row = session.execute(
                select(AnnouncementRow.state, AnnouncementRow.attempt, AnnouncementRow.spec,
                       AnnouncementRow.candidates)
                .where(AnnouncementRow.task_id == task_id)
            ).one_or_none()
        if row is None or row.state != lifecycle.BIDDING or row.attempt != attempt:
            return None
        rfp = Announcement.model_validate(row.spec)
        candidates = len(row.candidates)
    board = get_board(settings, app)
    # Kept past the window, so that an awarder that dies before committing leaves the answers
    # for the sweeper that closes the auction at its deadline.
    answers = board.close(task_id, attempt,
                          keep=max(0.0, rfp.announced_at + rfp.window - time.time()) + 60.0)
    award = award_answers(settings, rfp, answers, closed_by=closed_by, candidates=candidates,
                          write=board.writes_on_award)
    if award is not None:
        route_award(app, settings, rfp, award)
    return award


@dataclass(frozen=True)
class AnswersInside:
    """Answers made inside the award's transaction (proxy bids with a scoring strategy):
    ``make(session, counts)`` bids for ``nodes`` from the in-flight counts the award has just
    read under its lock, so one read of the bidders' state serves both their bids and the
    award, and nothing changes in between."""

    nodes: Sequence[str]
    make: Callable[[Session, dict[str, int]], Sequence[Bid | Refusal]]


def award_answers(
    settings: Settings,
    rfp: Announcement,
    answers: Sequence[Bid | Refusal] | AnswersInside,
    *,
    closed_by: str,
    candidates: int,
    write: bool,
    opening: Callable[[Session], None] | None = None,
) -> Award | None:
    """Decide ``rfp``'s auction on ``answers`` and commit the award (not routed yet); None when
    someone else closed it first or its row never appeared.

    ``write``: the answers are not in the store yet (a Redis board, or proxy bids); they are
    written, scored, in the award's transaction. ``opening`` writes the announcement itself in
    that same transaction (a new auction decided at once: proxy bids with a scoring strategy).
    """
    strategy = resolve_strategy(rfp.strategy)
    at_once = decides_at_once(strategy)
    if (opening is not None or isinstance(answers, AnswersInside)) and not at_once:
        raise ValueError(f"strategy {rfp.strategy} decides outside the award's "
                         "transaction: its announcement and answers must be stored first")
    if isinstance(answers, AnswersInside):
        bidders = sorted(set(answers.nodes))
    else:
        bidders = sorted(b.node for b in answers if isinstance(b, Bid))

    def make_award(given: Sequence[Bid | Refusal], counts: dict[str, int]) -> Award:
        bids, refusals = sorted_answers(given)
        award = decide(rfp, refresh_loads(bids, counts), refusals, strategy,
                       closed_by=closed_by, candidates=candidates)
        if award.outcome == "failed" and rfp.no_bid == "fallback":
            live = live_nodes(settings)
            node = fallback_node(live, in_flight_counts(settings, [n.name for n in live]))
            if node is not None:
                award = award.model_copy(update={"outcome": "fallback", "winner": node})
        return award

    result: Award | _Commit = _Commit.STALE
    # A scoring strategy decides in microseconds: decide under the lock, in one transaction.
    # A slow one (an LLM judge) always decides outside it; the commit re-checks the counts it
    # decided on, and on the last try only its winner's (never the judge under the lock).
    for attempt_no in range(1, RESERVATION_TRIES + 1):
        if not at_once and not isinstance(answers, AnswersInside):
            counts = in_flight_counts(settings, bidders)
            decided = make_award(answers, counts)
            checked = ([decided.winner] if decided.winner else []) \
                if attempt_no == RESERVATION_TRIES else bidders
            result = _commit_award(settings, rfp, checked, make_award, answers, write,
                                   (decided, counts), lock=bidders)
        else:
            result = _commit_award(settings, rfp, bidders, make_award, answers, write, None,
                                   opening)
        if result is _Commit.NOT_YET and _row_appears(settings, rfp.task_id):
            continue  # the caller's insert committed meanwhile: decide again
        if result is not _Commit.STALE:
            break
    if result is _Commit.NOT_YET:
        logger.warning("auction %s: no announcement in the store after %gs (the caller's "
                       "insert failed or is stuck); left to the deadline sweeper", rfp.task_id,
                       ROW_WAIT)
    return result if isinstance(result, Award) else None


def route_award(app: Celery, settings: Settings, rfp: Announcement, award: Award) -> None:
    """Act on a committed award: send the execution to the winner, or fail the caller's
    result with the reason there is none.

    The award is committed before the execution is sent, so a send that fails (the broker
    down past Celery's publish retries) must not lose the task: it is marked undelivered and a
    sweeper sends it again (``sweeper.resend``) once the broker is back.
    """
    if award.winner is not None:
        try:
            send_execution(app, rfp, award.winner, settings)
        except Exception as exc:
            mark_undelivered(settings, rfp, award.winner, exc)
            return
    else:
        fail_caller(app, rfp, NoBidsError(award.error or NO_VALID_BIDS))
    logger.info("auction %s closed by %s: %s %s", rfp.task_id, award.closed_by, award.outcome,
                award.winner or award.error)


def mark_undelivered(settings: Settings, rfp: Announcement, node: str, exc: BaseException,
                     now: float | None = None, retry_in: float = 0.0,
                     lease: float | None = None) -> bool:
    """Log that ``rfp``'s execution never reached ``node`` (SEND_FAILED) and make the task due
    in ``retry_in`` seconds, so that a sweep then sends it again (``sweeper.resend``). With a
    resender's ``lease``, only while it still holds it. False when the task moved on meanwhile
    or the store could not be written either (then the error is logged; the task's delivery
    check or schedule-to-start deadline, set with its award, still comes)."""
    now = time.time() if now is None else now
    error = f"{type(exc).__name__}: {exc}"
    logger.error("task %s: sending it to %s failed (%s); a sweeper will send it again",
                 rfp.task_id, exec_queue(node), error)
    try:
        with write_session(settings.database_url) as session:
            return transition(session, rfp.task_id, lifecycle.ASSIGNED,
                              kind=journal.SEND_FAILED, from_states=(lifecycle.ASSIGNED,),
                              expect_attempt=rfp.attempt, expect_node=node, due_by=lease,
                              message_node=node,
                              at=now, detail={"error": error, "queue": exec_queue(node),
                                              "retry_in_s": retry_in},
                              due_at=now + retry_in)
    except Exception:
        logger.exception("task %s: could not record the failed send either", rfp.task_id)
        return False


_EXPIRED = (
    select(AnnouncementRow.task_id, AnnouncementRow.attempt)
    .where(AnnouncementRow.state == lifecycle.BIDDING,
           AnnouncementRow.closes_at <= bindparam("now"))
    .order_by(AnnouncementRow.closes_at)
    .limit(bindparam("limit"))
)


_EXISTS = select(AnnouncementRow.task_id).where(AnnouncementRow.task_id == bindparam("task_id"))


def _row_appears(settings: Settings, task_id: str) -> bool:
    """Wait (reads only, no lock held) up to ``ROW_WAIT`` seconds for ``task_id``'s row: a new
    auction asks for bids before its row is committed, and its bids may all be in first."""
    deadline = time.monotonic() + ROW_WAIT
    # The insert usually commits within a few milliseconds: poll finely at first (a read costs
    # about 0.1 ms), then back off.
    pause = 0.0005
    while time.monotonic() < deadline:
        time.sleep(pause)
        with read_session(settings.database_url) as session:
            if session.execute(_EXISTS, {"task_id": task_id}).first() is not None:
                return True
        pause = min(pause * 1.3, 0.05)
    return False


def close_expired(settings: Settings, app: Celery, now: float | None = None,
                  limit: int = 100) -> int:
    """Close every open auction past its window (the deadline closer); returns how many."""
    now = time.time() if now is None else now
    with read_session(settings.database_url) as session:
        due = session.execute(_EXPIRED, {"now": now, "limit": limit}).all()
    closed = 0
    for task_id, attempt in due:
        try:
            if close_auction(settings, app, task_id, attempt, closed_by="deadline") is not None:
                closed += 1
        except Exception:  # the next sweep tries again; the others still close now
            logger.exception("closing auction %s at its deadline failed", task_id)
    return closed


class _Commit(Enum):
    #: Someone else closed the auction first.
    LOST = "lost"
    #: In-flight counts moved since the decision: decide again.
    STALE = "stale"
    #: The announcement's row is not in the store yet (bids are asked for before it is
    #: written): wait for it.
    NOT_YET = "not yet"


def _commit_award(
    settings: Settings,
    rfp: Announcement,
    bidders: Sequence[str],
    make_award: Callable[[Sequence[Bid | Refusal], dict[str, int]], Award],
    answers: Sequence[Bid | Refusal] | AnswersInside,
    write: bool,
    decided: tuple[Award, dict[str, int]] | None,
    opening: Callable[[Session], None] | None = None,
    lock: Sequence[str] | None = None,
) -> Award | _Commit:
    """Write the award if the auction is still open (compare-and-set on its state).

    The bidders' node rows are locked and their in-flight counts re-read first. An award
    ``decided`` outside on other counts is not written (STALE): another award reserved one of
    these nodes meanwhile. With ``decided=None`` the award is made here, under the lock, and
    answers made ``AnswersInside`` are made here too, from those counts. ``write``: the
    answers (from a board that keeps them outside the store, or proxy bids) are written here,
    scored. SQLite's BEGIN IMMEDIATE serializes this on its own; PostgreSQL needs the row
    locks. ``opening`` first writes the announcement (in state BIDDING) in this transaction.
    ``lock``: the nodes to lock and count, when ``decided`` is checked against fewer
    (``bidders``) than it was decided on.
    """
    with write_session(settings.database_url) as session:
        if opening is not None:
            opening(session)
        sqlite = is_sqlite(settings.database_url)
        locked = sorted(set(lock if lock is not None else bidders))
        if locked and not sqlite:
            # SQLite's BEGIN IMMEDIATE already serializes writers; PostgreSQL needs row locks.
            session.execute(select(Node.name).where(Node.name.in_(locked))
                            .order_by(Node.name).with_for_update())
        if opening is None:
            # (A row ``opening`` has just written is open, at this attempt.)
            current = core(session).execute(
                _OPEN if sqlite else _OPEN.with_for_update(), {"task_id": rfp.task_id}
            ).one_or_none()
            if current is None:
                return _Commit.NOT_YET  # announced, and its row not committed yet
            if current.state != lifecycle.BIDDING or current.attempt != rfp.attempt:
                return _Commit.LOST  # a duplicate closer: the auction is closed already
        now_counts = count_in_flight(session, locked)
        if isinstance(answers, AnswersInside):
            answers = answers.make(session, now_counts)
        if decided is None:
            award = make_award(answers, now_counts)
        else:
            award, seen = decided
            if any(now_counts.get(n, 0) != seen.get(n, 0) for n in bidders):
                return _Commit.STALE
        target = lifecycle.ASSIGNED if award.winner is not None else lifecycle.FAILED
        by_node = {s.node: s for s in award.scores}
        counted: dict[str, Any] = {}
        if write:
            # The answers enter the log and the bids table, scored, before their award.
            counted = {"bids_received": len(answers)}
            journal.write(session, [answer_message(a, late=False) for a in answers])
            # Stored as the award saw them: loads brought up to date with work awarded since.
            fresh = {b.node: b for b in refresh_loads(
                [a for a in answers if isinstance(a, Bid)], now_counts)}
            rows = [scored_values(fresh.get(a.node, a) if isinstance(a, Bid) else a,
                                  by_node, award.winner) for a in answers]
            losers = [r for r in rows if not r["is_winner"]]
            if losers:
                session.execute(_INSERT_BIDS, losers)
            for r in rows:
                if r["is_winner"]:
                    counted["winning_bid_id"] = session.execute(_INSERT_BID_ID, r).scalar_one()
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
            due_at=delivery_due(settings, rfp, award.awarded_at) if award.winner else None,
            **counted,
        ):
            return _Commit.LOST
        if write:
            return award
        winning_bid_id = None
        for row in session.scalars(select(BidRow).where(
                BidRow.task_id == rfp.task_id, BidRow.attempt == rfp.attempt,
                BidRow.late.is_(False))):
            for column, value in score_columns(row.node, row.will_bid, by_node,
                                               award.winner).items():
                setattr(row, column, value)
            if row.is_winner:
                winning_bid_id = row.id
        if winning_bid_id is not None:
            session.execute(update(AnnouncementRow)
                            .where(AnnouncementRow.task_id == rfp.task_id)
                            .values(winning_bid_id=winning_bid_id))
    return award


def score_columns(node: str, will_bid: bool, by_node: dict[str, Score],
                  winner: str | None) -> dict[str, Any]:
    """The bids-table columns the award sets: the strategy's score and whether it won."""
    columns: dict[str, Any] = {"is_winner": will_bid and node == winner}
    score = by_node.get(node)
    if score is not None:
        columns["score"] = score.total
        columns["breakdown"] = score.model_dump()
    return columns


def scored_values(answer: Bid | Refusal, by_node: dict[str, Score],
                  winner: str | None) -> dict[str, Any]:
    """The bids-table row of ``answer``, scored (for a board that keeps answers outside)."""
    return {**bid_values(answer),
            **score_columns(answer.node, isinstance(answer, Bid), by_node, winner)}


def delivery_due(settings: Settings, rfp: Announcement, at: float,
                 waited: float = 0.0) -> float | None:
    """When a sweeper next looks at a task awarded (or sent) at ``at`` and not started: its
    schedule-to-start deadline, or without one a delivery check ``bidding_delivery_check_seconds``
    later, or as long as it has ``waited`` already (so the checks of a task that waits in a
    long queue thin out)."""
    deadline = start_by(settings, rfp, at)
    if deadline is not None or settings.delivery_check_seconds <= 0:
        return deadline
    return at + max(settings.delivery_check_seconds, waited)


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
    # No ``expires`` for the deadline: Celery would revoke a late message without a word to the
    # store. BiddingTask checks the deadline as the attempt begins and fails the task, saying why.
    soft = hard = None
    if rfp.timeout_seconds:
        grace = settings.hard_timeout_grace if settings is not None else 5.0
        soft = rfp.timeout_seconds
        hard = rfp.timeout_seconds + max(grace, 0.1)
    # app.send_task minus its result bookkeeping: with a Redis result backend it subscribes this
    # process to the task's result channel and unsubscribes when the AsyncResult is collected,
    # two round trips (and a result message to drop later) for a process that never waits on
    # the result. The message, its headers, signals and the task-sent event are Celery's own.
    amqp = app.amqp
    message = amqp.create_task_message(
        rfp.task_id, rfp.task_name, rfp.args, rfp.kwargs, time_limit=hard, soft_time_limit=soft,
        create_sent_event=bool(app.conf.task_send_sent_event), reply_to=app.thread_oid,
        # Celery's own count, which self.retry() checks against max_retries.
        retries=rfp.attempt - 1, **message_options(rfp.canvas))
    queue = exec_queue(node)
    with app.producer_or_acquire() as producer:
        amqp.send_task_message(producer, rfp.task_name, message, queue=queue, routing_key=queue,
                               headers={ATTEMPT_HEADER: rfp.attempt, NODE_HEADER: node})
