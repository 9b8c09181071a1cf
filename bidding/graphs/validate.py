"""Validation of a task definition before anything runs (pure): every error names the subtask
and the field. ``check`` collects them all and raises one ``GraphValidationError``."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from typing import Any

from bidding.errors import ConfigurationError
from bidding.graphs import plan
from bidding.graphs.spec import Subtask, TaskDefinition
from bidding.graphs.templates import Reference, TemplateError, references, resolve
from bidding.graphs.typed import task_input, type_errors
from bidding.models import non_json_number


class GraphValidationError(ConfigurationError):
    """A task definition that cannot run; ``errors`` lists every problem found."""

    def __init__(self, name: str, errors: list[str]) -> None:
        super().__init__(f"task {name!r} is invalid: " + "; ".join(errors))
        self.errors = errors


def errors_of(defn: TaskDefinition, values: Mapping[str, Any],
              tasks: Mapping[str, Any], max_arguments_bytes: int | None = None) -> list[str]:
    """Every problem of ``defn`` run with input ``values``, given the registered tasks by
    capability (``tasks``: capability -> Celery task); input values or a subtask's literal
    input with more than ``max_arguments_bytes`` of JSON among them."""
    steps = defn.steps()
    if not steps:
        return ["subtasks: a task needs subtasks or an agent_capability"]
    found: list[str] = []
    ids = [s.subtask_id for s in steps]
    for sid, n in Counter(ids).items():
        if n > 1:
            found.append(f"subtask {sid}: subtask_id is used by {n} subtasks")
    known = set(ids)
    for step in steps:
        for dep in step.depends_on:
            if dep not in known:
                found.append(f"subtask {step.subtask_id}: depends_on names unknown "
                             f"subtask {dep!r}")
    cycle = plan.find_cycle(steps)
    if cycle is not None:
        found.append(f"subtasks {', '.join(dict.fromkeys(cycle))}: depends_on makes a cycle "
                     f"({' -> '.join(cycle)})")
    found += _input_errors(defn, values)
    found += _non_json_numbers(steps, values)
    if max_arguments_bytes is not None:
        found += _oversized(steps, values, max_arguments_bytes)
    if cycle is None:
        tree = plan.ancestors(steps)
        by_id = {s.subtask_id: s for s in steps}
        for step in steps:
            for key, value in step.input.items():
                found += _template_errors(defn, step, f"input.{key}", value, tree, by_id,
                                          values)
        for key, value in defn.output_mapping.items():
            found += _template_errors(defn, None, f"output_mapping.{key}", value,
                                      {"": set(ids)}, by_id, values)
    for step in steps:
        found += _capability_errors(step, tasks, single=not defn.subtasks)
        if not defn.input:
            # No input schema: the task's own signature and type hints are the schema.
            found += _typed_errors(step, tasks, values, single=not defn.subtasks)
    return found


def check(defn: TaskDefinition, values: Mapping[str, Any], tasks: Mapping[str, Any],
          max_arguments_bytes: int | None = None) -> None:
    """Raise ``GraphValidationError`` listing every problem of ``defn``, if any."""
    found = errors_of(defn, values, tasks, max_arguments_bytes)
    if found:
        raise GraphValidationError(defn.name, found)


def _input_errors(defn: TaskDefinition, values: Mapping[str, Any]) -> list[str]:
    if not defn.input:
        return []
    import jsonschema  # here: only a definition with an input schema needs it

    try:
        validator = jsonschema.validators.validator_for(defn.input)
        validator.check_schema(defn.input)
    except jsonschema.SchemaError as exc:
        return [f"input: not a valid JSON schema ({exc.message})"]
    problems = []
    for error in validator(defn.input).iter_errors(dict(values)):
        where = ".".join(str(p) for p in error.absolute_path)
        problems.append(f"input{'.' + where if where else ''}: {error.message} "
                        "(the task's input JSON schema)")
    return problems


def _non_json_numbers(steps: list[Subtask], values: Mapping[str, Any]) -> list[str]:
    """NaN and infinity in the input values or a subtask's literal input: JSON has neither,
    and the subtask's stored announcement would run every later attempt with null."""
    found = [problem] if (problem := non_json_number(dict(values), "input")) else []
    found += [f"subtask {step.subtask_id}: {problem}" for step in steps
              if (problem := non_json_number(step.input, "input"))]
    return found


