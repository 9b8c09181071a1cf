"""The auctions that closed most recently, newest first, each with its bids, their scores,
the winner and why it won (``GET /aitp/auctions``, the dashboard's live list).

An auction is one attempt's: its close is the AWARDED or NO_AWARD message in the log, whose id
is the feed's cursor, so a reader asks for what closed after the last one it saw.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel
from sqlalchemy import func, select, tuple_

from bidding.lifecycle import journal
from bidding.observe.explain import BidView, bid_view
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
    """Auctions newest first, and the cursor to ask for the ones that close after them."""

    auctions: list[AuctionSummary]
    #: The id of the newest auction seen (``after`` when there was none): pass it as ``after``.
    cursor: int


def recent_auctions(database_url: str, limit: int = 20, after: int = 0) -> AuctionFeed:
    """The ``limit`` auctions (at most ``MAX_LIMIT``) that closed last, after cursor
    ``after``, newest first."""
    limit = max(1, min(limit, MAX_LIMIT))
    ensure_schema(database_url)
    with read_session(database_url) as session:
        closes = session.scalars(
            select(Message)
            .where(Message.kind.in_((journal.AWARDED, journal.NO_AWARD)), Message.id > after)
            .order_by(Message.id.desc()).limit(limit)).all()
        if not closes:
            return AuctionFeed(auctions=[], cursor=after)
        ids = {m.task_id for m in closes}
        tasks = {a.task_id: a for a in session.scalars(
            select(AnnouncementRow).where(AnnouncementRow.task_id.in_(ids)))}
        bids: dict[tuple[str, int], list[BidRow]] = defaultdict(list)
        for b in session.scalars(
                select(BidRow)
                .where(tuple_(BidRow.task_id, BidRow.attempt).in_(
                    [(m.task_id, m.attempt) for m in closes]))
                .order_by(BidRow.id)):
            bids[(b.task_id, b.attempt)].append(b)
        # Each attempt's auction starts at its own ANNOUNCED message (the row keeps the first).
        starts = {(t, a): float(at) for t, a, at in session.execute(
            select(Message.task_id, Message.attempt, func.max(Message.at))
            .where(Message.task_id.in_(ids), Message.kind == journal.ANNOUNCED)
            .group_by(Message.task_id, Message.attempt))}
        steps = {s.task_id: (s.graph_id, s.step_id) for s in session.execute(
            select(GraphStep.task_id, GraphStep.graph_id, GraphStep.step_id)
            .where(GraphStep.task_id.in_(ids)))}
        auctions = []
        for m in closes:
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
                                        else []))))
    return AuctionFeed(auctions=auctions, cursor=closes[0].id)
