"""Federation statistics from the store: seed 000's monitoring queries, latency percentiles,
success per task type, escalations, and the protocol checker's verdict."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, select

from bidding import clock
from bidding.auction import decision
from bidding.lifecycle import journal, states
from bidding.observe.logcheck import check_log
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow, BidRow, Message


class NodeStats(BaseModel):
    """One node's share of the work: ``wins = succeeded + failed + retried + unfinished``."""

    node: str
    #: Bids it made (refusals not counted).
    bids: int
    #: Attempts awarded to it (a task retried or moved to it wins again).
    wins: int
    #: Tasks that ended there: in SUCCESS, in FAILED.
    succeeded: int
    failed: int
    #: Attempts it won that did not end the task there: the attempt failed (or was lost with its
    #: worker) and the task was announced again, or the task was moved to another bidder.
    retried: int = 0
    #: Tasks it won that have not ended yet.
    unfinished: int = 0
    avg_score: float | None


class TypeStats(BaseModel):
    """The tasks of one task type: how they ended."""

    task_type: str
    announced: int
    succeeded: int
    failed: int
    #: Not ended yet (ESCALATED counts here: an operator's to decide).
    unfinished: int
    success_rate: float | None


class ProtocolStats(BaseModel):
    """The protocol checker's verdict over the tasks of the window (``bidding check`` lists
    the violations)."""

    tasks_checked: int
    violations: int
    tasks_with_violations: int
    #: Violations per rule (docs/architecture.md, "The protocol checker").
    by_rule: dict[str, int] = {}


class Stats(BaseModel):
    """Totals since ``since`` (Unix time; 0 = ever)."""

    announced: int
    succeeded: int
    failed: int
    #: Failed tasks whose last auction found no node (no bidders, no valid bid): they are in
    #: no node's "failed" count.
    failed_without_node: int = 0
    #: Those tasks by their auction's outcome, in seed 001's words ("No bidders registered":
    #: no live node has a required skill; "No bids met minimum confidence": nodes bid, none
    #: confidently enough), so that a task with a bid is not counted as finding no node.
    no_award: dict[str, int] = {}
    unfinished: int
    success_rate: float | None
    assignment_p50_ms: float | None
    assignment_p99_ms: float | None
    avg_bids_per_task: float | None
    nodes: list[NodeStats]
    #: Per task type, by type name.
    task_types: list[TypeStats] = []
    #: ESCALATED messages: tasks handed to a human (deferred too often; a final state).
    escalated: int = 0
    #: The window: the tasks announced since then (Unix time; 0 = ever).
    since: float = 0.0
    #: WATCH_ESCALATED messages: silent tasks the monitor flagged (they keep running).
    watch_escalated: int = 0
    protocol: ProtocolStats | None = None

    def render(self) -> str:
        """Plain text for terminals: totals, assignment latency, one row per node."""
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v:.1f} ms"

        window = ("every task in the store" if self.since <= 0 else "tasks announced since "
                  + time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.since)))

        rate = "-" if self.success_rate is None else f"{self.success_rate:.1%}"
        no_node = ""
        if self.failed_without_node:
            reasons = ", ".join(f"{n} {reason}" for reason, n in self.no_award.items())
            no_node = (f" ({self.failed - self.failed_without_node} on their node, "
                       f"{self.failed_without_node} without an award"
                       + (f": {reasons}" if reasons else "") + ")")
        lines = [
            f"window: {window}",
            f"tasks: {self.announced} announced, {self.succeeded} succeeded, "
            f"{self.failed} failed{no_node}, {self.unfinished} unfinished; success rate {rate}",
            f"assignment latency: p50 {ms(self.assignment_p50_ms)}, "
            f"p99 {ms(self.assignment_p99_ms)}",
        ]
        lines.append(f"escalations: {self.escalated} escalated (final), {self.watch_escalated} "
                     "flagged by the monitor (still running)")
        if self.protocol is not None:
            p = self.protocol
            verdict = ("every one keeps the protocol" if not p.violations else
                       f"{p.violations} violation(s) in {p.tasks_with_violations} task(s) ("
                       + ", ".join(f"{r} {n}" for r, n in p.by_rule.items())
                       + "); `bidding check` lists them")
            lines.append(f"protocol checker: {p.tasks_checked} task log(s) checked, {verdict}")
        if self.task_types:
            lines.append(f"{'task type':<20} {'tasks':>5} {'ok':>5} {'failed':>6} "
                         f"{'unfinished':>10} {'success':>8}")
            for t in self.task_types:
                share = "-" if t.success_rate is None else f"{t.success_rate:.1%}"
                lines.append(f"{t.task_type:<20} {t.announced:>5} {t.succeeded:>5} "
                             f"{t.failed:>6} {t.unfinished:>10} {share:>8}")
        if not self.nodes:
            return "\n".join(lines)
        lines.append("per node: wins (attempts awarded) = ok + failed (the task ended there) + "
                     "retried (the attempt failed or was lost, and the task went on) + unfinished")
        lines.append(f"{'node':<12} {'bids':>5} {'wins':>5} {'ok':>5} {'failed':>6} "
                     f"{'retried':>7} {'unfinished':>10} {'avg score':>9}")
        for n in self.nodes:
            avg = "-" if n.avg_score is None else f"{n.avg_score:.3f}"
            lines.append(f"{n.node:<12} {n.bids:>5} {n.wins:>5} {n.succeeded:>5} {n.failed:>6} "
                         f"{n.retried:>7} {n.unfinished:>10} {avg:>9}")
        return "\n".join(lines)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100) by nearest rank; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered) / 100)))
    return ordered[rank - 1]


