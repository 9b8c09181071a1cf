"""Building an announcement from a call: task-level defaults, call options and settings merged
and validated at the boundary, so bad input fails in the caller's process with the field named.
"""

from __future__ import annotations

import difflib
import json
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from bidding import clock
from bidding.auction.rules import apply_rules, strings_of
from bidding.config import Settings
from bidding.errors import ConfigurationError
from bidding.execution.timing import expiry_time
from bidding.models import OPTION_KEYS, Announcement, describe_validation, non_json_number
from bidding.strategies.resolver import resolve_strategy, strategy_name

if TYPE_CHECKING:
    from celery import Task


def check_options(options: Mapping[str, Any], where: str) -> None:
    """Refuse unknown ``bidding={...}`` keys, naming them (with the option a misspelt one
    probably meant) and listing the valid ones."""
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        meant = {u: close[0] for u in unknown
                 if (close := difflib.get_close_matches(u, OPTION_KEYS, n=1, cutoff=0.75))}
        if len(unknown) == 1 and meant:
            hint = f"did you mean {meant[unknown[0]]}?; "
        elif meant:
            hint = f"did you mean {', '.join(f'{u} -> {m}' for u, m in meant.items())}?; "
        else:
            hint = ""
        raise ConfigurationError(
            f"{where}: unknown option(s) {', '.join(unknown)}; {hint}"
            f"valid options: {', '.join(OPTION_KEYS)}"
        )


def _strategy_spec(value: Any, allowed: frozenset[str]) -> str:
    """A strategy as a string that a worker can resolve (names and importable classes), and
    may (a dotted path must be in ``allowed``, the ``bidding_allowed_strategies``)."""
    if isinstance(value, str):
        resolve_strategy(value, allowed)  # fail here, at the boundary, not later on a worker
        return value
    name = strategy_name(resolve_strategy(value))
    try:
        resolve_strategy(name)
    except ConfigurationError:
        raise ConfigurationError(
            f"strategy: {value!r} cannot be rebuilt on a worker; register it with "
            "bidding.register_strategy(name, factory) in your app module and pass the name"
        ) from None
    resolve_strategy(name, allowed)
    return name


def _skill_list(skills: Any) -> list[Any]:
    """A single skill name counts as one skill, not as its letters."""
    return [skills] if isinstance(skills, str) else list(skills)


def arguments_json(task_name: str, args: Sequence[Any] | None,
                   kwargs: Mapping[str, Any] | None, limit: int | None = None) -> str:
    """The JSON of a call's arguments; a clear error, naming the task, if JSON cannot carry
    them or the store cannot keep them (a new call, or ``self.retry(args=...)``): NaN and
    infinity too, naming the argument, since the stored announcement would give every later
    attempt null instead; and, past ``limit`` bytes (``bidding_max_arguments_bytes``), naming
    the size."""
    arguments = [list(args or ()), dict(kwargs or {})]
    odd = non_json_number(arguments[0], "args") or non_json_number(arguments[1], "kwargs")
    if odd is not None:
        raise ConfigurationError(
            f"args/kwargs of {task_name}: {odd}; celery-bidding sends JSON only "
            "(a retry would run with null)")
    try:
        payload = json.dumps(arguments, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"args/kwargs of {task_name}: not JSON serializable ({exc}); "
            "celery-bidding sends JSON only"
        ) from None
    # json.dumps escapes every non-ASCII character, so its length is its size in bytes.
    if limit is not None and len(payload) > limit:
        raise ConfigurationError(
            f"args/kwargs of {task_name}: {len(payload)} bytes of JSON, more than "
            f"bidding_max_arguments_bytes ({limit}); pass large data by reference (a URL, "
            "a path, a key) instead")
    # JSON escapes both (as \u0000 and \ud800): only a payload holding such an escape is walked.
    if "\\u0000" in payload or "\\ud" in payload:
        refuse_unstorable(f"args/kwargs of {task_name}",
                          {"args": list(args or ()), "kwargs": dict(kwargs or {})})
    return payload


