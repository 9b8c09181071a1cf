"""Saying what is wrong with a value, at the boundary: a pydantic validation error as one line
naming each field, its reason, the value given and the range allowed; and the floats JSON
cannot carry (NaN, infinity), found with their path (pure)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, get_args

import annotated_types
from pydantic import BaseModel, ValidationError

from bidding.errors import ConfigurationError

_BOUND_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def field_range(model: type[BaseModel], loc: Sequence[str | int]) -> str | None:
    """The range the field at ``loc`` (nested models followed) allows, as its bounds say it:
    ``[1, 10]``, ``(0, 600]``, ``>= 0``; None when it has no bound (or no such field)."""
    current: Any = model
    info = None
    for part in loc:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        info = current.model_fields.get(str(part))
        if info is None:
            return None
        # The model inside ``Model`` or ``Model | None``, if any, for the next part.
        annotation = info.annotation
        current = next((a for a in (annotation, *get_args(annotation))
                        if isinstance(a, type) and issubclass(a, BaseModel)), None)
    if info is None:
        return None
    low = high = None
    for bound in info.metadata:
        if isinstance(bound, (annotated_types.Ge, annotated_types.Gt)):
            low = (f"[{_number(bound.ge)}" if isinstance(bound, annotated_types.Ge)
                   else f"({_number(bound.gt)}")
        elif isinstance(bound, (annotated_types.Le, annotated_types.Lt)):
            high = (f"{_number(bound.le)}]" if isinstance(bound, annotated_types.Le)
                    else f"{_number(bound.lt)})")
    if low and high:
        return f"{low}, {high}"
    if low:
        return (">= " if low[0] == "[" else "> ") + low[1:]
    if high:
        return ("<= " if high[-1] == "]" else "< ") + high[:-1]
    return None


def _number(value: Any) -> str:
    # 86400.0 as a user writes it: 86400.
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


def describe_validation(exc: ValidationError, prefix: str = "",
                        names: Mapping[str, str] | None = None,
                        model: type[BaseModel] | None = None) -> str:
    """Render a pydantic error as ``field: reason (got value)`` clauses, field names prefixed.

    ``names`` maps a top-level field to the name the user wrote it under (used instead of
    ``prefix + field``), e.g. ``{"window": "BIDDING_WINDOW"}`` for a value from the environment.
    ``model``: the model validated; a number out of its field's bounds then also says the
    range allowed (``..., allowed: [1, 10]``).
    """
    parts = []
    names = names or {}
    for err in exc.errors():
        nested = (err.get("ctx") or {}).get("error")
        if isinstance(nested, ConfigurationError):
            # A model that validates itself on construction (RetryPolicy, given as a dict
            # inside an Announcement) already said "retry_policy.field: reason (got value)":
            # wrapping it in "retry_policy: Value error, ... (got {...})" would say it twice.
            parts.append(str(nested))
            continue
        loc = [str(p) for p in err["loc"]]
        if loc and loc[0] in names:
            field = ".".join([names[loc[0]], *loc[1:]])
        else:
            field = prefix + (".".join(loc) or "(root)")
        allowed = (field_range(model, err["loc"])
                   if model is not None and err["type"] in _BOUND_ERRORS else None)
        # A validator's own reason, without pydantic's "Value error, " in front of it.
        reason = str(err["msg"]).removeprefix("Value error, ")
        parts.append(f"{field}: {reason} (got {err.get('input')!r})"
                     + (f", allowed: {allowed}" if allowed else ""))
    return "; ".join(parts)


def non_json_number(value: Any, where: str) -> str | None:
    """The first float JSON cannot carry (NaN, Infinity, -Infinity) in ``value``, searched
    through its lists, tuples and dicts, as ``"where[1]['key']: NaN is not JSON"``; None when
    there is none.

    Python's ``json`` writes them anyway (``NaN``, which is not JSON), and a stored announcement
    (``model_dump(mode="json")``) as null: a call's first attempt would run with NaN and every
    later one (a retry, a re-award, a resend) with None. So they are refused where a call
    enters (``where`` names its root: ``args``, ``kwargs``, ``input``).
    """
    if isinstance(value, float):
        if math.isnan(value):
            return f"{where}: NaN is not JSON"
        if math.isinf(value):
            return f"{where}: {'-' if value < 0 else ''}Infinity is not JSON"
        return None
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        found = non_json_number(item, f"{where}[{key!r}]")
        if found is not None:
            return found
    return None