#: Seconds back ``bidding stats`` and ``/aitp/stats`` look unless told otherwise.
DEFAULT_WINDOW = 86_400.0


def window_start(since: float | None, window: float = DEFAULT_WINDOW,
                 now: float | None = None) -> float:
    """The start of a stats window: ``since`` when given (0: every task), else ``window``
    seconds ago; so that a view never reads, or replays, the whole store by default."""
    if since is not None:
        return since
    return (clock.now() if now is None else now) - window


def collect(database_url: str, since: float = 0.0, *, protocol: bool = True) -> Stats:
    """Compute :class:`Stats` over the announcements made since ``since``.

    ``protocol``: include the protocol checker's verdict, a replay of every message of the
    window (about 14 us a message: seconds on a large store, so a view that polls skips it).
    """
    with read_session(database_url) as session:
        rows = session.execute(
            select(
                AnnouncementRow.state,
                AnnouncementRow.assigned_node,
                AnnouncementRow.announced_at,
                AnnouncementRow.awarded_at,
                AnnouncementRow.task_type,
                AnnouncementRow.error,
            ).where(AnnouncementRow.announced_at >= since)
        ).all()
        escalations: dict[str, int] = {
            kind: n
            for kind, n in session.execute(
                select(Message.kind, func.count())
                .join(AnnouncementRow, AnnouncementRow.task_id == Message.task_id)
                .where(
                    AnnouncementRow.announced_at >= since,
                    Message.kind.in_((journal.ESCALATED, journal.WATCH_ESCALATED)),
                )
                .group_by(Message.kind)
            )
        }
        # Every award of an attempt to a node: by its auction, or moved to another bidder.
        awards = session.execute(
            select(
                Message.task_id,
                Message.attempt,
                Message.node,
                Message.kind,
                Message.detail,
                AnnouncementRow.state,
                AnnouncementRow.attempt,
                AnnouncementRow.assigned_node,
            )
            .join(AnnouncementRow, AnnouncementRow.task_id == Message.task_id)
            .where(
                AnnouncementRow.announced_at >= since,
                Message.kind.in_((journal.AWARDED, journal.REAWARDED)),
            )
        ).all()
        bid_rows = session.execute(
            select(BidRow.node, func.count(), func.avg(BidRow.score))
            .join(AnnouncementRow, AnnouncementRow.task_id == BidRow.task_id)
            .where(AnnouncementRow.announced_at >= since, BidRow.will_bid.is_(True))
            .group_by(BidRow.node)
        ).all()
    # Per auction (a retried task has several): the AWARDED message's latency_ms.
    latencies = [
        float(a.detail["latency_ms"])
        for a in awards
        if a.kind == journal.AWARDED and a.detail and a.detail.get("latency_ms") is not None
    ]
    per_node = _award_outcomes(awards)
    checked = check_log(database_url, since=since) if protocol else None
    succeeded = sum(1 for r in rows if r[0] == states.SUCCESS)
    failed = sum(1 for r in rows if r[0] == states.FAILED)
    total_bids = sum(int(n) for _, n, _ in bid_rows)
    nodes = sorted({*per_node, *(str(b[0]) for b in bid_rows)})
    by_node = {str(b[0]): b for b in bid_rows}
    return Stats(
        since=since,
        announced=len(rows),
        succeeded=succeeded,
        failed=failed,
        failed_without_node=sum(1 for r in rows if r[0] == states.FAILED and r[1] is None),
        no_award=dict(sorted(Counter(no_award_reason(r.error) for r in rows
                                     if r[0] == states.FAILED and r[1] is None).items())),
        unfinished=len(rows) - succeeded - failed,
        success_rate=succeeded / (succeeded + failed) if succeeded + failed else None,
        assignment_p50_ms=percentile(latencies, 50),
        assignment_p99_ms=percentile(latencies, 99),
        avg_bids_per_task=total_bids / len(rows) if rows else None,
        task_types=_by_type(rows),
        escalated=int(escalations.get(journal.ESCALATED, 0)),
        watch_escalated=int(escalations.get(journal.WATCH_ESCALATED, 0)),
        protocol=None
        if checked is None
        else ProtocolStats(
            tasks_checked=checked.tasks,
            violations=len(checked.violations),
            tasks_with_violations=len(checked.offending()),
            by_rule=checked.by_rule(),
        ),
        nodes=[
            NodeStats(
                node=n,
                bids=int(by_node[n][1]) if n in by_node else 0,
                wins=sum(per_node.get(n, {}).values()),
                succeeded=per_node.get(n, {}).get("succeeded", 0),
                failed=per_node.get(n, {}).get("failed", 0),
                retried=per_node.get(n, {}).get("retried", 0),
                unfinished=per_node.get(n, {}).get("unfinished", 0),
                avg_score=float(by_node[n][2])
                if n in by_node and by_node[n][2] is not None
                else None,
            )
            for n in nodes
        ],
    )


