"""Selection strategies (seed 003): a protocol, the built-ins, and a resolver.

``resolve_strategy("composite")``, ``resolve_strategy(MyStrategy())`` and
``resolve_strategy("pkg.mod:MyStrategy")`` all give an object with
``select(bids, rfp, capabilities) -> Bid | None``. Built-ins also expose ``score`` so that
``bidding explain`` can show every bid's breakdown; ties are broken at random.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, cast, runtime_checkable

from pydantic import BaseModel, Field

from bidding import scoring
from bidding.errors import ConfigurationError, UnknownStrategyError
from bidding.models import Announcement, Bid, Score

#: Scores closer than this are a tie.
TIE_EPSILON = 1e-9


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
        rfp: Announcement,
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
        rfp: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> list[Score]:
        """Score every bid of one auction."""
        ...


def decides_at_once(strategy: SelectionStrategy) -> bool:
    """Whether ``strategy`` decides in microseconds, so an award may decide under its write lock:
    a scoring strategy that consults no judge. A judge (an LLM, or any callable) may take
    seconds; the award decides outside the lock first and re-checks the counts under it."""
    return isinstance(strategy, ScoringStrategy) and getattr(strategy, "judge", None) is None


def capabilities_of(bids: Sequence[Bid]) -> dict[str, NodeCapability]:
    """The capability map of the bidders, built from what each bid declares."""
    return {b.node: NodeCapability(node=b.node, skills=list(b.skills)) for b in bids}


def _skills_of(bid: Bid, capabilities: Mapping[str, NodeCapability]) -> list[str]:
    cap = capabilities.get(bid.node)
    return list(cap.skills) if cap is not None else list(bid.skills)


def break_tie(tied: Sequence[Bid], rng: random.Random) -> Bid:
    """Among equally scored bids, the least busy node (in-flight / capacity), then at random.

    Concurrent auctions over equal idle nodes would otherwise pile onto one node by chance;
    the award refreshes each bid's in-flight count first, so this is the in-flight reservation.
    """
    if len(tied) == 1:
        return tied[0]
    busy = {b.node: b.in_flight / b.capacity for b in tied}
    least = min(busy.values())
    return rng.choice([b for b in tied if busy[b.node] <= least + TIE_EPSILON])


@dataclass
class _Scored:
    """Shared ranking for the built-ins: highest score wins; see ``break_tie`` for ties."""

    name: ClassVar[str] = ""
    #: Keyword-only, so ``WeightedScore(0.2, 0.8)`` sets the weights as in seed 003.
    rng: random.Random = field(default_factory=random.Random, repr=False, compare=False,
                               kw_only=True)

    def score_all(
        self,
        bids: Sequence[Bid],
        rfp: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> list[Score]:
        """Score every bid of one auction."""
        return [self.score(b, rfp, capabilities) for b in bids]

    def score(
        self, bid: Bid, rfp: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """Score one bid (implemented by each built-in)."""
        raise NotImplementedError

    def select(
        self,
        bids: Sequence[Bid],
        rfp: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> Bid | None:
        """The highest-scoring bid; among equal scores the least busy, then one at random."""
        if not bids:
            return None
        scores = self.score_all(bids, rfp, capabilities)
        scored = [(s.total, b) for s, b in zip(scores, bids, strict=True)]
        best = max(total for total, _ in scored)
        tied = [b for total, b in scored if best - total <= TIE_EPSILON]
        return break_tie(tied, self.rng)


@dataclass
class HighestConfidence(_Scored):
    """Seed 003 3.1: the most confident bid wins."""

    name: ClassVar[str] = "highest_confidence"

    def score(
        self, bid: Bid, rfp: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """The bid's confidence."""
        return Score(node=bid.node, total=bid.confidence, terms={"confidence": bid.confidence})


