"""Committing an award: the decision (``decision.decide``) applied to the store in one
transaction, and routed to the winner (or the caller's result failed with the reason).

The transaction locks the bidders' node rows, re-counts their in-flight work (so concurrent
auctions spread), compare-and-sets the announcement's state (so a duplicate closer does
nothing), writes the scored bids with their messages, and moves the task to ASSIGNED with the
winner, or to FAILED with the no-bid outcome.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, cast

from celery import Celery
from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session

from bidding import clock
from bidding.auction.bid import NodeHistory
from bidding.auction.board import answer_message, bid_values, sorted_answers
from bidding.auction.decision import (
    NO_VALID_BIDS,
    decide,
    fallback_node,
    fallback_pool,
    refresh_loads,
)
from bidding.auction.history import in_flight_counts, lock_states
from bidding.config import Settings
from bidding.errors import ConfigurationError, NoBidsError
from bidding.execution.dispatch import delivery_due, mark_undelivered, send_execution
from bidding.execution.report import fail_caller
from bidding.lifecycle import events, journal, states
from bidding.lifecycle.transition import transition
from bidding.models import Announcement, Award, Bid, Refusal, Score
from bidding.nodes.profile import exec_queue
from bidding.nodes.registry import live_nodes
from bidding.store import read_session, write_session
from bidding.store.engine import core, is_sqlite
from bidding.store.outage import outlasting, retryable
from bidding.store.rows import insert_rows
from bidding.store.schema import Announcement as AnnouncementRow
from bidding.store.schema import BidRow
from bidding.strategies.protocol import NodeCapability, SelectionStrategy, decides_at_once
from bidding.strategies.resolver import resolve_strategy

logger = logging.getLogger(__name__)


#: Bid rows are written in one Core statement (no ORM unit of work on the award's path).
_BIDS = cast(Table, BidRow.__table__)

#: Decisions re-made when concurrent awards reserve the same nodes; the last one commits as is.
RESERVATION_TRIES = 3
#: Seconds an award waits for the announcement's row (bids may complete before the caller's
#: insert commits; SQLite's writers wait up to 30 s for the lock).
ROW_WAIT = 30.0
#: Seconds an awarder waits for the store to tell whether its award's commit landed, when the
#: reply to it was lost.
CHECK_PATIENCE = 15.0


_OPEN = (
    select(AnnouncementRow.state, AnnouncementRow.attempt)
    .where(AnnouncementRow.task_id == bindparam("task_id"))
)


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

    def select(self, bids: Sequence[Bid], rfp: Announcement,
               capabilities: Mapping[str, NodeCapability]) -> Bid | None:
        """No winner: the strategy was refused."""
        return None


def strategy_of(settings: Settings, rfp: Announcement) -> SelectionStrategy:
    """``rfp``'s strategy as this process may run it: a built-in or registered name, or a
    dotted path in its ``bidding_allowed_strategies``; else a ``RefusedStrategy``, logged."""
    try:
        return resolve_strategy(rfp.strategy, settings.strategy_allowlist)
    except ConfigurationError as exc:
        logger.error("auction %s: strategy refused: %s", rfp.task_id, exc)
        return RefusedStrategy(rfp.strategy, f"refused here: {exc}")


def award_answers(
    settings: Settings,
    rfp: Announcement,
    answers: Sequence[Bid | Refusal] | AnswersInside,
    *,
    closed_by: str,
    candidates: int,
    write: bool,
    opening: Callable[[Session], object] | None = None,
) -> Award | None:
    """Decide ``rfp``'s auction on ``answers`` and commit the award (not routed yet); None when
    someone else closed it first or its row never appeared.

    ``write``: the answers are not in the store yet (a Redis board, or proxy bids); they are
    written, scored, in the award's transaction. ``opening`` writes the announcement itself in
    that same transaction (a new auction decided at once: proxy bids with a scoring strategy).
    """
    strategy = strategy_of(settings, rfp)
    at_once = decides_at_once(strategy)
    if (opening is not None or isinstance(answers, AnswersInside)) and not at_once:
        raise ValueError(f"strategy {rfp.strategy} decides outside the award's "
                         "transaction: its announcement and answers must be stored first")
    if isinstance(answers, AnswersInside):
        bidders = sorted(set(answers.nodes))
    else:
        bidders = sorted(b.node for b in answers if isinstance(b, Bid))

    def make_award(given: Sequence[Bid | Refusal], counts: dict[str, int]) -> Award:
        return decide_award(settings, rfp, strategy, given, counts, closed_by=closed_by,
                            candidates=candidates)

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


def decide_award(settings: Settings, rfp: Announcement, strategy: SelectionStrategy,
                 answers: Sequence[Bid | Refusal], counts: dict[str, int], *,
                 closed_by: str, candidates: int,
                 extra_load: Mapping[str, int] | None = None) -> Award:
    """The award of ``rfp`` on ``answers`` with the bidders' in-flight ``counts``: the
    strategy's pick among the eligible bids, or the no-bid outcome (a fallback node when the
    task's ``no_bid`` says so). ``extra_load``: awards not in the store yet, by node (the
    write-behind journal's reservations), counted for a fallback's choice too."""
    bids, refusals = sorted_answers(answers)
    award = decide(rfp, refresh_loads(bids, counts), refusals, strategy,
                   closed_by=closed_by, candidates=candidates)
    if award.outcome == "failed" and rfp.no_bid == "fallback":
        pool = (fallback_pool(rfp, live_nodes(settings))
                # never "none to fall back to" from a cached list: read it again first
                or fallback_pool(rfp, live_nodes(settings, fresh=True)))
        loads = in_flight_counts(settings, [n.name for n in pool])
        for name, extra in (extra_load or {}).items():
            if name in loads:
                loads[name] += extra
        node = fallback_node(pool, loads)
        if node is not None:
            award = award.model_copy(update={"outcome": "fallback", "winner": node})
        else:
            skills = ", ".join(rfp.required_skills) or "any skill"
            award = award.model_copy(update={"error": (
                f"{award.error}; no live node with {skills} to fall back to")})
    return award


def route_award(app: Celery, settings: Settings, rfp: Announcement, award: Award) -> None:
    """Act on a committed award: send the execution to the winner, or fail the caller's
    result with the reason there is none.

    The award is committed before the execution is sent, so a send that fails (the broker
    down past Celery's publish retries) must not lose the task: it is marked undelivered and a
    sweeper sends it again (``sweeper.resend``) once the broker is back.
    """
    if award.winner is not None:
        # Before the execution, so that Flower has it before the winner's own events.
        events.awarded(app, rfp, award.winner, exec_queue(award.winner),
                       outcome=award.outcome)
        try:
            send_execution(app, rfp, award.winner, settings)
        except Exception as exc:
            mark_undelivered(settings, rfp, award.winner, exc)
            return
    else:
        fail_caller(app, settings, rfp, NoBidsError(award.error or NO_VALID_BIDS))
    logger.info("auction %s closed by %s: %s %s", rfp.task_id, award.closed_by, award.outcome,
                award.winner or award.error)


_AWARDED = select(
    AnnouncementRow.state, AnnouncementRow.attempt, AnnouncementRow.assigned_node,
    AnnouncementRow.outcome, AnnouncementRow.strategy, AnnouncementRow.closed_by,
    AnnouncementRow.error, AnnouncementRow.awarded_at,
).where(AnnouncementRow.task_id == bindparam("task_id"))


def stored_award(settings: Settings, task_id: str) -> Award | None:
    """``task_id``'s award as the store holds it, while it is still to be routed (ASSIGNED to
    its winner, or FAILED by an award without one); None when there is none, or the task has
    moved on (started, or failed by something other than its award)."""
    with read_session(settings.database_url) as session:
        row = session.execute(_AWARDED, {"task_id": task_id}).one_or_none()
    if row is None or row.outcome not in ("awarded", "fallback", "failed"):
        return None
    if not ((row.state == states.ASSIGNED and row.assigned_node)
            or (row.state == states.FAILED and row.assigned_node is None
                and row.outcome == "failed")):
        return None
    return Award(task_id=task_id, attempt=row.attempt, outcome=row.outcome,
                 winner=row.assigned_node, strategy=row.strategy, closed_by=row.closed_by or "",
                 error=row.error, awarded_at=row.awarded_at or clock.now())


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
    opening: Callable[[Session], object] | None = None,
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

    A commit that landed while its reply was lost with the connection (a failover, a severed
    connection) is known by its award's time on the row, and the award returned as made: the
    caller must route it, not announce the task again (its insert would find the row).
    """
    made: list[Award] = []
    try:
        return _write_award_once(settings, rfp, bidders, make_award, answers, write, decided,
                                 opening, lock, made)
    except Exception as exc:
        if not made or not retryable(settings.database_url, exc) \
                or not _award_landed(settings, rfp, made[0]):
            raise
        logger.warning("auction %s: the store's reply to its award was lost (%s); the award "
                       "is stored: going on", rfp.task_id, type(exc).__name__)
        return made[0]


