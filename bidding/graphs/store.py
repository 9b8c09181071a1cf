"""A graph's rows: created at submit, and moved by compare-and-set (a step or a graph moves
once, whichever node or sweeper gets there first)."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final, cast

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.orm import Session

from bidding import clock
from bidding.graphs.spec import Subtask, TaskDefinition
from bidding.store.schema import Graph, GraphStep, LedgerEntry

#: Graph states (AITP 2.1 status).
WAITING: Final = "PENDING"
EXECUTING: Final = "EXECUTING"
COMPLETED: Final = "COMPLETED"
FAILED: Final = "FAILED"
#: Step states.
PENDING: Final = "PENDING"
RUNNING: Final = "RUNNING"
SUCCESS: Final = "SUCCESS"
CANCELLED: Final = "CANCELLED"
STEP_FINAL: Final = frozenset({SUCCESS, FAILED, CANCELLED})


def create(session: Session, defn: TaskDefinition, values: Mapping[str, Any],
           task_names: Mapping[str, str], now: float | None = None) -> str:
    """Insert the graph and its steps (none started); returns the graph's id."""
    now = clock.now() if now is None else now
    graph_id = defn.task_id or str(uuid.uuid4())
    state = WAITING if defn.metadata.dependencies else EXECUTING
    session.add(Graph(graph_id=graph_id, name=defn.name, spec=defn.model_dump(mode="json"),
                      input=dict(values), state=state, cost_limit=defn.metadata.cost_limit,
                      created_at=now, touched_at=now))
    session.flush()
    for i, step in enumerate(defn.steps()):
        session.add(GraphStep(graph_id=graph_id, step_id=step.subtask_id, position=i,
                              name=step.name or step.subtask_id,
                              capability=step.agent_capability,
                              task_name=task_names[step.agent_capability],
                              task_id=str(uuid.uuid4()), state=PENDING))
    return graph_id


def move_step(session: Session, graph_id: str, step_id: str, source: str | Collection[str],
              target: str, **values: Any) -> bool:
    """Compare-and-set a step from ``source`` to ``target``; True if this call moved it."""
    sources = [source] if isinstance(source, str) else list(source)
    moved = cast(CursorResult[Any], session.execute(
        update(GraphStep)
        .where(GraphStep.graph_id == graph_id, GraphStep.step_id == step_id,
               GraphStep.state.in_(sources))
        .values(state=target, **values))).rowcount
    if moved:
        touch(session, graph_id)
    return moved == 1


def move_graph(session: Session, graph_id: str, source: str | Collection[str], target: str,
               **values: Any) -> bool:
    """Compare-and-set the graph from ``source`` to ``target``; True if this call moved it."""
    sources = [source] if isinstance(source, str) else list(source)
    return cast(CursorResult[Any], session.execute(
        update(Graph).where(Graph.graph_id == graph_id, Graph.state.in_(sources))
        .values(state=target, touched_at=clock.now(), **values))).rowcount == 1


def touch(session: Session, graph_id: str) -> None:
    """Record that the graph moved now."""
    session.execute(update(Graph).where(Graph.graph_id == graph_id)
                    .values(touched_at=clock.now()))


def graph_of_task(session: Session, task_id: str) -> str | None:
    """The graph whose step runs as ``task_id``, if any."""
    return session.scalar(select(GraphStep.graph_id).where(GraphStep.task_id == task_id))


def spent(session: Session, task_ids: Sequence[str]) -> dict[str, float]:
    """Each task's ledger total (tasks without entries are left out)."""
    if not task_ids:
        return {}
    rows = session.execute(select(LedgerEntry.task_id, func.sum(LedgerEntry.total))
                           .where(LedgerEntry.task_id.in_(list(task_ids)))
                           .group_by(LedgerEntry.task_id)).all()
    return {task_id: float(total or 0.0) for task_id, total in rows}


def definition(graph: Graph) -> TaskDefinition:
    """The graph's task definition, as validated at submit."""
    return TaskDefinition.model_validate(graph.spec)


def steps_by_id(defn: TaskDefinition) -> dict[str, Subtask]:
    """The definition's steps by id."""
    return {s.subtask_id: s for s in defn.steps()}
