"""How contested the demo's auctions were, from the store: how many had two or more bids, and
by how much the winner led the runner-up. The demo prints it under its summary, and its test
counts the same rows."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

from sqlalchemy import select

from bidding.lifecycle import journal
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow, BidRow, Message

#: Scores closer than this are a tie (the strategies' own epsilon).
TIE = 1e-9


@dataclass
class ContestSummary:
    """The auctions (one per attempt of a task) of a window, by how many bids they had."""

    tasks: int = 0
    #: Auction -> its bids (answers that offered to do the task, in time), for each auction
    #: that closed with an award or without one.
    bids: dict[tuple[str, int], int] = field(default_factory=dict)
    #: Contested auctions with a winner: the winner's score minus the best other eligible bid's.
    margins: dict[tuple[str, int], float] = field(default_factory=dict)

    @property
    def contested(self) -> int:
        """Auctions with two or more bids."""
        return sum(1 for n in self.bids.values() if n >= 2)

    @property
    def widest(self) -> str | None:
        """The task whose auction the winner led by the most (None without one)."""
        if not self.margins:
            return None
        return max(self.margins.items(), key=lambda kv: kv[1])[0][0]

    def render(self) -> str:
        """Two lines: auctions by bids, and the winners' lead in the contested ones."""
        one = sum(1 for n in self.bids.values() if n == 1)
        none = sum(1 for n in self.bids.values() if n == 0)
        lines = [f"auctions: {len(self.bids)} for {self.tasks} tasks (each retry is an auction "
                 f"of its own): {self.contested} with two or more bids, {one} with one, "
                 f"{none} with none"]
        if self.margins:
            leads = list(self.margins.values())
            ties = sum(1 for m in leads if m <= TIE)
            lines.append(
                f"the winner's lead over the runner-up in the {len(leads)} contested awards: "
                f"median {statistics.median(leads):.3f}, widest {max(leads):.3f}; {ties} "
                "tie(s), which go to the least busy node")
        return "\n".join(lines)


def contest_summary(database_url: str, since: float) -> ContestSummary:
    """The auctions of the tasks announced since ``since`` (Unix time), from the store."""
    with read_session(database_url) as session:
        tasks = list(session.scalars(
            select(AnnouncementRow.task_id).where(AnnouncementRow.announced_at >= since)))
        closed = session.execute(
            select(Message.task_id, Message.attempt)
            .join(AnnouncementRow, AnnouncementRow.task_id == Message.task_id)
            .where(AnnouncementRow.announced_at >= since,
                   Message.kind.in_((journal.AWARDED, journal.NO_AWARD)))
        ).all()
        rows = session.execute(
            select(BidRow.task_id, BidRow.attempt, BidRow.score, BidRow.is_winner,
                   BidRow.breakdown)
            .join(AnnouncementRow, AnnouncementRow.task_id == BidRow.task_id)
            .where(AnnouncementRow.announced_at >= since, BidRow.will_bid.is_(True),
                   BidRow.late.is_(False))
        ).all()
    summary = ContestSummary(tasks=len(tasks), bids={(t, a): 0 for t, a in closed})
    winners: dict[tuple[str, int], float] = {}
    others: dict[tuple[str, int], list[float]] = defaultdict(list)
    for task_id, attempt, score, is_winner, breakdown in rows:
        key = (task_id, attempt)
        if key not in summary.bids:
            continue
        summary.bids[key] += 1
        if score is None:
            continue
        if is_winner:
            winners[key] = score
        elif (breakdown or {}).get("eligible", True):
            others[key].append(score)
    summary.margins = {key: score - max(others[key]) for key, score in winners.items()
                       if others.get(key)}
    return summary
