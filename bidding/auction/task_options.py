"""Checking a bidding task's class when it is made: misspelt options and bad defaults.

``@app.task(base=BiddingTask, required_skill=[...])`` makes a subclass whose class attributes
are the decorator's options, so a misspelt option is an attribute nothing reads: the task would
run without the skills it meant to require. ``check_task_class`` refuses such a name when it is
close to a bidding option, and refuses defaults (``bidding={...}``, ``retry_policy``...) that
every call would be refused for, before the first call.
"""

from __future__ import annotations

import difflib
import inspect
from typing import Any

from pydantic import ValidationError

from bidding.auction.announcement import check_options
from bidding.errors import ConfigurationError
from bidding.models import OPTION_KEYS, Announcement, describe_validation

#: The options a bidding task takes as class attributes (decorator keywords).
CLASS_OPTIONS: tuple[str, ...] = ("task_type", "required_skills", "bidding", "retry_policy",
                                  "resources", "affinity")
#: Celery decorator options that become class attributes without being attributes of Celery's
#: Task (``celery.app.autoretry`` reads them with getattr): never taken for typos.
CELERY_OPTIONS: frozenset[str] = frozenset({
    "autoretry_for", "dont_autoretry_for", "retry_kwargs", "retry_backoff", "retry_backoff_max",
    "retry_jitter",
})
#: Names that mean a bidding option without being spelt like it (the seeds' and the node
#: profiles' word for skills).
ALIASES: dict[str, str] = {"skills": "required_skills", "capabilities": "required_skills",
                           "required_capabilities": "required_skills"}
#: How alike (difflib's ratio) a name must be to an option to count as its misspelling: high
#: enough that a task's own attributes (``max_size``, ``bid``) are left alone.
CUTOFF = 0.75
#: Options only a call or ``bidding={...}`` sets (not class attributes).
_CALL_OPTIONS = tuple(k for k in OPTION_KEYS if k not in CLASS_OPTIONS)


def check_task_class(cls: type) -> None:
    """Refuse a bidding task class with a misspelt option or defaults no call could use.

    Raises :class:`ConfigurationError` naming the task and the option, with a did-you-mean for
    a name close to a bidding option (``required_skill`` -> ``required_skills``; ``budget`` ->
    ``bidding={'budget': ...}``). Names that Celery's Task or a base class defines, private
    names and methods are never taken for options.
    """
    name = getattr(cls, "name", None) or cls.__qualname__
    for attr, value in vars(cls).items():
        if (attr.startswith("_") or attr in CELERY_OPTIONS or _is_code(value)
                or any(attr in vars(base) for base in cls.__mro__[1:])):
            continue
        meant = _meant(attr)
        if meant is not None:
            raise ConfigurationError(
                f"task {name}: unknown option {attr}={value!r}; did you mean {meant}?")
    _check_defaults(cls, name)


def _is_code(value: Any) -> bool:
    """Methods, properties and nested classes: a task's code, not its options."""
    return inspect.isroutine(value) or isinstance(value, (staticmethod, classmethod, property,
                                                          type))


def _meant(attr: str) -> str | None:
    """The option ``attr`` probably meant, as the user should write it; None if none."""
    if attr in _CALL_OPTIONS:
        return f"bidding={{{attr!r}: ...}}"
    if attr in ALIASES:
        return ALIASES[attr]
    close = difflib.get_close_matches(attr, (*CLASS_OPTIONS, *_CALL_OPTIONS), n=1,
                                      cutoff=CUTOFF)
    if not close:
        return None
    return close[0] if close[0] in CLASS_OPTIONS else f"bidding={{{close[0]!r}: ...}}"


def _check_defaults(cls: type, name: str) -> None:
    """Validate the task's defaults as a call with no options of its own would use them."""
    defaults: Any = getattr(cls, "bidding", None) or {}
    check_options(defaults, f"task {name}: bidding")
    merged: dict[str, Any] = {
        "task_type": getattr(cls, "task_type", None) or name.rsplit(".", 1)[-1],
        "required_skills": getattr(cls, "required_skills", None) or (),
        "retry_policy": getattr(cls, "retry_policy", None),
        "resources": getattr(cls, "resources", None) or {},
        "affinity": getattr(cls, "affinity", None) or [],
    }
    merged.update({k: v for k, v in defaults.items() if v is not None})
    skills = merged["required_skills"]
    merged["required_skills"] = [skills] if isinstance(skills, str) else list(skills)
    # A strategy is resolved at the call, with the caller's settings and registered names
    # (an app may register it after this class is made).
    merged.pop("strategy", None)
    try:
        Announcement(task_id="-", task_name=name, **merged)
    except ValidationError as exc:
        raise ConfigurationError(
            f"bidding options of {name}: {describe_validation(exc)}") from None
