"""Federation statistics from the store: seed 000's monitoring queries, and latency percentiles."""

from __future__ import annotations

import math
from collections.abc import Sequence

from pydantic import BaseModel
from sqlalchemy import Integer as _Int
from sqlalchemy import func, select

from bidding.lifecycle import states
from bidding.store import read_session
from bidding.store.schema import Announcement, BidRow, Message


class NodeStats(BaseModel):
    """One node's share of the work."""

    node: str
    bids: int
    wins: int
    succeeded: int
    failed: int
    avg_score: float | None


class Stats(BaseModel):
    """Totals since ``since`` (Unix time; 0 = ever)."""

    announced: int
    succeeded: int
    failed: int
    unfinished: int
    success_rate: float | None
    assignment_p50_ms: float | None
    assignment_p99_ms: float | None
    avg_bids_per_task: float | None
    nodes: list[NodeStats]

    def render(self) -> str:
        """Plain text for terminals: totals, assignment latency, one row per node."""
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f} ms"

        rate = "-" if self.success_rate is None else f"{self.success_rate:.1%}"
        lines = [
            f"tasks: {self.announced} announced, {self.succeeded} succeeded, "
            f"{self.failed} failed, {self.unfinished} unfinished; success rate {rate}",
            f"assignment latency: p50 {ms(self.assignment_p50_ms)}, "
            f"p99 {ms(self.assignment_p99_ms)}",
            f"{'node':<12} {'bids':>5} {'wins':>5} {'ok':>5} {'failed':>6} {'avg score':>9}",
        ]
        for n in self.nodes:
            avg = "-" if n.avg_score is None else f"{n.avg_score:.3f}"
            lines.append(f"{n.node:<12} {n.bids:>5} {n.wins:>5} {n.succeeded:>5} {n.failed:>6} "
                         f"{avg:>9}")
        return "\n".join(lines)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered) / 100)))
    return ordered[rank - 1]


def collect(database_url: str, since: float = 0.0) -> Stats:
    """Compute :class:`Stats` over the announcements made since ``since``."""
    with read_session(database_url) as session:
        rows = session.execute(
            select(Announcement.state, Announcement.assigned_node, Announcement.announced_at,
                   Announcement.awarded_at)
            .where(Announcement.announced_at >= since)
        ).all()
        awarded_details = session.scalars(
            select(Message.detail)
            .join(Announcement, Announcement.task_id == Message.task_id)
            .where(Announcement.announced_at >= since, Message.kind == "AWARDED")
        ).all()
        bid_rows = session.execute(
            select(BidRow.node, func.count(), func.avg(BidRow.score),
                   func.sum(func.cast(BidRow.is_winner, _Int)))
            .join(Announcement, Announcement.task_id == BidRow.task_id)
            .where(Announcement.announced_at >= since, BidRow.will_bid.is_(True))
            .group_by(BidRow.node)
        ).all()
    # Per auction (a retried task has several): the AWARDED message's latency_ms.
    latencies = [float(d["latency_ms"]) for d in awarded_details
                 if d and d.get("latency_ms") is not None]
    per_node: dict[str, dict[str, int]] = {}
    for state, node, _, _ in rows:
        if node is None:
            continue
        counts = per_node.setdefault(node, {"succeeded": 0, "failed": 0})
        if state == states.SUCCESS:
            counts["succeeded"] += 1
        elif state == states.FAILED:
            counts["failed"] += 1
    succeeded = sum(1 for r in rows if r[0] == states.SUCCESS)
    failed = sum(1 for r in rows if r[0] == states.FAILED)
    total_bids = sum(int(n) for _, n, _, _ in bid_rows)
    nodes = sorted({*per_node, *(str(b[0]) for b in bid_rows)})
    by_node = {str(b[0]): b for b in bid_rows}
    return Stats(
        announced=len(rows),
        succeeded=succeeded,
        failed=failed,
        unfinished=len(rows) - succeeded - failed,
        success_rate=succeeded / (succeeded + failed) if succeeded + failed else None,
        assignment_p50_ms=percentile(latencies, 50),
        assignment_p99_ms=percentile(latencies, 99),
        avg_bids_per_task=total_bids / len(rows) if rows else None,
        nodes=[
            NodeStats(
                node=n,
                bids=int(by_node[n][1]) if n in by_node else 0,
                wins=int(by_node[n][3] or 0) if n in by_node else 0,
                succeeded=per_node.get(n, {}).get("succeeded", 0),
                failed=per_node.get(n, {}).get("failed", 0),
                avg_score=float(by_node[n][2]) if n in by_node and by_node[n][2] is not None
                else None,
            )
            for n in nodes
        ],
    )
