"""A task's input schema derived from its signature and type hints (pure), for a definition
that gives none: ``def split(self, text: str)`` takes ``{"text": <a string>}``.

Each parameter's type hint becomes its JSON schema through pydantic (a pydantic model, as a
``pydantic=True`` task takes, becomes its object schema); a parameter without a hint, or with
one JSON schema cannot express, takes anything. The values are checked as JSON (strictly: the
body gets them as they are, so "5" is not an integer).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter

if TYPE_CHECKING:
    import jsonschema

__all__ = ["Parameter", "TaskInput", "task_input", "type_errors"]


@dataclass(frozen=True)
class Parameter:
    """One keyword argument a task takes: its name, its hint as written, its JSON schema."""

    name: str
    hint: str
    schema: dict[str, Any]
    required: bool


@dataclass(frozen=True)
class TaskInput:
    """The keyword arguments a task's ``run`` takes, as a JSON schema."""

    parameters: tuple[Parameter, ...]
    #: It takes ``**kwargs``: any other name too.
    open: bool
    #: Schemas the parameters' schemas refer to (``#/$defs/Name``: a pydantic model's).
    defs: dict[str, Any] = field(default_factory=dict)

    @property
    def schema(self) -> dict[str, Any]:
        """The whole input's JSON schema."""
        derived: dict[str, Any] = {
            "type": "object",
            "properties": {p.name: p.schema for p in self.parameters},
            "required": [p.name for p in self.parameters if p.required],
            "additionalProperties": self.open,
        }
        if self.defs:
            derived["$defs"] = self.defs
        return derived

    def hint_of(self, name: str) -> str | None:
        """How parameter ``name``'s type is written, or None."""
        return next((p.hint for p in self.parameters if p.name == name), None)


def _hints(run: Callable[..., Any]) -> dict[str, Any]:
    """The resolved type hints of ``run``'s function (under ``from __future__ import
    annotations`` they are strings until resolved); {} when they cannot be resolved."""
    function = inspect.unwrap(getattr(run, "__func__", run))
    try:
        return typing.get_type_hints(function)
    except Exception:  # a name the hints use is not importable: check nothing by type
        return {}


def _hint_text(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def task_input(run: Callable[..., Any]) -> TaskInput | None:
    """The input schema of a task whose body is ``run`` (the task's bound ``run``: ``self``
    is not a parameter); None when its signature cannot be read."""
    try:
        signature = inspect.signature(run)
    except (TypeError, ValueError):
        return None
    hints = _hints(run)
    parameters = []
    defs: dict[str, Any] = {}
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    for p in signature.parameters.values():
        if p.kind not in kinds:
            continue
        hint = hints.get(p.name, p.annotation)
        schema: dict[str, Any] = {}
        if hint is not inspect.Parameter.empty and not isinstance(hint, str):
            try:
                schema = TypeAdapter(hint).json_schema()
            except Exception:  # pydantic cannot express it: anything goes
                schema = {}
        defs.update(schema.pop("$defs", {}))
        parameters.append(Parameter(
            p.name, "" if hint is inspect.Parameter.empty else _hint_text(hint), schema,
            p.default is inspect.Parameter.empty))
    open_ = any(p.kind is inspect.Parameter.VAR_KEYWORD
                for p in signature.parameters.values())
    return TaskInput(tuple(parameters), open_, defs)


#: Characters of a refused value shown in its error.
_SHOWN = 80


def _expected(error: jsonschema.ValidationError) -> str:
    """What an error's schema asked for, in words: ``string``, ``integer or null``..."""
    if error.validator == "type":
        wanted = error.validator_value
        return " or ".join(wanted) if isinstance(wanted, list) else str(wanted)
    if error.validator in ("anyOf", "oneOf"):
        kinds = [str(s.get("type") or s.get("$ref", "?").rsplit("/", 1)[-1])
                 for s in error.validator_value if isinstance(s, dict)]
        return " or ".join(kinds)
    return ""


def type_errors(taken: TaskInput, values: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(field, problem) for each of ``values`` (argument name -> JSON value) that its
    parameter's type does not take; names it does not know are not this check's."""
    known = {p.name: p.schema for p in taken.parameters if p.schema}
    checked = {k: v for k, v in values.items() if k in known}
    if not checked:
        return []
    schema: dict[str, Any] = {"type": "object",
                              "properties": {k: known[k] for k in checked}}
    if taken.defs:
        schema["$defs"] = taken.defs
    import jsonschema  # here: only a submit with typed parameters needs it

    found = []
    validator = jsonschema.Draft202012Validator(schema)
    for error in sorted(validator.iter_errors(dict(checked)), key=lambda e: list(e.path)):
        path = ".".join(str(p) for p in error.absolute_path)
        expected = _expected(error)
        name = str(error.absolute_path[0]) if error.absolute_path else ""
        hint = taken.hint_of(name) or ""
        got = repr(error.instance)
        got = got if len(got) <= _SHOWN else got[:_SHOWN] + "..."
        problem = f"expected {expected}, got {got}" if expected else error.message
        found.append((path, f"{problem} ({name}: {hint})" if hint else problem))
    return found