_LANDED = select(AnnouncementRow.attempt, AnnouncementRow.awarded_at).where(
    AnnouncementRow.task_id == bindparam("task_id"))


def _award_landed(settings: Settings, rfp: Announcement, award: Award) -> bool:
    """Whether ``award`` of ``rfp`` is the one stored (its attempt and its time)."""
    def read() -> bool:
        with read_session(settings.database_url) as session:
            found = session.execute(_LANDED, {"task_id": rfp.task_id}).one_or_none()
        return (found is not None and found.attempt == rfp.attempt
                and found.awarded_at == award.awarded_at)
    return outlasting(settings.database_url, f"auction {rfp.task_id}: reading its award",
                      read, patience=CHECK_PATIENCE)


def _write_award_once(
    settings: Settings,
    rfp: Announcement,
    bidders: Sequence[str],
    make_award: Callable[[Sequence[Bid | Refusal], dict[str, int]], Award],
    answers: Sequence[Bid | Refusal] | AnswersInside,
    write: bool,
    decided: tuple[Award, dict[str, int]] | None,
    opening: Callable[[Session], object] | None,
    lock: Sequence[str] | None,
    made: list[Award],
) -> Award | _Commit:
    """``_commit_award``'s transaction; the award it writes is put in ``made`` before the
    commit (so that a commit whose reply was lost can be checked)."""
    with write_session(settings.database_url) as session:
        if opening is not None:
            opening(session)
        sqlite = is_sqlite(settings.database_url)
        locked = sorted(set(lock if lock is not None else bidders))
        # SQLite's BEGIN IMMEDIATE already serializes writers; PostgreSQL needs row locks.
        # The same statement reads what the bids and the award need of the nodes.
        now = answers.now if isinstance(answers, AnswersInside) else clock.now()
        node_states = lock_states(session, locked, lock=not sqlite, task_type=rfp.task_type,
                                  since=now - settings.recent_failure_seconds)
        if opening is None:
            # (A row ``opening`` has just written is open, at this attempt.)
            current = core(session).execute(
                _OPEN if sqlite else _OPEN.with_for_update(), {"task_id": rfp.task_id}
            ).one_or_none()
            if current is None:
                return _Commit.NOT_YET  # announced, and its row not committed yet
            if current.state != states.BIDDING or current.attempt != rfp.attempt:
                return _Commit.LOST  # a duplicate closer: the auction is closed already
        now_counts = {name: state.in_flight for name, state in node_states.items()}
        if isinstance(answers, AnswersInside):
            answers = answers.make(session, node_states)
        if decided is None:
            award = make_award(answers, now_counts)
        else:
            award, seen = decided
            if any(now_counts.get(n, 0) != seen.get(n, 0) for n in bidders):
                return _Commit.STALE
        if not write_award(session, settings, rfp, answers, award, now_counts, write=write):
            return _Commit.LOST
        made.append(award)
    return award


