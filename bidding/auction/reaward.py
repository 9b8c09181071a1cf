"""Re-awarding a lost winner's task: to the next-best bidder of the same auction (AITP 6.2
SELECT_NEXT_BEST), to a new auction, or failing it, as its ``on_agent_offline`` fallback
says; the lost attempt recorded against its node."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    select,
)

from bidding.context import Context
from bidding.errors import NodeLostError
from bidding.execution.dispatch import delivery_due, mark_undelivered, send_execution
from bidding.execution.episodes import record_episode
from bidding.execution.report import fail_caller
from bidding.lifecycle import events, journal, states
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import Announcement
from bidding.nodes.profile import exec_queue
from bidding.store import write_session
from bidding.store.schema import BidRow

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LostWinner:
    """A winner found lost (its node or worker dead) or late to start its task."""

    announcement: Announcement
    attempt: int
    node: str
    #: The task's state when it was found (ASSIGNED or EXECUTING).
    state: str
    reason: str
    #: Only if the task is still due by then (a winner late to start; another sweeper may
    #: have resent it meanwhile). None: whenever.
    due_by: float | None = None


def replace_winner(ctx: Context, lost: LostWinner, live: set[str],
                   now: float) -> bool:
    """Apply the task's on_agent_offline fallback to a ``lost`` winner (``live``: the nodes
    alive now).

    The move is committed first and the new winner's execution sent after it, outside the
    write transaction: with the broker down, Celery's publish retries must not hold the store's
    write lock (SQLite's is the whole federation's). A send that fails is marked undelivered and
    resent by a sweeper, as any other award's (``execution.dispatch.mark_undelivered``).
    """
    announcement, attempt, node, state, reason, due_by = (
        lost.announcement,
        lost.attempt,
        lost.node,
        lost.state,
        lost.reason,
        lost.due_by,
    )
    policy = announcement.fallbacks.on_agent_offline
    exclude = [*(n for n in announcement.exclude_nodes if n != node), node]
    moved_to: str | None = None
    nxt = announcement
    held = Expect(states=(state,), attempt=attempt, node=node, due_by=due_by)
    with write_session(ctx.settings.database_url) as session:
        if policy == "next_best":
            moved_to = _next_best(session, announcement.task_id, attempt, set(exclude), live)
        if moved_to is not None:
            nxt = announcement.model_copy(update={"exclude_nodes": exclude})
            ok = transition(
                session,
                announcement.task_id,
                states.ASSIGNED,
                Log(
                    journal.REAWARDED,
                    node=moved_to,
                    at=now,
                    detail={"from": node, "to": moved_to, "reason": reason},
                ),
                held,
                assigned_node=moved_to,
                spec=nxt.model_dump(mode="json"),
                awarded_at=now,
                started_at=None,
                due_at=delivery_due(ctx.settings, nxt, now),
            )
            if ok:
                _lost_episode(session, announcement, attempt, node, reason, now)
        elif policy == "fail":
            ok = transition(
                session,
                announcement.task_id,
                states.FAILED,
                Log(journal.TASK_FAILED, detail={"error": reason}, at=now),
                held,
                error=reason,
                finished_at=now,
                due_at=None,
            )
        else:
            nxt = announcement.model_copy(
                update={
                    "attempt": attempt + 1,
                    "exclude_nodes": exclude,
                    "silent_rounds": 0,
                    "announced_at": now,
                    "last_error": reason,
                }
            )
            ok = transition(
                session,
                announcement.task_id,
                states.RETRYING,
                Log(
                    journal.RETRYING,
                    at=now,
                    detail={
                        "why": reason + "; no other bidder left, new auction",
                        "next_attempt": attempt + 1,
                        "delay_s": 0,
                    },
                ),
                held,
                attempt=attempt + 1,
                spec=nxt.model_dump(mode="json"),
                due_at=now,
                assigned_node=None,
            )
        if ok and moved_to is None:
            _lost_episode(session, announcement, attempt, node, reason, now)
    if ok and moved_to is not None:
        events.reawarded(ctx.app, nxt, node, moved_to, exec_queue(moved_to), reason)
        try:
            send_execution(ctx.app, nxt, moved_to, ctx.settings)
        except Exception as exc:
            mark_undelivered(ctx.settings, nxt, moved_to, exc)
    elif ok and policy == "fail":
        # After the commit: errbacks may run here, and must not hold the write lock.
        fail_caller(ctx, announcement, NodeLostError(reason))
    return ok


def _next_best(
    session: Any, task_id: str, attempt: int, exclude: set[str], live: set[str]
) -> str | None:
    """The best-scored eligible bid of the same auction from a live node not excluded."""
    rows = session.execute(
        select(BidRow.node, BidRow.score, BidRow.breakdown).where(
            BidRow.task_id == task_id,
            BidRow.attempt == attempt,
            BidRow.will_bid.is_(True),
            BidRow.late.is_(False),
        )
    ).all()
    ranked = sorted(
        (
            r
            for r in rows
            if r.node not in exclude
            and r.node in live
            and (r.breakdown or {}).get("eligible", True)
        ),
        key=lambda r: -(r.score if r.score is not None else -1.0),
    )
    return ranked[0].node if ranked else None


def _lost_episode(
    session: Any, announcement: Announcement, attempt: int, node: str, reason: str, now: float
) -> None:
    """The lost winner failed this attempt: it counts against its trust (once: it may have run
    and failed, or another sweep got there first), not its experience of the task type (a
    worker killed or restarted under it is no verdict on the work: counted there, a few kills
    drove every node's learned confidence under min_confidence in the chaos soak)."""
    record_episode(
        session,
        {
            "task_id": announcement.task_id,
            "attempt": attempt,
            "node": node,
            "task_type": announcement.task_type,
            "skills": list(announcement.required_skills),
            "success": False,
            "duration_s": 0.0,
            "cost": 0.0,
            "error": reason,
            "finished_at": now,
            "lost": True,
        },
    )
