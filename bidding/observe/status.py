"""``bidding status TASK_ID``: where a task stands now (AITP 8.2), its progress and its cost."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ValidationError
from sqlalchemy import select

from bidding import clock
from bidding.errors import UnknownTaskError
from bidding.lifecycle import states
from bidding.models import DEFAULT_PRIORITY, Announcement, priority_label
from bidding.observe.attempts import AttemptView, attempt_history
from bidding.observe.watch import WatchState, WatchView, last_news, view
from bidding.store import ensure_schema, read_session, store_label
from bidding.store.schema import AnnouncementRow, LedgerEntry, Message, Tag


class LedgerLine(BaseModel):
    """One attempt's cost (AITP 7.2)."""

    attempt: int
    node: str
    units: float
    price_per_unit: float
    total: float


#: States of a task that has not started (its expiry still bites).
_NOT_STARTED = frozenset({states.PENDING, states.BIDDING, states.ASSIGNED, states.RETRYING,
                          states.DEFERRED})


class TaskStatus(BaseModel):
    """The task now: state, attempt, node, progress, cost against budget, last events."""

    task_id: str
    task_name: str
    state: str
    attempt: int
    node: str | None
    #: 0-9, higher is more urgent.
    priority: int = DEFAULT_PRIORITY
    progress: dict[str, Any]
    budget: float | None
    cost_so_far: float
    remaining_budget: float | None
    ledger: list[LedgerLine]
    error: str | None
    retry_at: float | None
    last_events: list[str]
    #: Each attempt: its node(s), how it ended and why.
    attempts: list[AttemptView] = []
    #: When it was announced (its latest attempt), started on its node and ended (Unix time).
    announced_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    #: The final outcome: ``{"value": ...}`` (the task's JSON result) or ``{"exception": ...}``.
    result: dict[str, Any] | None = None
    #: Seed 002's watch while the task is delegated (ASSIGNED or EXECUTING): checks without
    #: news, the next check, an escalation and its reason. None otherwise.
    watch: WatchView | None = None
    #: Why the sweepers stopped looking at it (``lifecycle.parking``): which scan failed on it
    #: pass after pass, and how. None while it is not parked.
    parked: str | None = None
    #: Its start-by time (Unix time: the earlier of its expiry and deadline); not started by
    #: then, it never starts. None without one.
    expires_at: float | None = None
    #: AITP metadata: its tags, who created it, the cost its winning bid estimated (None
    #: before an award, or when the bid did not say) and the actual cost (its ledger's sum,
    #: ``cost_so_far``).
    tags: list[str] = []
    created_by: str | None = None
    estimated_cost: float | None = None
    actual_cost: float = 0.0

    def render(self) -> str:
        """Plain text for terminals."""
        now = clock.now()
        # An escalation is a flag on the state, not a state: "EXECUTING, escalated: why".
        state = (f"{self.state}, {self.watch.line(now)}" if self.watch and self.watch.escalated
                 else self.state)
        lines = [f"task {self.task_id}  {self.task_name}",
                 f"  state: {state}  attempt: {self.attempt}  node: {self.node or '-'}  "
                 f"priority: {priority_label(self.priority)}"]
        if self.tags or self.created_by:
            lines.append(f"  tags: {', '.join(self.tags) or '-'}  created by: "
                         f"{self.created_by or '-'}")
        if self.parked:
            lines.append(f"  parked: {self.parked} (no sweeper looks at it until it moves on; "
                         f"`bidding reset {self.task_id}` puts it back)")
        if self.watch and not self.watch.escalated and self.watch.check_attempts:
            lines.append(f"  watch: {self.watch.line(now)}")
        if self.progress:
            p = self.progress
            pct = f" ({p['percent']}%)" if p.get("percent") is not None else ""
            lines.append(f"  progress: {p.get('current')}/{p.get('total')}{pct} {p.get('note')}")
        if self.retry_at:
            lines.append(f"  next attempt in {max(0.0, self.retry_at - now):.1f}s")
        if self.expires_at is not None and self.state in _NOT_STARTED:
            lines.append(f"  expires in {max(0.0, self.expires_at - now):.1f}s unless it "
                         "starts by then")
        budget = "-" if self.budget is None else f"{self.budget:.4f}"
        estimated = ("" if self.estimated_cost is None
                     else f" (estimated {self.estimated_cost:.4f} by the winning bid)")
        lines.append(f"  cost so far: {self.cost_so_far:.4f} of budget {budget}{estimated}")
        for e in self.ledger:
            lines.append(f"    attempt {e.attempt} on {e.node}: {e.units:g} units x "
                         f"{e.price_per_unit:g} = {e.total:.4f}")
        if len(self.attempts) > 1 or (self.attempts and self.attempts[0].error):
            lines.append("  attempts:")
            lines += [f"    {a.line()}" for a in self.attempts]
        if self.error:
            lines.append(f"  error: {self.error}")
        lines.append("  last events: " + ", ".join(self.last_events))
        return "\n".join(lines)


def task_status(database_url: str, task_id: str, events: int = 8) -> TaskStatus:
    """Read the status of ``task_id`` from the store."""
    ensure_schema(database_url)
    with read_session(database_url) as session:
        row = session.get(AnnouncementRow, task_id)
        if row is None:
            raise UnknownTaskError(
                f"task {task_id}: no such announcement in the store {store_label(database_url)}"
                " (a finished task is pruned after bidding_retention_days)")
        ledger = session.scalars(select(LedgerEntry).where(LedgerEntry.task_id == task_id)
                                 .order_by(LedgerEntry.id)).all()
        log = session.scalars(select(Message).where(Message.task_id == task_id)
                              .order_by(Message.id)).all()
        kinds = [m.kind for m in log[-events:]]
        tags = list(session.scalars(select(Tag.tag).where(Tag.task_id == task_id)
                                    .order_by(Tag.tag)))
        try:
            budget = Announcement.model_validate(row.spec).budget
        except ValidationError:
            # Written by a version this one cannot read (it is parked, most likely): its
            # row's own copy of the budget, as the task was first announced.
            budget = row.budget
        spent = sum(e.total for e in ledger)
        return TaskStatus(
            task_id=task_id, task_name=row.task_name, state=row.state, attempt=row.attempt,
            node=row.assigned_node, priority=row.priority, progress=dict(row.progress or {}),
            budget=budget,
            cost_so_far=spent,
            remaining_budget=None if budget is None else budget - spent,
            ledger=[LedgerLine(attempt=e.attempt, node=e.node, units=e.units,
                               price_per_unit=e.price_per_unit, total=e.total) for e in ledger],
            error=row.error,
            retry_at=row.due_at if row.state in ("RETRYING", "DEFERRED", "PENDING") else None,
            last_events=kinds,
            attempts=attempt_history(log),
            announced_at=row.announced_at, started_at=row.started_at,
            finished_at=row.finished_at, result=row.result, watch=watch_of(row),
            parked=row.parked, expires_at=row.expires_at, tags=tags, created_by=row.created_by,
            estimated_cost=row.estimated_cost, actual_cost=spent,
        )


def watch_of(row: AnnouncementRow) -> WatchView | None:
    """The watch of a task's row while it is delegated; None otherwise."""
    if row.state not in states.IN_FLIGHT_STATES:
        return None
    stored = WatchState(row.check_attempts, row.next_check_time, row.check_since,
                        row.escalated_at, row.escalation)
    return view(stored, last_news(row.awarded_at, row.started_at, row.progress, row.attempt))
