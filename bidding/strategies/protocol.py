"""The selection-strategy protocol (seed 003): what a strategy is, and how the award calls it.

``SelectionStrategy`` is anything with ``select(bids, announcement, capabilities)``; a
``ScoringStrategy``
also scores every bid, so that the award can record each breakdown for ``bidding explain``.
"""

from __future__ import annotations

import asyncio
import inspect
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


#: Whether each strategy class scores its bids: ``isinstance`` against a runtime-checkable
#: protocol looks up its every member, about 8 us, and an auction asks a few times.
_scoring: dict[type, bool] = {}


def is_scoring(strategy: SelectionStrategy) -> TypeGuard[ScoringStrategy]:
    """Whether ``strategy`` is a ``ScoringStrategy`` (it scores every bid), known per class."""
    kind = type(strategy)
    scoring = _scoring.get(kind)
    if scoring is None:
        scoring = _scoring[kind] = isinstance(strategy, ScoringStrategy)
    return scoring


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
