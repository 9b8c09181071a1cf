"""Strategy names: the registry of built-ins, ``register_strategy``, and the resolver.

``resolve_strategy("composite")``, ``resolve_strategy(MyStrategy())`` and
``resolve_strategy("pkg.mod:MyStrategy")`` all give an object with
``select(bids, announcement, capabilities) -> Bid | None`` (rq's alias table plus dotted paths).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Collection
from typing import Any, cast

from bidding.errors import ConfigurationError, UnknownStrategyError
from bidding.strategies.builtins import (
    BestSkillMatch,
    Composite,
    HighestConfidence,
    Routing,
    WeightedScore,
)
from bidding.strategies.judge import AgentJudgment
from bidding.strategies.protocol import SelectionStrategy

#: Registered names. ``register_strategy`` adds more.
STRATEGIES: dict[str, Callable[[], SelectionStrategy]] = {
    "weighted": WeightedScore,
    "highest_confidence": HighestConfidence,
    "best_skill_match": BestSkillMatch,
    "composite": Composite,
    "routing": Routing,
    "agent_judgment": AgentJudgment,
}


def register_strategy(name: str, factory: Callable[[], SelectionStrategy]) -> None:
    """Make ``factory()`` available under ``name`` (e.g. for ``bidding={"strategy": name}``)."""
    STRATEGIES[name] = factory


def strategy_name(strategy: SelectionStrategy | str) -> str:
    """The name to record for a strategy: its registered name, else its class path."""
    if isinstance(strategy, str):
        return strategy
    name = getattr(strategy, "name", "")
    if isinstance(name, str) and name:
        return name
    cls = type(strategy)
    return f"{cls.__module__}:{cls.__qualname__}"


def resolve_strategy(spec: SelectionStrategy | str | type,
                     allowed: Collection[str] | None = None) -> SelectionStrategy:
    """A strategy object from a registered name, an object, a class, or ``"pkg.mod:Name"``.

    ``allowed``: the dotted paths that may be imported (None: any). A name that comes from a
    message or the store must be resolved with the node's allowlist: otherwise whoever can
    write to the broker could make every node import any installed module.

    Raises :class:`UnknownStrategyError` listing the valid names when nothing matches, or when
    a dotted path is not allowed.
    """
    if isinstance(spec, str):
        if spec in STRATEGIES:
            return STRATEGIES[spec]()
        if ":" in spec or "." in spec:
            if allowed is not None and spec not in allowed:
                raise UnknownStrategyError(
                    f"strategy: {spec!r} is not allowed here; list it in "
                    "bidding_allowed_strategies (BIDDING_ALLOWED_STRATEGIES) on the callers and "
                    "the nodes, or register it with bidding.register_strategy(name, factory)")
            return _check(_import(spec), spec)
        valid = ", ".join(sorted(STRATEGIES))
        raise UnknownStrategyError(
            f"strategy: unknown strategy {spec!r}; valid names: {valid}, "
            "or a dotted path such as 'package.module:MyStrategy'"
        )
    return _check(spec, repr(spec))


#: What :func:`import_path` raises for a path that does not name an importable object.
IMPORT_ERRORS = (ImportError, AttributeError, ValueError)


def import_path(path: str) -> Any:
    """The object at ``path``, "package.module:attr" or "package.module.attr" (the attribute
    may be dotted); raises one of :data:`IMPORT_ERRORS` when there is none."""
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _import(path: str) -> Any:
    try:
        obj = import_path(path)
    except IMPORT_ERRORS as exc:
        valid = ", ".join(sorted(STRATEGIES))
        raise UnknownStrategyError(
            f"strategy: cannot import {path!r} ({exc}); valid names: {valid}"
        ) from None
    return obj


def _check(obj: Any, label: str) -> SelectionStrategy:
    if not callable(getattr(obj, "select", None)):
        raise ConfigurationError(
            f"strategy: {label} has no select(bids, announcement, capabilities) method"
        )
    if inspect.isclass(obj):
        try:
            obj = obj()
        except Exception as exc:
            raise ConfigurationError(
                f"strategy: cannot instantiate {label} without arguments ({exc}); "
                "register a factory with bidding.register_strategy(name, factory)"
            ) from None
    return cast(SelectionStrategy, obj)