def _oversized(steps: list[Subtask], values: Mapping[str, Any], limit: int) -> list[str]:
    """Input values, or a subtask's literal input, whose JSON is over ``limit`` bytes
    (``bidding_max_arguments_bytes``): a subtask's announcement would carry them, and
    ``.delay()`` refuses such arguments. (A template's value, known when the subtask starts,
    is checked then, by the announcement.)"""
    found = []
    for where, value in [("input", dict(values)),
                         *((f"subtask {s.subtask_id}: input", s.input) for s in steps)]:
        try:
            # As the announcement measures it: non-ASCII escaped, so characters are bytes.
            size = len(json.dumps(value))
        except (TypeError, ValueError):
            continue  # not JSON at all: not this check's to say
        if size > limit:
            found.append(f"{where}: {size} bytes of JSON, more than "
                         f"bidding_max_arguments_bytes ({limit})")
    return found


def _template_errors(defn: TaskDefinition, step: Subtask | None, field: str, value: Any,
                     tree: Mapping[str, set[str]], by_id: Mapping[str, Subtask],
                     values: Mapping[str, Any]) -> list[str]:
    who = f"subtask {step.subtask_id}" if step is not None else f"task {defn.name!r}"
    try:
        refs = references(value)
    except TemplateError as exc:
        return [f"{who}: {field}: {exc}"]
    deps = tree[step.subtask_id if step is not None else ""]
    return [f"{who}: {field}: {problem}" for ref in refs
            if (problem := _reference_problem(defn, ref, step, deps, by_id, values))]


def _reference_problem(defn: TaskDefinition, ref: Reference, step: Subtask | None,
                       deps: set[str], by_id: Mapping[str, Subtask],
                       values: Mapping[str, Any]) -> str | None:
    field = ref.field
    if ref.source == "parent":
        props = defn.input.get("properties") or {}
        if field is not None and field not in props and field not in values:
            return f"template {ref.text}: the task's input has no field {field!r}"
        return None
    if ref.source not in by_id:
        return f"template {ref.text}: no subtask {ref.source!r}"
    if ref.source not in deps:
        return (f"template {ref.text}: {ref.source} is not a dependency of "
                f"{step.subtask_id if step else 'the task'} (add it to depends_on)")
    mapping = by_id[ref.source].output_mapping
    if mapping and field is not None and field not in mapping.values():
        return (f"template {ref.text}: {ref.source}'s output_mapping does not produce "
                f"{field!r} (it produces {', '.join(map(repr, mapping.values()))})")
    return None


def _capability_errors(step: Subtask, tasks: Mapping[str, Any], *,
                       single: bool = False) -> list[str]:
    """Input names the step's task does not take, and arguments it needs that are missing
    (``single``: the step of a definition without subtasks, whose input is the task's)."""
    task = tasks.get(step.agent_capability)
    if task is None:
        offered = ", ".join(sorted(tasks)) or "none"
        return [f"subtask {step.subtask_id}: agent_capability {step.agent_capability!r}: no "
                f"registered task implements it (registered capabilities: {offered})"]
    taken = task_input(task.run)
    if taken is None or taken.open:
        return []
    who = "" if single else f"subtask {step.subtask_id}: "
    names = {p.name for p in taken.parameters}
    problems = [f"{who}input.{key}: task {task.name} "
                f"({step.agent_capability}) takes no argument {key!r}"
                f" (it takes: {', '.join(sorted(names)) or 'none'})"
                for key in step.input if key not in names]
    problems += [f"{who}input.{p.name}: missing; task {task.name} "
                 f"({step.agent_capability}) needs argument {p.name!r}"
                 + (f" ({p.hint})" if p.hint else "")
                 for p in taken.parameters if p.required and p.name not in step.input]
    return problems


def _typed_errors(step: Subtask, tasks: Mapping[str, Any], values: Mapping[str, Any], *,
                  single: bool = False) -> list[str]:
    """The step's input values known now (literals, the parent's input) that the types of its
    task's parameters do not take, naming the field and the type expected. A value another
    subtask's output makes is checked by no one before it runs."""
    task = tasks.get(step.agent_capability)
    if task is None:
        return []  # reported by _capability_errors
    taken = task_input(task.run)
    if taken is None:
        return []
    known: dict[str, Any] = {}
    for key, value in step.input.items():
        try:
            known[key] = resolve(value, values, {})
        except TemplateError:
            continue  # another subtask's output, or a template reported as such
    who = "" if single else f"subtask {step.subtask_id}: "
    return [f"{who}input.{path}: {problem}, in task {task.name} ({step.agent_capability})"
            for path, problem in type_errors(taken, known)]
