"""The auctions that closed, newest first, each with its bids, their scores, the winner and
why it won (``GET /aitp/auctions``, the dashboard's list and its history).

An auction is one attempt's: its close is the AWARDED or NO_AWARD message in the log, whose id
is the feed's cursor both ways: a reader asks for what closed after the newest one it saw
(``after``), or pages back through every auction in the store, older than the oldest one it
saw (``before``), filtered (``observe.history``).
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel
from sqlalchemy import func, select, tuple_
from sqlalchemy.orm import Session

from bidding.lifecycle import journal
from bidding.observe.attempts import attempt_history
from bidding.observe.explain import BidView, bid_view
from bidding.observe.history import AuctionFilter, closes
from bidding.observe.why import why_won
from bidding.store import ensure_schema, read_session
from bidding.store.schema import AnnouncementRow, BidRow, GraphStep, Message

#: The most auctions one read returns.
MAX_LIMIT = 200


class AuctionSummary(BaseModel):
    """One closed auction: what was announced, every answer, the outcome."""

    #: The id of the message that closed it (AWARDED or NO_AWARD): the feed's cursor.
    id: int
    task_id: str
    task_name: str
    task_type: str
    attempt: int
    strategy: str
    #: The task's state now (SUCCESS, FAILED, EXECUTING...), not at the close.
    state: str
    closed_at: float
    #: What closed it: "all bids in", "deadline", "proxy bids", "no candidates".
    closed_by: str | None
    #: "awarded", "fallback" or "failed".
    outcome: str
    winner: str | None
    winning_score: float | None
    #: Milliseconds from the announcement to the award (seed 000's assignment latency).
    assignment_ms: float | None
    error: str | None
    #: The task graph and subtask it belongs to, when it is a subtask of one.
    graph_id: str | None = None
    step_id: str | None = None
    #: Every answer of this attempt, as ``bidding explain`` shows them.
    bids: list[BidView]
    #: Why the winner won, and why each other candidate did not (``observe.why``).
    why: list[str]


class AuctionFeed(BaseModel):
    """Auctions newest first, and the cursors to ask for newer and older ones."""

    auctions: list[AuctionSummary]
    #: The id of the newest auction seen (``after`` when there was none): pass it as ``after``.
    cursor: int
    #: The id of the oldest auction of this page when older ones match: pass it as
    #: ``before`` (with the same filters) for the next page back; None on the last page.
    older: int | None = None


def recent_auctions(database_url: str, limit: int = 20, after: int = 0,
                    before: int | None = None,
                    where: AuctionFilter | None = None) -> AuctionFeed:
    """The ``limit`` auctions (at most ``MAX_LIMIT``) that closed last, after cursor
    ``after`` and before cursor ``before``, that match ``where``, newest first."""
    limit = max(1, min(limit, MAX_LIMIT))
    ensure_schema(database_url)
    with read_session(database_url) as session:
        closed, older = closes(session, where or AuctionFilter(), limit, after, before)
        if not closed:
            return AuctionFeed(auctions=[], cursor=after)
        ids = {m.task_id for m in closed}
        tasks = {a.task_id: a for a in session.scalars(
            select(AnnouncementRow).where(AnnouncementRow.task_id.in_(ids)))}
        bids: dict[tuple[str, int], list[BidRow]] = defaultdict(list)
        for b in session.scalars(
                select(BidRow)
                .where(tuple_(BidRow.task_id, BidRow.attempt).in_(
                    [(m.task_id, m.attempt) for m in closed]))
                .order_by(BidRow.id)):
            bids[(b.task_id, b.attempt)].append(b)
        # Each attempt's auction starts at its own ANNOUNCED message (the row keeps the first).
        starts = {(t, a): float(at) for t, a, at in session.execute(
            select(Message.task_id, Message.attempt, func.max(Message.at))
            .where(Message.task_id.in_(ids), Message.kind == journal.ANNOUNCED)
            .group_by(Message.task_id, Message.attempt))}
        excluded = _exclusions(session, {m.task_id for m in closed if m.attempt > 1})
        steps = {s.task_id: (s.graph_id, s.step_id) for s in session.execute(
            select(GraphStep.task_id, GraphStep.graph_id, GraphStep.step_id)
            .where(GraphStep.task_id.in_(ids)))}
        auctions = []
        for m in closed:
            task = tasks.get(m.task_id)
            if task is None:
                continue  # its announcement was deleted; the log outlived it
            detail = dict(m.detail or {})
            awarded = m.kind == journal.AWARDED
            latency = detail.get("latency_ms") if awarded else None
            started = starts.get((m.task_id, m.attempt), task.announced_at)
            views = [bid_view(b, started) for b in bids[(m.task_id, m.attempt)]]
            winner = m.node if awarded else None
            outcome = str(detail.get("outcome") or ("awarded" if awarded else "failed"))
            graph_id, step_id = steps.get(m.task_id, (None, None))
            auctions.append(AuctionSummary(
                id=m.id, task_id=m.task_id, task_name=task.task_name, task_type=task.task_type,
                attempt=m.attempt, strategy=str(detail.get("strategy") or task.strategy),
                state=task.state, closed_at=m.at, closed_by=detail.get("closed_by"),
                outcome=outcome, winner=winner, winning_score=detail.get("score"),
                assignment_ms=None if latency is None else float(latency),
                error=detail.get("error"), graph_id=graph_id, step_id=step_id, bids=views,
                why=why_won(views, winner=winner, outcome=outcome, error=detail.get("error"),
                            candidates=(list(task.candidates) if m.attempt == task.attempt
                                        else []),
                            excluded=excluded.get((m.task_id, m.attempt)))))
    return AuctionFeed(auctions=auctions, cursor=closed[0].id, older=older)


def _exclusions(session: Session, task_ids: set[str]) -> dict[tuple[str, int], dict[str, str]]:
    """The nodes each retry's auction of ``task_ids`` left out, with why (as ``explain``
    says it), by (task, attempt): from the tasks' message logs."""
    if not task_ids:
        return {}
    logs: dict[str, list[Message]] = defaultdict(list)
    for m in session.scalars(select(Message).where(Message.task_id.in_(task_ids))
                             .order_by(Message.id)):
        logs[m.task_id].append(m)
    return {(task_id, a.attempt): a.excluded for task_id, log in logs.items()
            for a in attempt_history(log) if a.excluded}
