"""``bidding tasks`` and ``GET /aitp/tasks``: the latest tasks, newest first, found by tag
(AITP ``metadata.tags``) or state; each with who created it and its estimated and actual
cost."""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel
from sqlalchemy import func, select

from bidding.store import ensure_schema, read_session
from bidding.store.schema import AnnouncementRow, GraphStep, LedgerEntry, Tag

#: The most tasks one listing returns.
MAX_LIMIT = 500


class TaskSummary(BaseModel):
    """One task in a listing."""

    task_id: str
    task_name: str
    task_type: str
    state: str
    attempt: int
    node: str | None
    tags: list[str]
    created_by: str | None
    announced_at: float
    finished_at: float | None
    #: What its winning bid estimated, and its ledger's sum.
    estimated_cost: float | None
    actual_cost: float
    #: The task graph it is a subtask of (``GET /aitp/tasks/{graph_id}``), if any.
    graph_id: str | None = None


def list_tasks(database_url: str, *, tag: str | None = None, state: str | None = None,
               limit: int = 50) -> list[TaskSummary]:
    """The latest ``limit`` tasks (by announcement, newest first), those tagged ``tag`` only,
    in ``state`` only; every value reaches SQL as a bound parameter."""
    ensure_schema(database_url)
    query = select(AnnouncementRow).order_by(AnnouncementRow.announced_at.desc(),
                                             AnnouncementRow.task_id).limit(limit)
    if tag is not None:
        query = query.where(AnnouncementRow.task_id.in_(
            select(Tag.task_id).where(Tag.tag == tag)))
    if state is not None:
        query = query.where(AnnouncementRow.state == state)
    with read_session(database_url) as session:
        rows = session.scalars(query).all()
        ids = [r.task_id for r in rows]
        tags: dict[str, list[str]] = defaultdict(list)
        costs: dict[str, float] = {}
        graphs: dict[str, str] = {}
        if ids:
            for task_id, name in session.execute(
                    select(Tag.task_id, Tag.tag).where(Tag.task_id.in_(ids))
                    .order_by(Tag.task_id, Tag.tag)):
                tags[task_id].append(name)
            costs = {task_id: float(total or 0.0) for task_id, total in session.execute(
                select(LedgerEntry.task_id, func.sum(LedgerEntry.total))
                .where(LedgerEntry.task_id.in_(ids)).group_by(LedgerEntry.task_id))}
            graphs = {task_id: graph_id for task_id, graph_id in session.execute(
                select(GraphStep.task_id, GraphStep.graph_id)
                .where(GraphStep.task_id.in_(ids)))}
        return [TaskSummary(
            task_id=r.task_id, task_name=r.task_name, task_type=r.task_type, state=r.state,
            attempt=r.attempt, node=r.assigned_node, tags=tags.get(r.task_id, []),
            created_by=r.created_by, announced_at=r.announced_at, finished_at=r.finished_at,
            estimated_cost=r.estimated_cost, actual_cost=costs.get(r.task_id, 0.0),
            graph_id=graphs.get(r.task_id)) for r in rows]


def render(tasks: list[TaskSummary]) -> str:
    """The listing as a table for terminals."""
    if not tasks:
        return "no such task in the store"
    lines = [f"{'task':<36} {'state':<10} {'node':<10} {'est.cost':>9} {'cost':>9}  "
             "tags / created by / name"]
    for t in tasks:
        est = "-" if t.estimated_cost is None else f"{t.estimated_cost:.4g}"
        extra = ", ".join(t.tags) or "-"
        lines.append(f"{t.task_id:<36} {t.state:<10} {t.node or '-':<10} {est:>9} "
                     f"{t.actual_cost:>9.4g}  [{extra}] {t.created_by or '-'} {t.task_name}"
                     + (f" (graph {t.graph_id})" if t.graph_id else ""))
    return "\n".join(lines)