@dataclass
class BestSkillMatch(_Scored):
    """Seed 003 3.2: the bid whose node covers most of the required skills wins."""

    name: ClassVar[str] = "best_skill_match"

    def score(
        self, bid: Bid, rfp: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """Fraction of required skills covered (0 when the task requires none, as in seed 003)."""
        match = scoring.skill_match(rfp.required_skills, _skills_of(bid, capabilities))
        return Score(node=bid.node, total=match, terms={"skill_match": match})


@dataclass
class WeightedScore(_Scored):
    """Seed 003 3.3, the default: ``0.6 * confidence + 0.4 * skill match``, x slot share.

    Without required skills the seeds disagree (001: bare confidence; 003: confidence * 0.6).
    We follow seed 001: the score is the bare confidence, so it stays on the same 0-1 scale as
    a fully matched bid's; the ranking is the same either way.

    ``slot_share`` (our addition, on by default) multiplies the score by
    ``min(1, capacity / (in_flight + 1))``: among nodes with a free slot the best estimate wins,
    and a full node wins only when it is proportionally better, instead of queueing work behind
    its busy slots (bench/quality.py: P2). ``WeightedScore(slot_share=False)`` is seed 003's form.
    """

    name: ClassVar[str] = "weighted"
    confidence_weight: float = 0.6
    skill_weight: float = 0.4
    slot_share: bool = True

    def __post_init__(self) -> None:
        for label, w in (("confidence_weight", self.confidence_weight),
                         ("skill_weight", self.skill_weight)):
            if w < 0:
                raise ConfigurationError(f"WeightedScore.{label}: must be >= 0 (got {w})")

    def score(
        self, bid: Bid, rfp: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """Weighted confidence and skill match (bare confidence when no skill is required),
        times the slot share."""
        if not rfp.required_skills:
            terms = {"confidence": bid.confidence}
        else:
            match = scoring.skill_match(rfp.required_skills, _skills_of(bid, capabilities))
            terms = {
                "confidence": self.confidence_weight * bid.confidence,
                "skill_match": self.skill_weight * match,
            }
        total = sum(terms.values())
        multipliers: dict[str, float] = {}
        share = scoring.slot_share(bid.in_flight, bid.capacity) if self.slot_share else 1.0
        if share < 1.0:
            multipliers["slot_share"] = share
            total *= share
        return Score(node=bid.node, total=total, terms=terms, multipliers=multipliers)


@dataclass
class Composite(_Scored):
    """Seed 000's composite score: capability 40%, experience 30%, load 20%, confidence 10%."""

    name: ClassVar[str] = "composite"

    def score(
        self, bid: Bid, rfp: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """The composite with the preferred-node bonus and recent-failure penalty, capped at 1."""
        total, terms, multipliers = scoring.composite_score(
            bid.capability,
            bid.experience,
            bid.load,
            bid.confidence,
            is_preferred_node=bid.is_preferred_node,
            recent_failures=bid.recent_failures,
        )
        return Score(node=bid.node, total=total, terms=terms, multipliers=multipliers)


@dataclass
class Routing(_Scored):
    """AITP 4.2's routing score over capability, trust, latency and cost.

    ``max_cost`` is the task's budget when it has one, else the dearest bid of the auction.
    """

    name: ClassVar[str] = "routing"

    def score_all(
        self,
        bids: Sequence[Bid],
        rfp: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> list[Score]:
        """Score every bid against the auction's own cost range."""
        max_cost = self.max_cost(bids, rfp)
        return [self._score(b, max_cost) for b in bids]

    @staticmethod
    def max_cost(bids: Sequence[Bid], rfp: Announcement) -> float:
        """The cost that scores 0: the budget, else the highest bid cost."""
        if rfp.budget is not None and rfp.budget > 0:
            return rfp.budget
        return max((b.cost for b in bids), default=0.0)

    def score(
        self, bid: Bid, rfp: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Score:
        """The routing score of a bid alone (its cost range is its own budget or cost)."""
        return self._score(bid, self.max_cost([bid], rfp))

    @staticmethod
    def _score(bid: Bid, max_cost: float) -> Score:
        total, terms = scoring.routing_score(
            bid.capability, bid.trust, bid.latency_ms, bid.cost, max_cost
        )
        return Score(node=bid.node, total=total, terms=terms)


class Judgment(BaseModel):
    """What a judge returns (seed 003's JudgmentResult)."""

    selected_agent_id: str = Field(description="Node name of the winning bid")
    reasoning: str = Field(default="", description="Why this node was selected")


#: A judge sees the bids, the task and the capabilities, and names a winner.
Judge = Callable[[Sequence[Bid], Announcement, Mapping[str, NodeCapability]], Judgment]


def judgment_prompt(
    bids: Sequence[Bid], rfp: Announcement, capabilities: Mapping[str, NodeCapability]
) -> str:
    """The procurement prompt of seed 003, listing every bid and its node's skills."""
    bids_text = "\n".join(
        f"- {b.node}: confidence={b.confidence:.2f}, cost={b.cost:.4f}, "
        f'latency_ms={b.latency_ms:.0f}, proposal="{b.proposal}"'
        for b in bids
    )
    bidders = {b.node for b in bids}
    caps_text = "\n".join(
        f"- {c.node}: skills={c.skills}" for c in capabilities.values() if c.node in bidders
    )
    return (
        f"Task: {rfp.content or rfp.task_type}\n"
        f"Required skills: {rfp.required_skills}\n\n"
        f"Agent capabilities:\n{caps_text}\n\n"
        f"Bids:\n{bids_text}\n\n"
        "Select the best agent."
    )


JUDGE_SYSTEM_PROMPT = (
    "You are a procurement specialist. Given a task and multiple bids, select the best bidder "
    "based on:\n1. How well their skills match the requirements\n2. Quality and clarity of "
    "their proposal\n3. Confidence level (but don't over-weight it)\n\n"
    "Choose the agent most likely to succeed. Answer with the node name as selected_agent_id."
)


def llm_judge(model: Any) -> Judge:
    """A judge backed by a pydantic-ai model (``pip install 'celery-bidding[llm]'``).

    ``model`` is anything pydantic-ai accepts: a model name such as ``"openai:gpt-4o"`` or a
    model object (``TestModel()``, ``FunctionModel(...)`` in tests).
    """
    try:
        from pydantic_ai import Agent
    except ImportError as exc:  # pragma: no cover - depends on the optional extra
        raise ConfigurationError(
            "AgentJudgment with an LLM needs pydantic-ai: pip install 'celery-bidding[llm]'"
        ) from exc
    agent = Agent(model, system_prompt=JUDGE_SYSTEM_PROMPT, output_type=Judgment)

    def judge(
        bids: Sequence[Bid], rfp: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Judgment:
        result = agent.run_sync(judgment_prompt(bids, rfp, capabilities))
        output: Judgment = result.output
        return output

    return judge


@dataclass
class AgentJudgment:
    """Seed 003 3.4: a judge (an LLM, or any callable) picks the winner.

    A judge that fails or names a node that did not bid does not fail the auction: the
    ``fallback`` strategy (WeightedScore by default) decides, and ``last_reasoning`` says why.
    """

    name: ClassVar[str] = "agent_judgment"
    judge: Judge | None = None
    fallback: _Scored = field(default_factory=WeightedScore)
    last_reasoning: str = field(default="", compare=False)

    def select(
        self,
        bids: Sequence[Bid],
        rfp: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> Bid | None:
        """The judge's pick, or the fallback's when the judge cannot decide."""
        if not bids:
            self.last_reasoning = "no bids"
            return None
        if self.judge is None:
            self.last_reasoning = "no judge configured; fell back to " + self.fallback.name
            return self.fallback.select(bids, rfp, capabilities)
        try:
            verdict = Judgment.model_validate(self.judge(bids, rfp, capabilities),
                                              from_attributes=True)
        except Exception as exc:  # a judge is user code or a remote model: never fail the award
            self.last_reasoning = f"judge failed ({exc!r}); fell back to {self.fallback.name}"
            return self.fallback.select(bids, rfp, capabilities)
        chosen = next((b for b in bids if b.node == verdict.selected_agent_id), None)
        if chosen is None:
            self.last_reasoning = (
                f"judge named {verdict.selected_agent_id!r}, which did not bid; "
                f"fell back to {self.fallback.name}"
            )
            return self.fallback.select(bids, rfp, capabilities)
        self.last_reasoning = verdict.reasoning
        return chosen

    def score_all(
        self,
        bids: Sequence[Bid],
        rfp: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> list[Score]:
        """The fallback's scores, shown for context; the judge's pick decides."""
        return self.fallback.score_all(bids, rfp, capabilities)


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


def resolve_strategy(spec: SelectionStrategy | str | type) -> SelectionStrategy:
    """A strategy object from a registered name, an object, a class, or ``"pkg.mod:Name"``.

    Raises :class:`UnknownStrategyError` listing the valid names when nothing matches.
    """
    if isinstance(spec, str):
        if spec in STRATEGIES:
            return STRATEGIES[spec]()
        if ":" in spec or "." in spec:
            return _check(_import(spec), spec)
        valid = ", ".join(sorted(STRATEGIES))
        raise UnknownStrategyError(
            f"strategy: unknown strategy {spec!r}; valid names: {valid}, "
            "or a dotted path such as 'package.module:MyStrategy'"
        )
    return _check(spec, repr(spec))


def _import(path: str) -> Any:
    module_name, _, attr = path.partition(":") if ":" in path else path.rpartition(".")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError) as exc:
        valid = ", ".join(sorted(STRATEGIES))
        raise UnknownStrategyError(
            f"strategy: cannot import {path!r} ({exc}); valid names: {valid}"
        ) from None
    return obj


def _check(obj: Any, label: str) -> SelectionStrategy:
    if not callable(getattr(obj, "select", None)):
        raise ConfigurationError(
            f"strategy: {label} has no select(bids, rfp, capabilities) method"
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


def run_select(
    strategy: SelectionStrategy,
    bids: Sequence[Bid],
    rfp: Announcement,
    capabilities: Mapping[str, NodeCapability],
) -> Bid | None:
    """Call ``strategy.select``, running it to completion when it is a coroutine (seed 003)."""
    result = strategy.select(bids, rfp, capabilities)
    if inspect.isawaitable(result):
        return asyncio.run(_await(result))
    return result


async def _await(awaitable: Awaitable[Bid | None]) -> Bid | None:
    return await awaitable
