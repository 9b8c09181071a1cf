"""Where a task graph stands (AITP 5.3): current step, total, percent, and each step's status,
node, start and end, cost; the task's cost against its ``cost_limit``, its ledger (every
subtask's entries, with the budget left after each) and the cost its winning bids estimated."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from sqlalchemy import select

from bidding.errors import UnknownTaskError
from bidding.graphs import store as rows
from bidding.store import ensure_schema, read_session
from bidding.store.schema import AnnouncementRow, Graph, GraphStep, LedgerEntry


class StepProgress(BaseModel):
    """One subtask (AITP 5.3 ``steps``)."""

    step_id: str
    name: str
    agent_capability: str
    #: PENDING, the bidding task's state while it runs (BIDDING, EXECUTING, RETRYING...),
    #: COMPLETED, FAILED or CANCELLED (never started).
    status: str
    #: The subtask's bidding task (``bidding explain`` / ``bidding status`` it).
    task_id: str
    #: The node that ran it (the winner of its auction).
    agent_id: str | None
    started_at: float | None
    completed_at: float | None
    cost: float
    attempt: int | None = None
    error: str | None = None


class GraphLedgerLine(BaseModel):
    """One attempt's cost in a task graph's ledger (AITP 7.2), in the order it was charged."""

    step_id: str
    task_id: str
    attempt: int
    node: str
    units: float
    price_per_unit: float
    total: float
    at: float
    #: The graph's ``cost_limit`` less everything charged up to this entry (None: no limit).
    remaining_budget: float | None


class GraphProgress(BaseModel):
    """A task graph now (AITP 5.3)."""

    task_id: str
    name: str
    status: str
    current_step: int
    total_steps: int
    percent_complete: int
    steps: list[StepProgress]
    cost: float
    cost_limit: float | None
    created_at: float
    finished_at: float | None
    error: str | None
    failed_subtask: str | None
    result: dict[str, Any] | None
    #: Every subtask's ledger entries in the order charged, and the budget left now.
    ledger: list[GraphLedgerLine] = []
    remaining_budget: float | None = None
    #: The sum of the cost its subtasks' winning bids estimated (None before any said).
    estimated_cost: float | None = None
    #: AITP metadata of its definition.
    tags: list[str] = []
    created_by: str | None = None

    def render(self) -> str:
        """Plain text for terminals."""
        limit = "-" if self.cost_limit is None else f"{self.cost_limit:g}"
        lines = [f"task {self.task_id}  {self.name}",
                 f"  status: {self.status}  step {self.current_step}/{self.total_steps} "
                 f"({self.percent_complete}%)  cost: {self.cost:.4f} of limit {limit}"
                 + ("" if self.remaining_budget is None
                    else f" ({self.remaining_budget:.4f} left)")
                 + ("" if self.estimated_cost is None
                    else f"  estimated: {self.estimated_cost:.4f}")]
        for s in self.steps:
            took = (f" {s.completed_at - s.started_at:.2f}s"
                    if s.started_at and s.completed_at else "")
            lines.append(f"  - {s.step_id:<14} {s.status:<10} {s.agent_capability:<22} "
                         f"node {s.agent_id or '-':<10} cost {s.cost:.4f}{took}  "
                         f"task {s.task_id}")
            if s.error:
                lines.append(f"      {s.error}")
        if self.ledger:
            lines.append("  ledger:")
            for e in self.ledger:
                left = ("" if e.remaining_budget is None
                        else f"  ({e.remaining_budget:.4f} of the budget left)")
                lines.append(f"    {e.step_id:<14} attempt {e.attempt} on {e.node}: "
                             f"{e.units:g} units x {e.price_per_unit:g} = {e.total:.4f}{left}")
        if self.error:
            lines.append(f"  error: {self.error}")
        if self.result is not None:
            lines.append(f"  result: {self.result}")
        return "\n".join(lines)


def _status(step: GraphStep, task_state: str | None) -> str:
    if step.state == rows.SUCCESS:
        return "COMPLETED"
    if step.state == rows.RUNNING:
        return task_state or "ANNOUNCED"
    return step.state


def is_graph(database_url: str, graph_id: str) -> bool:
    """True when ``graph_id`` names a task graph."""
    ensure_schema(database_url)
    with read_session(database_url) as session:
        return session.get(Graph, graph_id) is not None


def graph_progress(database_url: str, graph_id: str) -> GraphProgress:
    """Read the progress of ``graph_id`` from the store."""
    ensure_schema(database_url)
    with read_session(database_url) as session:
        graph = session.get(Graph, graph_id)
        if graph is None:
            raise UnknownTaskError(f"task {graph_id}: no such task graph in the store")
        steps = session.scalars(select(GraphStep).where(GraphStep.graph_id == graph_id)
                                .order_by(GraphStep.position)).all()
        ids = [s.task_id for s in steps]
        tasks = {r.task_id: r for r in session.execute(
            select(AnnouncementRow.task_id, AnnouncementRow.state, AnnouncementRow.attempt,
                   AnnouncementRow.assigned_node, AnnouncementRow.started_at,
                   AnnouncementRow.finished_at).where(AnnouncementRow.task_id.in_(ids))).all()}
        costs = rows.spent(session, ids)
        entries = session.scalars(select(LedgerEntry).where(LedgerEntry.task_id.in_(ids))
                                  .order_by(LedgerEntry.at, LedgerEntry.id)).all()
        estimates = [r for r in session.scalars(
            select(AnnouncementRow.estimated_cost).where(AnnouncementRow.task_id.in_(ids)))
            if r is not None]
    step_of = {s.task_id: s.step_id for s in steps}
    ledger: list[GraphLedgerLine] = []
    charged = 0.0
    for e in entries:
        charged += e.total
        ledger.append(GraphLedgerLine(
            step_id=step_of[e.task_id], task_id=e.task_id, attempt=e.attempt, node=e.node,
            units=e.units, price_per_unit=e.price_per_unit, total=e.total, at=e.at,
            remaining_budget=None if graph.cost_limit is None else graph.cost_limit - charged))
    meta = graph.spec.get("metadata") or {}
    views = []
    for step in steps:
        task = tasks.get(step.task_id)
        views.append(StepProgress(
            step_id=step.step_id, name=step.name, agent_capability=step.capability,
            status=_status(step, task.state if task else None), task_id=step.task_id,
            agent_id=task.assigned_node if task else None,
            started_at=task.started_at if task else None,
            completed_at=(task.finished_at if task and step.state in rows.STEP_FINAL
                          else None),
            cost=costs.get(step.task_id, 0.0), attempt=task.attempt if task else None,
            error=step.error))
    total = len(views)
    done = sum(1 for v in views if v.status == "COMPLETED")
    return GraphProgress(
        task_id=graph.graph_id, name=graph.name, status=graph.state,
        current_step=total if graph.state == rows.COMPLETED else min(done + 1, total),
        total_steps=total, percent_complete=int(100 * done / total) if total else 100,
        steps=views, cost=sum(costs.values()), cost_limit=graph.cost_limit,
        created_at=graph.created_at, finished_at=graph.finished_at, error=graph.error,
        failed_subtask=graph.failed_step, result=graph.result, ledger=ledger,
        remaining_budget=(None if graph.cost_limit is None
                          else graph.cost_limit - sum(costs.values())),
        estimated_cost=sum(estimates) if estimates else None,
        tags=list(meta.get("tags") or []), created_by=graph.spec.get("created_by"))
