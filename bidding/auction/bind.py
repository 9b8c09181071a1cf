"""Binding an award in the store: one transaction that locks the bidders' node rows,
re-counts their work in flight (the reservation), compare-and-sets the announcement's state (so a
duplicate closer does nothing), writes the scored bids with their messages, and moves the task to
ASSIGNED with the winner, or to FAILED with the no-bid outcome.

A commit that landed while its reply was lost with the connection (a failover, a severed
connection) is known by its award's time on the row: the award is returned as bound.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, cast

from sqlalchemy import Table, bindparam, select, update
from sqlalchemy.orm import Session

from bidding import clock
from bidding.auction.bid import NodeHistory
from bidding.auction.board import answer_message, bid_values
from bidding.auction.decision import refresh_loads
from bidding.auction.history import lock_states, read_rooms
from bidding.auction.placement import Room, placed
from bidding.config import Settings
from bidding.execution.dispatch import delivery_due
from bidding.lifecycle import journal, states
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import Announcement, Award, Bid, Refusal, Score
from bidding.store import read_session, write_session
from bidding.store.engine import core, is_sqlite
from bidding.store.outage import outlasting, retryable
from bidding.store.rows import insert_rows
from bidding.store.schema import AnnouncementRow, BidRow

logger = logging.getLogger(__name__)

#: Bid rows are written in one Core statement (no ORM unit of work on the award's path).
_BIDS = cast(Table, BidRow.__table__)
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
#: The same, locking the row (PostgreSQL); built once, as every statement on this path.
_OPEN_LOCKED = _OPEN.with_for_update()


@dataclass(frozen=True)
class AwardJob:
    """One award to bind in the store."""

    settings: Settings
    announcement: Announcement
    #: The nodes that bid (their rows are locked and their work counted).
    bidders: Sequence[str]
    #: The award on some answers and the bidders' work in flight (``award.decide_award``).
    decide: Callable[[Sequence[Bid | Refusal], dict[str, int], Mapping[str, Room] | None],
                     Award]
    #: The answers, made from the bidders' states read under the lock (answers in hand
    #: ignore them; proxy bids are made from them, ``award.AnswersInside``).
    answers: Callable[[Session, dict[str, NodeHistory]], Sequence[Bid | Refusal]]
    #: The answers are not in the store yet (a Redis board's, proxy bids): they are written,
    #: scored, with the award.
    write: bool
    #: When the answers were made (recent failures count back from it); None: now.
    made_at: float | None = None
    #: Writes the announcement's own row first, in this transaction (a new task decided at
    #: once: its row, bids and award together).
    opening: Callable[[Session], object] | None = None


@dataclass(frozen=True)
class Decided:
    """An award decided outside the transaction (a slow strategy), on ``counts``."""

    award: Award
    counts: dict[str, int]
    #: The nodes whose counts must still be the same when it binds (on the last try only its
    #: winner's: it binds as decided unless its winner moved).
    checked: Sequence[str]


class Unbound(Enum):
    """Why an award was not bound."""

    #: Someone else closed the auction first.
    LOST = "lost"
    #: In-flight counts moved since the decision: decide again.
    STALE = "stale"
    #: The announcement's row is not in the store yet (bids are asked for before it is
    #: written): wait for it.
    NOT_YET = "not yet"


def bind(job: AwardJob, decided: Decided | None = None) -> Award | Unbound:
    """Bind ``job``'s award if its auction is still open: decided here, under the lock (a
    scoring strategy), or ``decided`` outside (checked against the counts now)."""
    made: list[Award] = []
    try:
        return _bind_once(job, decided, made)
    except Exception as exc:
        url = job.settings.database_url
        if not made or not retryable(url, exc) or not _landed(job, made[0]):
            raise
        logger.warning("auction %s: the store's reply to its award was lost (%s); the award "
                       "is stored: going on", job.announcement.task_id, type(exc).__name__)
        return made[0]


_LANDED = select(AnnouncementRow.attempt, AnnouncementRow.awarded_at).where(
    AnnouncementRow.task_id == bindparam("task_id"))


def _landed(job: AwardJob, award: Award) -> bool:
    """Whether ``award`` is the one stored (its attempt and its time)."""
    announcement, url = job.announcement, job.settings.database_url

    def read() -> bool:
        with read_session(url) as session:
            found = session.execute(_LANDED, {"task_id": announcement.task_id}).one_or_none()
        return (found is not None and found.attempt == announcement.attempt
                and found.awarded_at == award.awarded_at)

    return outlasting(url, f"auction {announcement.task_id}: reading its award", read,
                      patience=CHECK_PATIENCE)


def _bind_once(job: AwardJob, decided: Decided | None, made: list[Award]) -> Award | Unbound:
    """``bind``'s transaction; the award it writes is put in ``made`` before the commit."""
    settings, announcement = job.settings, job.announcement
    with write_session(settings.database_url) as session:
        if job.opening is not None:
            job.opening(session)
        sqlite = is_sqlite(settings.database_url)
        # SQLite's BEGIN IMMEDIATE already serializes writers; PostgreSQL needs row locks.
        # The same statement reads what the bids and the award need of the nodes.
        now = clock.now() if job.made_at is None else job.made_at
        node_states = lock_states(session, sorted(set(job.bidders)), lock=not sqlite,
                                  task_type=announcement.task_type,
                                  since=now - settings.recent_failure_seconds)
        if job.opening is None:
            # (A row ``opening`` has just written is open, at this attempt.)
            current = core(session).execute(
                _OPEN if sqlite else _OPEN_LOCKED,
                {"task_id": announcement.task_id}).one_or_none()
            if current is None:
                return Unbound.NOT_YET  # announced, and its row not committed yet
            if current.state != states.BIDDING or current.attempt != announcement.attempt:
                return Unbound.LOST  # a duplicate closer: the auction is closed already
        now_counts = {name: state.in_flight for name, state in node_states.items()}
        answers = job.answers(session, node_states)
        if decided is None:
            # A task that needs resources or warm items is placed on what the nodes hold now,
            # read after the lock as their counts are.
            rooms = read_rooms(session, job.bidders) if placed(announcement) else None
            award = job.decide(answers, now_counts, rooms)
        else:
            award = decided.award
            if any(now_counts.get(n, 0) != decided.counts.get(n, 0) for n in decided.checked):
                return Unbound.STALE
        if not write_award(session, settings, announcement, answers, award, now_counts,
                           write=job.write):
            return Unbound.LOST
        made.append(award)
    return award