#: The outcomes of an auction without an award (seed 001's words), as ``no_award`` counts them.
NO_AWARD_OUTCOMES = (decision.NO_BIDDERS, decision.NO_BIDS, decision.NO_CONFIDENT_BIDS,
                     decision.NO_VALID_BIDS)


def no_award_reason(error: str | None) -> str:
    """The outcome an auction's error starts with (``"No bidders registered: no live node
    offers x"`` gives ``"No bidders registered"``); "other" for any other error."""
    return next((o for o in NO_AWARD_OUTCOMES if (error or "").startswith(o)), "other")


def _by_type(rows: Sequence[Any]) -> list[TypeStats]:
    """Per task type: announced, ended in SUCCESS, in FAILED, and not ended."""
    counts: dict[str, Counter[str]] = {}
    for row in rows:
        counts.setdefault(str(row.task_type), Counter())[row.state] += 1
    out = []
    for task_type in sorted(counts):
        c = counts[task_type]
        total = sum(c.values())
        ok, failed = c[states.SUCCESS], c[states.FAILED]
        out.append(
            TypeStats(
                task_type=task_type,
                announced=total,
                succeeded=ok,
                failed=failed,
                unfinished=total - ok - failed,
                success_rate=ok / (ok + failed) if ok + failed else None,
            )
        )
    return out


def _award_outcomes(awards: Sequence[Any]) -> dict[str, dict[str, int]]:
    """What became of each node's awards, by node: the award that holds its task now (same
    attempt, same node) counts by the task's state; an earlier one was retried or moved on."""
    per_node: dict[str, dict[str, int]] = {}
    seen: set[tuple[str, int, str]] = set()
    for task_id, attempt, node, _, _, state, current_attempt, current_node in awards:
        if node is None or (task_id, attempt, node) in seen:
            continue
        seen.add((task_id, attempt, node))
        if attempt != current_attempt or node != current_node:
            outcome = "retried"
        elif state == states.SUCCESS:
            outcome = "succeeded"
        elif state == states.FAILED:
            outcome = "failed"
        else:
            outcome = "unfinished"
        counts = per_node.setdefault(node, {})
        counts[outcome] = counts.get(outcome, 0) + 1
    return per_node
