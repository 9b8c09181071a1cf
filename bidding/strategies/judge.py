"""Seed 003's AgentJudgment: a judge (an LLM through pydantic-ai, or any callable) picks the winner.

A judge may take seconds, so the award never asks it under its write lock
(``protocol.decides_at_once``); a judge that fails or names a node that did not bid falls back
to a scoring strategy, and ``last_reasoning`` says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from bidding.errors import ConfigurationError
from bidding.models import Announcement, Bid, Score
from bidding.strategies.builtins import WeightedScore, _Scored
from bidding.strategies.protocol import NodeCapability

#: Seconds a judge (an LLM call) may take before the fallback strategy decides.
JUDGE_TIMEOUT = 30.0
class _TimedOut(Exception):
    """The judge did not answer within ``AgentJudgment.timeout`` (not the judge's own error)."""


#: Judges run here, so that waiting for one can stop at its timeout.
_JUDGES = ThreadPoolExecutor(max_workers=4, thread_name_prefix="bidding-judge")

class Judgment(BaseModel):
    """What a judge returns (seed 003's JudgmentResult)."""

    selected_agent_id: str = Field(description="Node name of the winning bid")
    reasoning: str = Field(default="", description="Why this node was selected")


#: A judge sees the bids, the task and the capabilities, and names a winner.
Judge = Callable[[Sequence[Bid], Announcement, Mapping[str, NodeCapability]], Judgment]


def judgment_prompt(
    bids: Sequence[Bid], announcement: Announcement, capabilities: Mapping[str, NodeCapability]
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
        f"Task: {announcement.content or announcement.task_type}\n"
        f"Required skills: {announcement.required_skills}\n\n"
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


def llm_judge(model: Any, timeout: float = JUDGE_TIMEOUT) -> Judge:
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
        bids: Sequence[Bid], announcement: Announcement, capabilities: Mapping[str, NodeCapability]
    ) -> Judgment:
        # The HTTP request's own timeout; AgentJudgment also stops waiting after ``timeout``.
        result = agent.run_sync(judgment_prompt(bids, announcement, capabilities),
                                model_settings={"timeout": timeout})
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
    #: Seconds the judge may take; past them the fallback decides (the judge's call is left to
    #: finish on its own thread: a remote model must not hold an auction open for ever).
    timeout: float | None = JUDGE_TIMEOUT

    def select(
        self,
        bids: Sequence[Bid],
        announcement: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> Bid | None:
        """The judge's pick, or the fallback's when the judge cannot decide."""
        if not bids:
            self.last_reasoning = "no bids"
            return None
        if self.judge is None:
            self.last_reasoning = "no judge configured; fell back to " + self.fallback.name
            return self.fallback.select(bids, announcement, capabilities)
        try:
            verdict = Judgment.model_validate(self._ask(bids, announcement, capabilities),
                                              from_attributes=True)
        except _TimedOut:
            self.last_reasoning = (f"judge did not answer within {self.timeout:g}s; "
                                   f"fell back to {self.fallback.name}")
            return self.fallback.select(bids, announcement, capabilities)
        except Exception as exc:  # a judge is user code or a remote model: never fail the award
            self.last_reasoning = f"judge failed ({exc!r}); fell back to {self.fallback.name}"
            return self.fallback.select(bids, announcement, capabilities)
        chosen = next((b for b in bids if b.node == verdict.selected_agent_id), None)
        if chosen is None:
            self.last_reasoning = (
                f"judge named {verdict.selected_agent_id!r}, which did not bid; "
                f"fell back to {self.fallback.name}"
            )
            return self.fallback.select(bids, announcement, capabilities)
        self.last_reasoning = verdict.reasoning
        return chosen

    def _ask(self, bids: Sequence[Bid], announcement: Announcement,
             capabilities: Mapping[str, NodeCapability]) -> Any:
        """The judge's answer, within ``timeout`` seconds (TimeoutError past them)."""
        assert self.judge is not None
        if self.timeout is None:
            return self.judge(bids, announcement, capabilities)
        future = _JUDGES.submit(self.judge, bids, announcement, capabilities)
        try:
            return future.result(timeout=self.timeout)
        except FutureTimeout:
            if future.done():
                raise  # the judge's own TimeoutError (the same class since Python 3.11)
            future.cancel()
            raise _TimedOut from None

    def score_all(
        self,
        bids: Sequence[Bid],
        announcement: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> list[Score]:
        """The fallback's scores, shown for context; the judge's pick decides."""
        return self.fallback.score_all(bids, announcement, capabilities)