def unstorable(value: Any, path: str = "") -> tuple[str, str] | None:
    """Where in ``value`` (JSON: lists, dicts, scalars) a string is that the store cannot keep
    on every database, and what it holds: a NUL character (PostgreSQL's text and JSON refuse
    it; SQLite keeps it) or half of a surrogate pair (UTF-8 cannot encode it). None if none."""
    if isinstance(value, str):
        if "\x00" in value:
            return path, "a NUL character"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return path, "half of a surrogate pair (not encodable as UTF-8)"
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            where = f"{path}[{key!r}]" if path else str(key)
            found = unstorable(key, where + " (its key)") or unstorable(item, where)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = unstorable(item, f"{path}[{i}]")
            if found:
                return found
    return None


def refuse_unstorable(where: str, value: Any) -> None:
    """Refuse ``value`` if it holds a string the store cannot keep (``unstorable``), naming
    where it is: at ``.delay()``, before anything is written, with the journal on or off and
    on every store (PostgreSQL would refuse it, SQLite would keep it)."""
    found = unstorable(value)
    if found is not None:
        path, what = found
        raise ConfigurationError(
            f"{where}: {path} holds {what}, which the store cannot keep on every database "
            "(PostgreSQL refuses it); remove it, or send the data encoded (base64, say)")


def pydantic_arguments(task: Task, args: Sequence[Any] | None,
                       kwargs: Mapping[str, Any] | None) -> tuple[list[Any], dict[str, Any]]:
    """The call's arguments, with the pydantic models a ``pydantic=True`` task takes dumped to
    JSON as Celery's own ``apply_async`` dumps them (its body gets them back as models)."""
    dump = getattr(task, "_dump_pydantic_arguments", None)
    if dump is not None:
        args, kwargs = dump(args, kwargs)
    return list(args or ()), dict(kwargs or {})


def build_announcement(
    task: Task,
    settings: Settings,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    options: Mapping[str, Any],
    task_id: str | None = None,
) -> Announcement:
    """Merge task-level defaults, call options and settings into a validated announcement."""
    check_options(options, "bidding")
    args, kwargs = pydantic_arguments(task, args, kwargs)
    payload = arguments_json(task.name, args, kwargs, settings.max_arguments_bytes)
    capability = getattr(task, "capability", None)
    merged: dict[str, Any] = {
        "task_type": (getattr(task, "task_type", None) or capability
                      or task.name.rsplit(".", 1)[-1]),
        # A task implementing an AITP capability needs nodes with that skill by default.
        "required_skills": _skill_list(getattr(task, "required_skills", None)
                                       or ([capability] if capability else ())),
        # What one attempt holds on its node, and the items it would like warm there.
        "resources": getattr(task, "resources", None) or {},
        "affinity": getattr(task, "affinity", None) or [],
        "strategy": settings.strategy,
        "no_bid": settings.no_bid,
        "window": settings.window,
        "min_confidence": settings.min_confidence,
        "min_trust": settings.min_trust,
        "candidate_cap": settings.candidate_cap,
        # Kept with the task: the sweepers that watch it go by the announcer's limit.
        "schedule_to_start_timeout": settings.schedule_to_start_timeout,
        "content": payload,
    }
    merged.update({k: v for k, v in options.items() if v is not None})
    # Celery's expires: an absolute time on the store's clock, from this call's time.
    now = clock.now()
    try:
        expires_at = expiry_time(merged.pop("expires", None), now)
    except ConfigurationError as exc:
        raise ConfigurationError(f"bidding options of {task.name}: {exc}") from None
    merged["strategy"] = _strategy_spec(merged["strategy"], settings.strategy_allowlist)
    merged["required_skills"] = _skill_list(merged.get("required_skills") or ())
    # Seed 000's coordinator rules (opt-in), where the call says nothing: the content's own
    # text only when it is not the arguments' JSON (their keys are no keywords).
    content = str(merged["content"]) if merged["content"] != payload else ""
    inferred = apply_rules(merged, (content, *strings_of([args, kwargs])),
                           settings.skill_keywords, settings.preferred_nodes)
    if inferred:
        merged["inferred"] = inferred
    # The options too (args and kwargs were checked by arguments_json).
    refuse_unstorable(f"bidding options of {task.name}", merged)
    try:
        return Announcement(
            task_id=task_id or str(uuid.uuid4()),
            task_name=task.name,
            args=args,
            kwargs=kwargs,
            announced_at=now,
            expires_at=expires_at,
            **merged,
        )
    except ValidationError as exc:
        raise ConfigurationError(
            f"bidding options of {task.name}: {describe_validation(exc)}"
        ) from None
