"""Value objects of an auction: announcement, bid, refusal, score, award, retry policy.

All are pydantic models so that they validate at the boundary (bad input names the field) and
travel as JSON through Celery (no pickle anywhere).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bidding import clock
from bidding.errors import ConfigurationError
from bidding.validation import describe_validation, field_range, non_json_number

__all__ = ["BUDGET_EPSILON", "OPTION_KEYS", "Announcement", "Award", "Bid", "BidMode",
           "BidResponse", "CanvasOptions", "Fallbacks", "NoBidPolicy", "Refusal",
           "RetryPolicy", "Score", "describe_validation", "field_range", "non_json_number",
           "skill_names"]

NoBidPolicy = Literal["fail", "fallback"]
#: Who makes a task's bids (``bidding_bid_mode``; see ``auction.announce``).
BidMode = Literal["auto", "ask", "proxy"]
#: Cost differences below this are float rounding, not overspending (1.0 - 0.8 is
#: 0.19999999999999996): a bid of exactly the budget left stays eligible.
BUDGET_EPSILON = 1e-9

#: Keys a caller may pass in ``apply_async(..., bidding={...})`` or ``@app.task(bidding={...})``.
OPTION_KEYS: tuple[str, ...] = (
    "task_type",
    "required_skills",
    "preferred_node",
    "priority",
    "deadline",
    "budget",
    "min_confidence",
    "min_trust",
    "strategy",
    "window",
    "no_bid",
    "content",
    "units",
    "candidate_cap",
    "retry_policy",
    "retry_same_node",
    "fallbacks",
    "timeout_seconds",
    "schedule_to_start_timeout",
    "output_schema",
    "bid_mode",
)


Backoff = Literal["exponential", "linear", "fixed"]


class RetryPolicy(BaseModel):
    """How a failed attempt is retried (AITP 2.2 / 6.1), validated on construction.

    ``RetryPolicy(max_retries=3, backoff="exponential", base_ms=1000)`` gives AITP's schedule:
    immediate, then 1000, 2000 and 4000 ms, then give up.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_retries: int = Field(3, ge=0, le=100)
    backoff: Backoff = "exponential"
    base_ms: float = Field(1000, ge=0)
    max_ms: float = Field(300_000, ge=0)
    #: Fraction of the delay added or removed at random (0 = none, 0.1 = +-10%).
    jitter: float = Field(0.0, ge=0, le=1)
    #: Exception class names (``"ValueError"`` or ``"pkg.mod.Error"``) that are never retried.
    non_retryable: tuple[str, ...] = ()

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigurationError(describe_validation(exc, "retry_policy.")) from None

    @classmethod
    def parse(cls, data: Any) -> RetryPolicy:
        """A policy from a mapping (e.g. received as JSON), with the constructor's errors."""
        if isinstance(data, cls):
            return data
        if not isinstance(data, dict):
            raise ConfigurationError(f"retry_policy: expected a mapping (got {data!r})")
        return cls(**data)


OfflinePolicy = Literal["next_best", "reauction", "fail"]
TimeoutPolicy = Literal["extend", "retry", "fail"]
CapabilityPolicy = Literal["defer", "fail"]


