"""The graph of a task's subtasks, pure: cycles, transitive dependencies, what is ready."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from bidding.graphs.spec import Subtask
from bidding.models import DEFAULT_PRIORITY


def find_cycle(steps: Sequence[Subtask]) -> list[str] | None:
    """The ids of one dependency cycle, in order (the first repeated last), or None."""
    deps = {s.subtask_id: [d for d in s.depends_on] for s in steps}
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for dep in deps.get(node, []):
            if dep not in deps:
                continue
            if state.get(dep) == 1:
                return [*path[path.index(dep):], dep]
            if dep not in state:
                found = visit(dep)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for step in steps:
        if step.subtask_id not in state:
            found = visit(step.subtask_id)
            if found:
                return found
    return None


def ancestors(steps: Sequence[Subtask]) -> dict[str, set[str]]:
    """Each subtask's transitive dependencies (for an acyclic graph)."""
    deps = {s.subtask_id: set(s.depends_on) for s in steps}
    memo: dict[str, set[str]] = {}

    def of(node: str, seen: frozenset[str]) -> set[str]:
        if node in memo:
            return memo[node]
        found: set[str] = set()
        for dep in deps.get(node, set()):
            if dep in deps and dep not in seen:
                found |= {dep} | of(dep, seen | {dep})
        memo[node] = found
        return found

    return {s.subtask_id: of(s.subtask_id, frozenset({s.subtask_id})) for s in steps}


def dependents(steps: Sequence[Subtask], subtask_id: str) -> list[str]:
    """The subtasks that depend on ``subtask_id``, directly or not, in definition order."""
    tree = ancestors(steps)
    return [s.subtask_id for s in steps if subtask_id in tree[s.subtask_id]]


def sinks(steps: Sequence[Subtask]) -> list[str]:
    """The subtasks nothing depends on (their outputs make the task's result)."""
    needed = {d for s in steps for d in s.depends_on}
    return [s.subtask_id for s in steps if s.subtask_id not in needed]


def ready(steps: Sequence[Subtask], done: Collection[str],
          started: Collection[str], default: int = DEFAULT_PRIORITY) -> list[Subtask]:
    """Subtasks not started whose dependencies are all done, most urgent first (the highest
    priority; a subtask without one has ``default``, its task's), then in definition order."""
    found = [s for s in steps
             if s.subtask_id not in started and s.subtask_id not in done
             and all(d in done for d in s.depends_on)]
    position = {s.subtask_id: i for i, s in enumerate(steps)}
    return sorted(found, key=lambda s: (-(default if s.priority is None else s.priority),
                                        position[s.subtask_id]))


def budget_share(cost_limit: float, spent_finished: float, held_by_running: float,
                 pending: int) -> float:
    """The budget of a subtask started now, so that the task never spends more than
    ``cost_limit``: what is left after the finished subtasks' costs and the budgets the running
    ones hold, shared equally among the ``pending`` subtasks not started yet (this one
    included). What a finished subtask did not spend of its budget returns to the pool."""
    free = cost_limit - spent_finished - held_by_running
    return max(0.0, free / max(1, pending))
