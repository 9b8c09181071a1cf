"""``${parent.input.x}`` and ``${subtask_id.output.y}`` templates (seed 004 section 3.2), pure.

A string that is one template only resolves to the value itself, keeping its JSON type
(``"${parent.input.max_pages}"`` stays an integer); a template inside a longer string is
replaced by the value's text (JSON for anything but a string). Templates are found in nested
lists and mappings too.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from bidding.errors import ConfigurationError

_TEMPLATE = re.compile(r"\$\{([^{}]*)\}")


class TemplateError(ConfigurationError):
    """A template that cannot be parsed or resolved; the message names it."""


@dataclass(frozen=True)
class Reference:
    """What a template points at: ``parent.input`` or ``<subtask>.output``, then a path."""

    text: str
    #: ``"parent"`` or a subtask id.
    source: str
    #: ``"input"`` (of the parent) or ``"output"`` (of a subtask).
    part: str
    path: tuple[str, ...]

    @property
    def field(self) -> str | None:
        """The first field of the path (what an output mapping must produce)."""
        return self.path[0] if self.path else None


def parse(expression: str) -> Reference:
    """The reference of ``${expression}``; an error naming it when it is malformed."""
    parts = [p.strip() for p in expression.split(".")]
    text = "${" + expression + "}"
    if len(parts) < 2 or any(not p for p in parts):
        raise TemplateError(f"template {text}: expected ${{parent.input.<field>}} or "
                            "${<subtask_id>.output.<field>}")
    source, part, path = parts[0], parts[1], tuple(parts[2:])
    if source == "parent" and part != "input":
        raise TemplateError(f"template {text}: the parent's data is parent.input")
    if source != "parent" and part != "output":
        raise TemplateError(f"template {text}: a subtask's data is {source}.output")
    return Reference(text, source, part, path)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def references(value: Any) -> list[Reference]:
    """Every template in ``value`` (a string, or nested lists and mappings of them)."""
    return [parse(m.group(1)) for s in _strings(value) for m in _TEMPLATE.finditer(s)]


def lookup(ref: Reference, parent_input: Mapping[str, Any],
           outputs: Mapping[str, Mapping[str, Any]]) -> Any:
    """The value ``ref`` points at; an error naming the template when there is none."""
    if ref.source == "parent":
        value: Any = parent_input
    elif ref.source in outputs:
        value = outputs[ref.source]
    else:
        raise TemplateError(f"template {ref.text}: {ref.source} has no output (yet)")
    for i, key in enumerate(ref.path):
        if isinstance(value, Mapping) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            where = ".".join((ref.source, ref.part, *ref.path[:i])) or ref.source
            raise TemplateError(f"template {ref.text}: {where} has no field {key!r}")
    return value


def resolve(value: Any, parent_input: Mapping[str, Any],
            outputs: Mapping[str, Mapping[str, Any]]) -> Any:
    """``value`` with every template replaced (whole-value templates keep their JSON type)."""
    if isinstance(value, Mapping):
        return {k: resolve(v, parent_input, outputs) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [resolve(v, parent_input, outputs) for v in value]
    if not isinstance(value, str):
        return value
    whole = _TEMPLATE.fullmatch(value)
    if whole is not None:
        return lookup(parse(whole.group(1)), parent_input, outputs)

    def text(match: re.Match[str]) -> str:
        found = lookup(parse(match.group(1)), parent_input, outputs)
        return found if isinstance(found, str) else json.dumps(found)

    return _TEMPLATE.sub(text, value)


def apply_mapping(output: Any, mapping: Mapping[str, str], subtask_id: str) -> dict[str, Any]:
    """A subtask's output as downstream sees it: renamed by ``mapping`` (task field -> name),
    or the whole output when the mapping is empty. An error names a missing field."""
    if not isinstance(output, Mapping):
        if mapping:
            raise TemplateError(f"subtask {subtask_id}: output is not a JSON object "
                                f"(got {type(output).__name__}), so output_mapping cannot apply")
        return {"result": output}
    if not mapping:
        return dict(output)
    missing = [field for field in mapping if field not in output]
    if missing:
        raise TemplateError(f"subtask {subtask_id}: output has no field "
                            f"{', '.join(map(repr, missing))} named in output_mapping "
                            f"(it has {', '.join(map(repr, output)) or 'none'})")
    return {name: output[field] for field, name in mapping.items()}