class Fallbacks(BaseModel):
    """What happens when an attempt cannot go as planned (AITP 6.2), per task."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The winner's node stopped heartbeating, or did not start the task in time:
    #: the next-best bidder of the same auction, a new auction, or fail.
    on_agent_offline: OfflinePolicy = "next_best"
    #: The attempt hit its soft time limit: retry once with ``extended_timeout_seconds``,
    #: retry under the retry policy, or fail.
    on_timeout: TimeoutPolicy = "extend"
    extended_timeout_seconds: float = Field(7200.0, gt=0)
    #: No live node has the skills: announce again after ``defer_seconds`` (at most
    #: ``max_deferrals`` times, then ESCALATED), or fail at once.
    on_capability_unavailable: CapabilityPolicy = "fail"
    defer_seconds: float = Field(300.0, ge=0)
    max_deferrals: int = Field(12, ge=1)


def skill_names(value: list[str], what: str) -> list[str]:
    """Skill names stripped and deduplicated in order; an empty name is an error."""
    cleaned = [s.strip() for s in value]
    if any(not s for s in cleaned):
        raise ValueError(f"{what} must be non-empty strings")
    return list(dict.fromkeys(cleaned))


class CanvasOptions(BaseModel):
    """What Celery's canvas passed with a call, put into each execution message as Celery's
    ``send_task`` would (``bidding.execution.canvas``): signatures as plain dicts."""

    model_config = ConfigDict(extra="forbid")

    #: ``link``: run with the result when the task succeeds.
    callbacks: list[dict[str, Any]] | None = None
    #: ``link_error``: run when the task fails for good.
    errbacks: list[dict[str, Any]] | None = None
    #: The rest of a chain (in Celery's order: the next task last).
    chain: list[dict[str, Any]] | None = None
    group_id: str | None = None
    group_index: int | None = None
    #: The body of the chord this task is a header task of.
    chord: dict[str, Any] | None = None
    root_id: str | None = None
    parent_id: str | None = None


class Announcement(BaseModel):
    """One task put up for bidding (the RFP of seed 001, the announcement of seed 000)."""

    # NaN or infinity in a number field (a deadline, a budget) is refused where the options
    # come in, naming the field, as in the arguments (validation.non_json_number).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    task_id: str = Field(min_length=1, max_length=64)
    task_name: str = Field(min_length=1)
    task_type: str = Field(min_length=1, max_length=64)
    #: Text the bidders judge the task by (seed 000's task_content).
    content: str = ""
    args: list[Any] = Field(default_factory=list)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    required_skills: list[str] = Field(default_factory=list)
    preferred_node: str | None = None
    priority: int = Field(5, ge=0, le=9)
    #: Unix time after which the task must not start (AITP metadata.deadline).
    deadline: float | None = None
    #: Cost limit of the task (AITP metadata.cost_limit); bids above it are not awarded.
    budget: float | None = Field(None, ge=0)
    min_confidence: float = Field(0.5, ge=0, le=1)
    min_trust: float = Field(50.0, ge=0, le=100)
    strategy: str = "weighted"
    no_bid: NoBidPolicy = "fail"
    #: Seconds the auction waits for bids.
    window: float = Field(2.0, gt=0, le=3600)
    #: Units of work the task will consume; a bid's cost is price_per_unit * units.
    units: float = Field(1.0, ge=0)
    candidate_cap: int = Field(8, ge=0)
    retry_policy: RetryPolicy | None = None
    #: Retry on the node that just failed too (by default a retry excludes it).
    retry_same_node: bool = False
    fallbacks: Fallbacks = Field(default_factory=Fallbacks)
    #: Soft time limit of an attempt on the node (a hard limit follows a grace period later).
    timeout_seconds: float | None = Field(None, gt=0)
    #: Seconds the winner has to start the task before it goes to the next-best bidder.
    schedule_to_start_timeout: float | None = Field(None, ge=0)
    #: JSON Schema the result must match for COMPLETED -> SUCCESS (AITP 2.1 output).
    output_schema: dict[str, Any] | None = None
    #: Who makes the bids for this task: "ask" its candidates, "proxy" (the announcer, from
    #: their published profiles and history), or "auto" (proxy for the nodes with the built-in
    #: bidder, ask the others); None: the announcer's ``bidding_bid_mode``.
    bid_mode: BidMode | None = None
    #: Nodes this task must not go to again (they failed it or went offline with it).
    exclude_nodes: list[str] = Field(default_factory=list)
    #: Cost already spent on earlier attempts (from the ledger).
    spent: float = Field(0.0, ge=0)
    #: How many times the task was deferred for want of a capable node.
    deferrals: int = Field(0, ge=0)
    #: Rounds of this attempt's auction that no candidate answered (announced again while
    #: their workers may be restarting or reconnecting, up to ``bidding_silent_rounds``).
    silent_rounds: int = Field(0, ge=0)
    #: Attempts that failed on a node so far (what the retry policy counts).
    failures: int = Field(0, ge=0)
    #: Why the previous attempt failed (the task's own error, or why its node lost it), so that
    #: a retry whose auction finds no winner still says what went wrong first.
    last_error: str | None = None
    attempt: int = Field(1, ge=1)
    announced_at: float = Field(default_factory=clock.now)
    #: Celery's canvas around the call (callbacks, errbacks, chain, group, chord, parent).
    canvas: CanvasOptions = Field(default_factory=CanvasOptions)
    #: Set only on the copy a node's bidder sees (``auction.request_view``): each of
    #: ``content``, ``args`` and ``kwargs`` that was cut to ``bidding_bid_request_limit``,
    #: with its size before the cut (characters of the content; of JSON for args and kwargs).
    truncated: dict[str, int] = Field(default_factory=dict)

    @field_validator("required_skills")
    @classmethod
    def _skills_are_names(cls, value: list[str]) -> list[str]:
        return skill_names(value, "skills")


class Bid(BaseModel):
    """A node's answer to an announcement: its sub-scores and what it offers.

    Sub-scores are in [0, 1] (seed 000); cost, latency and trust are AITP's routing inputs.
    """

    model_config = ConfigDict(extra="forbid")

    task_id: str
    node: str
    attempt: int = 1
    #: The node's declared skills (seed 001's AgentCapability.skills).
    skills: list[str] = Field(default_factory=list)
    capability: float = Field(ge=0, le=1)
    experience: float = Field(ge=0, le=1)
    load: float = Field(ge=0, le=1)
    confidence: float = Field(ge=0, le=1)
    cost: float = Field(0.0, ge=0)
    latency_ms: float = Field(0.0, ge=0)
    trust: float = Field(50.0, ge=0, le=100)
    recent_failures: int = Field(0, ge=0)
    in_flight: int = Field(0, ge=0)
    capacity: int = Field(1, ge=1)
    is_preferred_node: bool = False
    #: How the node would do the task (seed 001's proposal): the built-in bidder's summary of
    #: its offer, or what the node's own bidder said.
    proposal: str = ""
    #: Why the node's own bidder bids so (seed 001's reasoning); empty for built-in bids.
    reasoning: str = ""
    #: The node's own bidder that judged this bid (its profile's ``bidder``: a dotted path or
    #: "llm"); None when the built-in bidder made it alone.
    bidder: str | None = None
    #: What the bidder's model reported using: tokens, requests, cost (an LLM bidder).
    usage: dict[str, float] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)
    bid_at: float = Field(default_factory=clock.now)


class Refusal(BaseModel):
    """A node declining an announcement (seed 001's ``will_bid=False``), with its reason."""

    model_config = ConfigDict(extra="forbid")

    task_id: str
    node: str
    attempt: int = 1
    reason: str
    bid_at: float = Field(default_factory=clock.now)
    #: The node could not bid (its bid raised: its store unreachable, say), which is no
    #: verdict on the task: an auction with nothing but such answers is announced again.
    failed: bool = False
    #: The node's own bidder that refused (or failed to answer: it raised, timed out or
    #: returned something invalid, and ``reason`` says which); None for the built-in refusals.
    bidder: str | None = None
    #: What the bidder's model reported using: tokens, requests, cost (an LLM bidder).
    usage: dict[str, float] = Field(default_factory=dict)


class BidResponse(BaseModel):
    """What a node's own bidder answers when asked to bid (seed 001's ``BidResponse``).

    ``will_bid=False`` is a refusal whose reason is ``reasoning``; a bid keeps the built-in
    sub-scores and takes ``confidence`` and ``proposal`` (and ``reasoning``, shown with it).
    """

    model_config = ConfigDict(extra="forbid")

    will_bid: bool
    confidence: float = Field(ge=0.0, le=1.0)
    proposal: str
    reasoning: str


class Score(BaseModel):
    """How a strategy scored one bid: the total and every term that made it."""

    node: str
    total: float
    #: Weighted terms, e.g. ``{"capability": 0.4, "experience": 0.09, ...}``.
    terms: dict[str, float] = Field(default_factory=dict)
    #: Multipliers applied after the sum, e.g. ``{"preferred_node": 1.1}``.
    multipliers: dict[str, float] = Field(default_factory=dict)
    #: False when the bid was filtered out before ranking; ``reason`` says why.
    eligible: bool = True
    reason: str = ""


AwardOutcome = Literal["awarded", "fallback", "failed"]


class Award(BaseModel):
    """The decision that closes an auction."""

    task_id: str
    attempt: int = 1
    outcome: AwardOutcome
    winner: str | None = None
    strategy: str
    #: "all bids in", "deadline", "no candidates" or "proxy bids": what closed the auction.
    closed_by: str
    scores: list[Score] = Field(default_factory=list)
    error: str | None = None
    awarded_at: float = Field(default_factory=clock.now)


#: Pydantic's error types of a number outside a field's bounds.