_EXISTS = select(AnnouncementRow.task_id).where(AnnouncementRow.task_id == bindparam("task_id"))


def row_appears(settings: Settings, task_id: str) -> bool:
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


def write_award(session: Session, settings: Settings, announcement: Announcement,
                answers: Sequence[Bid | Refusal], award: Award, now_counts: dict[str, int],
                *, write: bool) -> bool:
    """Write ``award`` of ``announcement``'s open auction in ``session``: the scored answers (when
    ``write``: they are not in the store yet) with their messages, and the compare-and-set of
    the announcement to ASSIGNED or FAILED with its AWARDED or NO_AWARD message. False when
    the auction was not open at ``announcement``'s attempt (someone else closed it)."""
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
        for bid_id, is_winner in insert_rows(session, _BIDS, rows,
                                             returning=("id", "is_winner")):
            if is_winner:
                counted["winning_bid_id"] = bid_id
    winner_score = by_node[award.winner].total if award.winner in by_node else None
    # The task's estimated cost is the winning bid's (AITP ``estimated_cost``); the answers
    # decided on are in hand whether or not the board wrote them already.
    won = next((a for a in answers if isinstance(a, Bid) and a.node == award.winner), None)
    if award.winner is not None:
        kind = journal.AWARDED
        detail = {"outcome": award.outcome, "strategy": award.strategy,
                  "score": winner_score, "closed_by": award.closed_by,
                  "latency_ms": round((award.awarded_at - announcement.announced_at) * 1000, 3)}
    else:
        kind = journal.NO_AWARD
        detail = {"error": award.error, "closed_by": award.closed_by}
    if not transition(session, announcement.task_id, target,
                      Log(kind, node=award.winner, detail=detail, at=award.awarded_at),
                      Expect(states=(states.BIDDING,), attempt=announcement.attempt),
                      assigned_node=award.winner, awarded_at=award.awarded_at,
                      winning_score=winner_score, outcome=award.outcome,
                      closed_by=award.closed_by, error=award.error,
                      finished_at=None if award.winner else award.awarded_at,
                      due_at=(delivery_due(settings, announcement, award.awarded_at) if award.winner
                              else None),
                      estimated_cost=won.estimated_cost if won is not None else None,
                      **counted):
        return False
    if write:
        return True
    winning_bid_id = None
    decided_on = {a.node for a in answers}
    for row in session.scalars(select(BidRow).where(
            BidRow.task_id == announcement.task_id, BidRow.attempt == announcement.attempt,
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
                        .where(AnnouncementRow.task_id == announcement.task_id)
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