def write_award(session: Session, settings: Settings, rfp: Announcement,
                answers: Sequence[Bid | Refusal], award: Award, now_counts: dict[str, int],
                *, write: bool) -> bool:
    """Write ``award`` of ``rfp``'s open auction in ``session``: the scored answers (when
    ``write``: they are not in the store yet) with their messages, and the compare-and-set of
    the announcement to ASSIGNED or FAILED with its AWARDED or NO_AWARD message. False when
    the auction was not open at ``rfp``'s attempt (someone else closed it)."""
    target = states.ASSIGNED if award.winner is not None else states.FAILED
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
        for inserted in insert_rows(session, _BIDS, rows, returning=("id", "is_winner")):
            if inserted.is_winner:
                counted["winning_bid_id"] = inserted.id
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
        session, rfp.task_id, target, kind=kind, from_states=(states.BIDDING,),
        expect_attempt=rfp.attempt, message_node=award.winner, at=award.awarded_at,
        detail=detail,
        assigned_node=award.winner, awarded_at=award.awarded_at,
        winning_score=winner_score, outcome=award.outcome, closed_by=award.closed_by,
        error=award.error, finished_at=None if award.winner else award.awarded_at,
        due_at=delivery_due(settings, rfp, award.awarded_at) if award.winner else None,
        **counted,
    ):
        return False
    if write:
        return True
    winning_bid_id = None
    decided_on = {a.node for a in answers}
    for row in session.scalars(select(BidRow).where(
            BidRow.task_id == rfp.task_id, BidRow.attempt == rfp.attempt,
            BidRow.late.is_(False))):
        if row.node not in decided_on:
            # Posted after the close read the board and before this transaction: the
            # decision never saw it, so it is late, and can be no watchdog's next-best.
            row.late = True
            continue
        for column, value in score_columns(row.node, row.will_bid, by_node,
                                           award.winner).items():
            setattr(row, column, value)
        if row.is_winner:
            winning_bid_id = row.id
    if winning_bid_id is not None:
        session.execute(update(AnnouncementRow)
                        .where(AnnouncementRow.task_id == rfp.task_id)
                        .values(winning_bid_id=winning_bid_id))
    return True


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


