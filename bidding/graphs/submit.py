"""``bidding.submit(spec, app=app)``: validate an AITP task definition, record its graph in
the store and announce the subtasks that can start; the nodes do the rest, so the caller may
exit at once. The handle reads the graph from the store."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from celery import Celery
from sqlalchemy import select

from bidding.config import Settings, get_settings
from bidding.context import Context
from bidding.errors import ConfigurationError, SubtaskFailedError, UnknownTaskError
from bidding.graphs import store as rows
from bidding.graphs.advance import advance
from bidding.graphs.progress import GraphProgress, graph_progress
from bidding.graphs.spec import TaskDefinition, load_definition
from bidding.graphs.validate import check
from bidding.store import ensure_schema, read_session, write_session
from bidding.store.schema import Graph


def capability_tasks(app: Celery) -> dict[str, Any]:
    """The app's tasks that implement an AITP capability (``capability="..."``), by capability."""
    app.loader.import_default_modules()
    found: dict[str, Any] = {}
    for name in sorted(app.tasks):
        capability = getattr(app.tasks[name], "capability", None)
        if not capability:
            continue
        other = found.setdefault(str(capability), app.tasks[name])
        if other is not app.tasks[name]:
            # Which one a subtask would run must not depend on names: refuse. (Celery shares
            # an @app.task with every app of the process unless it says shared=False.)
            raise ConfigurationError(
                f"capability {capability}: implemented by several tasks of the app "
                f"({other.name}, {name}); register one (shared=False keeps another app's "
                "tasks out of this one)")
    return found


class GraphHandle:
    """A submitted task graph: ``.id``, ``.status()``, ``.progress()``, ``.result(timeout)``."""

    def __init__(self, graph_id: str, app: Celery, settings: Settings | None = None) -> None:
        self.id = graph_id
        self.app = app
        self.settings = settings or get_settings(app)

    def __repr__(self) -> str:
        return f"<GraphHandle {self.id}>"

    def status(self) -> str:
        """PENDING (waiting for the tasks it depends on), EXECUTING, COMPLETED or FAILED."""
        with read_session(self.settings.database_url) as session:
            state = session.scalar(select_state(self.id))
        if state is None:
            raise UnknownTaskError(f"task {self.id}: no such task graph in the store")
        return str(state)

    def progress(self) -> GraphProgress:
        """AITP 5.3 progress: current step, percent, each step's status, node, times, cost."""
        return graph_progress(self.settings.database_url, self.id)

    def result(self, timeout: float | None = None, interval: float = 0.1) -> dict[str, Any]:
        """Wait for the task's result; raises ``SubtaskFailedError`` naming the subtask that
        failed and why, or ``TimeoutError``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            progress = self.progress()
            if progress.status == rows.COMPLETED:
                return dict(progress.result or {})
            if progress.status == rows.FAILED:
                raise SubtaskFailedError(
                    f"task {progress.name!r} ({self.id}) failed: {progress.error}",
                    subtask=progress.failed_subtask,
                    reason=next((s.error for s in progress.steps
                                 if s.step_id == progress.failed_subtask), progress.error))
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"task {self.id}: still {progress.status} after {timeout}s "
                                   f"(step {progress.current_step}/{progress.total_steps})")
            time.sleep(interval)


def select_state(graph_id: str) -> Any:
    """The query of a graph's state."""
    return select(Graph.state).where(Graph.graph_id == graph_id)


def submit(spec: Any, *, app: Celery, input: Mapping[str, Any] | None = None) -> GraphHandle:
    """Validate ``spec`` (a dict, a JSON/YAML file path or a ``TaskDefinition``), record it,
    announce the subtasks that can start now, and return its handle. Every problem of the
    definition is raised here (``GraphValidationError``), before anything runs."""
    defn: TaskDefinition = load_definition(spec)
    settings = get_settings(app)
    values = defn.input_with_defaults(dict(input or {}))
    if input:
        # The values given here are the definition's own: a task without subtasks passes each
        # one to its capability's task (its single step's input is made of them).
        defn = defn.model_copy(update={"input_values": {**defn.input_values, **input}})
    tasks = capability_tasks(app)
    check(defn, values, tasks, settings.max_arguments_bytes)
    ensure_schema(settings.database_url)
    names = {capability: task.name for capability, task in tasks.items()}
    with write_session(settings.database_url) as session:
        graph_id = rows.create(session, defn, values, names)
    advance(Context(settings, app), graph_id)
    return GraphHandle(graph_id, app, settings)
