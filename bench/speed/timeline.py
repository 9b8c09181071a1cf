"""An auction's phases, from the caller's clock and the store's timestamps (same machine)."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from bench.common.stats import percentile, summary

#: Ids per query: one IN list of every id of a burst could pass the database's limit on bound
#: parameters.
CHUNK = 400


def _store_rows(database_url: str, ids: list[str]) -> tuple[
        dict[str, tuple[float, float | None, str | None, str | None, int]],
        dict[str, tuple[float, float, int]], defaultdict[str, dict[str, float]]]:
    """Per task: (announced, awarded, closed by, winner, candidates); (first bid, last bid,
    bids); {message kind: first time} of TASK_ACCEPTED and TASK_COMPLETED."""
    from sqlalchemy import func, select

    from bidding.store import read_session
    from bidding.store.schema import AnnouncementRow, BidRow, Message

    rows: dict[str, tuple[float, float | None, str | None, str | None, int]] = {}
    bids: dict[str, tuple[float, float, int]] = {}
    msgs: defaultdict[str, dict[str, float]] = defaultdict(dict)
    with read_session(database_url) as session:
        for chunk in range(0, len(ids), CHUNK):
            part = ids[chunk:chunk + CHUNK]
            for a in session.scalars(select(AnnouncementRow)
                                     .where(AnnouncementRow.task_id.in_(part))):
                rows[a.task_id] = (a.announced_at, a.awarded_at, a.closed_by,
                                   a.assigned_node, len(a.candidates or []))
            for tid, lo, hi, n in session.execute(
                    select(BidRow.task_id, func.min(BidRow.bid_at), func.max(BidRow.bid_at),
                           func.count()).where(BidRow.task_id.in_(part))
                    .group_by(BidRow.task_id)):
                bids[tid] = (lo, hi, n)
            for tid, kind, at in session.execute(
                    select(Message.task_id, Message.kind, Message.at)
                    .where(Message.task_id.in_(part),
                           Message.kind.in_(("TASK_ACCEPTED", "TASK_COMPLETED")))):
                msgs[tid].setdefault(kind, at)
    return rows, bids, msgs


def timeline(database_url: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """Join the caller's timestamps with the store's (announced, bids, award, execution)."""
    rows, bids, msgs = _store_rows(database_url, [r["id"] for r in records])
    phases: dict[str, list[float]] = defaultdict(list)
    assign: list[float] = []
    closed_by: Counter[str] = Counter()
    winners: Counter[str | None] = Counter()
    candidates: list[int] = []
    for r in records:
        row = rows.get(r["id"])
        if row is None:
            continue
        announced, awarded, closed, winner, ncand = row
        if awarded is None:
            continue
        candidates.append(ncand)
        closed_by[closed or "?"] += 1
        winners[winner] += 1
        assign.append((awarded - r["wall"]) * 1000)
        done = r["wall"] + r["e2e_ms"] / 1000
        phases["delay() returns"].append(r["delay_ms"])
        if r["id"] in bids:
            lo, hi, _ = bids[r["id"]]
            phases["announced -> first bid made"].append((lo - announced) * 1000)
            phases["announced -> last bid made"].append((hi - announced) * 1000)
            phases["last bid made -> awarded"].append((awarded - hi) * 1000)
        accepted = msgs[r["id"]].get("TASK_ACCEPTED")
        completed = msgs[r["id"]].get("TASK_COMPLETED")
        if accepted is not None:
            phases["awarded -> accepted on node"].append((accepted - awarded) * 1000)
        if accepted is not None and completed is not None:
            phases["accepted -> completed"].append((completed - accepted) * 1000)
        if completed is not None:
            phases["completed -> result at caller"].append((done - completed) * 1000)
    return {
        "assign": summary(assign),
        "phases_p50": {k: percentile(v, 50) for k, v in phases.items()},
        "closed_by": dict(closed_by),
        "winners": len(winners),
        "max_wins": max(winners.values()) if winners else 0,
        "candidates": percentile(candidates, 50),
    }
