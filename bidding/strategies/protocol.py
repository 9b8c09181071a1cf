"""The selection-strategy protocol (seed 003): what a strategy is, and how the award calls it.

``SelectionStrategy`` is anything with ``select(bids, announcement, capabilities)``; a
``ScoringStrategy``
also scores every bid, so that the award can record each breakdown for ``bidding explain``.
"""

from __future__ import annotations

import asyncio
import inspect
import weakref
from collections.abc import Awaitable, Mapping, Sequence
from typing import Protocol, TypeGuard, runtime_checkable

from pydantic import BaseModel, Field

from bidding.models import Announcement, Bid, Score


class NodeCapability(BaseModel):
    """What a bidder declares it can do (seed 001's AgentCapability)."""

    node: str
    skills: list[str] = Field(default_factory=list)
    description: str = ""


@runtime_checkable
class SelectionStrategy(Protocol):
    """Anything with this ``select`` method can choose the winner of an auction.

    ``bids`` are the valid bids (already filtered by min_confidence, min_trust and budget).
    ``select`` may also be ``async def`` (seed 003's form); it is then run to completion.
    """

    def select(
        self,
        bids: Sequence[Bid],
        announcement: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> Bid | Awaitable[Bid | None] | None:
        """Return the winning bid, or None when no bid is acceptable."""
        ...


@runtime_checkable
class ScoringStrategy(SelectionStrategy, Protocol):
    """A strategy that can also score the bids, so the award can record every breakdown.

    Scores are computed for the whole auction at once: some terms (Routing's cost) are relative
    to the other bids.
    """

    def score_all(
        self,
        bids: Sequence[Bid],
        announcement: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> list[Score]:
        """Score every bid of one auction."""
        ...


#: The strategy classes that define both ``select`` and ``score_all`` themselves: their every
#: instance scores its bids. ``isinstance`` against a runtime-checkable protocol looks up each
#: member, about 8 us, and an auction asks a few times. Weakly, so that a class made per call
#: (a factory's) does not stay for ever.
_scoring_classes: weakref.WeakKeyDictionary[type, bool] = weakref.WeakKeyDictionary()


def is_scoring(strategy: SelectionStrategy) -> TypeGuard[ScoringStrategy]:
    """Whether ``strategy`` is a ``ScoringStrategy`` (it scores every bid). Known per class when
    the class defines both methods; asked of the object itself otherwise (a module named by a
    dotted path, a namespace, a wrapper passing attributes through: objects of one type that
    may differ)."""
    kind = type(strategy)
    known = _scoring_classes.get(kind)
    if known is None:
        known = _scoring_classes[kind] = (callable(getattr(kind, "select", None))
                                          and callable(getattr(kind, "score_all", None)))
    return known or isinstance(strategy, ScoringStrategy)


def decides_at_once(strategy: SelectionStrategy) -> bool:
    """Whether ``strategy`` decides in microseconds, so an award may decide under its write lock:
    a scoring strategy that consults no judge. A judge (an LLM, or any callable) may take
    seconds; the award decides outside the lock first and re-checks the counts under it."""
    return is_scoring(strategy) and getattr(strategy, "judge", None) is None


def capabilities_of(bids: Sequence[Bid]) -> dict[str, NodeCapability]:
    """The capability map of the bidders, built from what each bid declares."""
    return {b.node: NodeCapability(node=b.node, skills=list(b.skills)) for b in bids}


def run_select(
    strategy: SelectionStrategy,
    bids: Sequence[Bid],
    announcement: Announcement,
    capabilities: Mapping[str, NodeCapability],
) -> Bid | None:
    """Call ``strategy.select``, running it to completion when it is a coroutine (seed 003)."""
    result = strategy.select(bids, announcement, capabilities)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Awaitable[Bid | None]) -> Bid | None:
    return await awaitable
