"""Value objects of an auction: announcement, bid, refusal, score, award, retry policy.

All are pydantic models so that they validate at the boundary (bad input names the field) and
travel as JSON through Celery (no pickle anywhere).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from bidding import clock, resources
from bidding.errors import ConfigurationError
from bidding.validation import describe_validation, field_range, non_json_number

__all__ = ["BUDGET_EPSILON", "DEFAULT_PRIORITY", "MAX_PRIORITY", "METADATA_LIMIT",
           "OPTION_KEYS", "PRIORITY_NAMES", "TAG_LIMIT", "Announcement", "Award", "Bid",
           "BidMode", "BidResponse", "CandidateCap", "CanvasOptions", "Fallbacks", "NoBidPolicy",
           "Refusal", "RetryPolicy", "Score", "bounded_metadata", "describe_validation",
           "field_range", "non_json_number", "parse_priority", "priority_label", "skill_names",
           "tag_names"]

NoBidPolicy = Literal["fail", "fallback"]
#: Who makes a task's bids (``bidding_bid_mode``; see ``auction.announce``).
BidMode = Literal["auto", "ask", "proxy"]


def _candidate_cap(value: Any) -> int | str:
    """A candidate cap as written (``8``, ``"8"`` from the environment, ``"auto"``), or one
    reason for the field's error instead of one per member of the union."""
    if value == "auto":
        return "auto"
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    # (The field's error adds the value: "(got '-2')".)
    raise ValueError('must be "auto" or a whole number >= 0 (0: every eligible node)')


#: How many eligible nodes an auction asks: a number (0: all of them), or "auto", which
#: scales with the eligible nodes (``auction.candidates.scaled_cap``).
CandidateCap = Annotated[
    int | Literal["auto"],
    PlainValidator(_candidate_cap),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0}, {"const": "auto"}]}),
]
#: Cost differences below this are float rounding, not overspending (1.0 - 0.8 is
#: 0.19999999999999996): a bid of exactly the budget left stays eligible.
BUDGET_EPSILON = 1e-9

#: A task's priority by name; higher is more urgent, everywhere: a call's ``bidding=`` option,
#: Celery's ``apply_async(priority=...)``, a task graph's HIGH/NORMAL/LOW and its subtasks.
PRIORITY_NAMES: dict[str, int] = {"high": 8, "normal": 5, "low": 2}
DEFAULT_PRIORITY = PRIORITY_NAMES["normal"]
MAX_PRIORITY = 9


def parse_priority(value: Any, field: str = "priority") -> int:
    """A priority as an integer 0-9 (higher is more urgent) from a name ("high", "normal",
    "low", in any case) or an integer 0-9; a clear error naming ``field`` otherwise."""
    if isinstance(value, str):
        named = PRIORITY_NAMES.get(value.strip().lower())
        if named is not None:
            return named
        if value.strip().isdigit():
            value = int(value.strip())
    # bool is an int to Python, not a priority to anyone.
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_PRIORITY:
        return value
    raise ConfigurationError(
        f"{field}: {value!r} is not a priority; give \"high\" (8), \"normal\" (5), \"low\" (2) "
        f"or an integer from 0 to {MAX_PRIORITY} (higher is more urgent)")


def priority_label(priority: int) -> str:
    """``8 (high)``, ``5 (normal)``, ``7``: a priority as people read it."""
    name = next((n for n, p in PRIORITY_NAMES.items() if p == priority), None)
    return f"{priority} ({name})" if name else str(priority)


#: Keys a caller may pass in ``apply_async(..., bidding={...})`` or ``@app.task(bidding={...})``.
OPTION_KEYS: tuple[str, ...] = (
    "task_type",
    "required_skills",
    "preferred_node",
    "priority",
    "deadline",
    "expires",
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
    "tags",
    "created_by",
    "resources",
    "affinity",
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


#: The most tags a task may carry, and the longest tag (the store's column).
TAG_LIMIT = 32
TAG_LENGTH = 64


def tag_names(value: list[str]) -> list[str]:
    """Tags stripped and deduplicated in order: each a non-empty string of at most
    ``TAG_LENGTH`` characters, at most ``TAG_LIMIT`` of them."""
    cleaned = list(dict.fromkeys(t.strip() for t in value))
    if any(not t for t in cleaned):
        raise ValueError("tags must be non-empty strings")
    if long := [t for t in cleaned if len(t) > TAG_LENGTH]:
        raise ValueError(f"a tag is at most {TAG_LENGTH} characters (got {len(long[0])}: "
                         f"{long[0][:20]!r}...)")
    if len(cleaned) > TAG_LIMIT:
        raise ValueError(f"at most {TAG_LIMIT} tags (got {len(cleaned)})")
    return cleaned


#: Bytes of compact JSON a bidder's ``metadata`` may take: it travels with every bid (the
#: board, the store's bid payload, the strategy), so it is bounded like the rest of a bid.
METADATA_LIMIT = 4096


def bounded_metadata(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` if it is a JSON object of at most ``METADATA_LIMIT`` bytes (compact UTF-8
    JSON) holding no NaN or infinity; a ``ConfigurationError`` naming the field and saying
    which otherwise (without the value: it may be large)."""
    found = non_json_number(value, "metadata")
    if found is not None:
        raise ConfigurationError(found)
    try:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(f"metadata: must be a JSON object ({exc})") from None
    size = len(text.encode())
    if size > METADATA_LIMIT:
        raise ConfigurationError(
            f"metadata: is {size} bytes of JSON; at most {METADATA_LIMIT} are kept with a bid "
            "(put bulky data elsewhere and refer to it)")
    return value


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
    #: 0-9, higher is more urgent (``"high"``, ``"normal"`` and ``"low"`` are 8, 5 and 2):
    #: waiting work starts, and waiting announcements are awarded, most urgent first.
    priority: int = Field(DEFAULT_PRIORITY, ge=0, le=MAX_PRIORITY)
    #: Unix time after which the task must not start (AITP metadata.deadline), on the store's
    #: clock. The same limit as ``expires_at``: the earlier of the two is ``start_by``.
    deadline: float | None = None
    #: When the task expires if it has not started (Celery's ``expires``, made absolute on the
    #: store's clock when the call is made: ``auction.announcement``).
    expires_at: float | None = None
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
    #: At most this many eligible nodes are asked (0: all); "auto" scales with them.
    candidate_cap: CandidateCap = "auto"
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
    #: Options the coordinator's rules set because the call did not (``required_skills``
    #: from ``bidding_skill_keywords``, ``preferred_node`` from ``bidding_preferred_nodes``),
    #: each with why; ``explain`` shows it.
    inferred: dict[str, str] = Field(default_factory=dict)
    #: Labels to find the task by (AITP ``metadata.tags``): ``GET /aitp/tasks?tag=...``,
    #: ``bidding tasks --tag``.
    tags: list[str] = Field(default_factory=list)
    #: Who created the task (AITP ``created_by``): an API caller's definition, or the option.
    created_by: str | None = Field(None, min_length=1, max_length=255)
    #: What one attempt holds on its node while it runs (``{"gpu_mem_gb": 20, "cpu": 2}``): a
    #: node bids only when its declared totals cover it, and starts the attempt only while
    #: its running attempts leave room (``bidding.resources``).
    resources: dict[str, float] = Field(default_factory=dict)
    #: Items the task would like warm on its node (``["model:llama-3-8b"]``): a node holding
    #: them warm scores higher.
    affinity: list[str] = Field(default_factory=list)
    #: Set only on the copy a node's bidder sees (``auction.request_view``): each of
    #: ``content``, ``args`` and ``kwargs`` that was cut to ``bidding_bid_request_limit``,
    #: with its size before the cut (characters of the content; of JSON for args and kwargs).
    truncated: dict[str, int] = Field(default_factory=dict)
    #: The task's trace (``bidding.tracing``): the W3C Trace Context (``traceparent``...) of
    #: its first announcement's span, when traced; every later span of the task joins it.
    trace: dict[str, str] = Field(default_factory=dict)

    @field_validator("required_skills")
    @classmethod
    def _skills_are_names(cls, value: list[str]) -> list[str]:
        return skill_names(value, "skills")

    @field_validator("resources", mode="before")
    @classmethod
    def _resource_needs(cls, value: Any) -> dict[str, float]:
        return resources.needs_of(value, "resources")

    @field_validator("affinity", mode="before")
    @classmethod
    def _warm_items(cls, value: Any) -> list[str]:
        return resources.warm_items(value, "affinity")

    @field_validator("priority", mode="before")
    @classmethod
    def _priority_by_name(cls, value: Any) -> int:
        try:
            return parse_priority(value)
        except ConfigurationError as exc:
            raise ValueError(str(exc).removeprefix("priority: ")) from None

    @property
    def wanted(self) -> str:
        """What a node must offer to be asked, for a person: its skills, and the resources
        it needs (``"ocr with gpu_mem_gb 20"``): "no live node offers ..." ends with it."""
        skills = ", ".join(self.required_skills) or "any skill"
        if not self.resources:
            return skills
        needs = ", ".join(f"{name} {amount:g}" for name, amount in sorted(self.resources.items()))
        return f"{skills} with {needs}"

    @property
    def start_by(self) -> float | None:
        """The time after which the task must not start: the earlier of its deadline and its
        expiry (None: no limit). One meaning, whichever name the caller used."""
        limits = [t for t in (self.deadline, self.expires_at) if t is not None]
        return min(limits) if limits else None

    def expired(self, now: float) -> bool:
        """Whether the task's start-by time has passed at ``now`` (it must not start)."""
        start_by = self.start_by
        return start_by is not None and now >= start_by

    @field_validator("tags")
    @classmethod
    def _tags_are_names(cls, value: list[str]) -> list[str]:
        return tag_names(value)


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
    #: What the node expects the attempt to cost (in the ledger's units) and to take; None:
    #: it does not say. The built-in bidder's: its price times the units, and the mean
    #: duration of its latest successful episodes of the task type (none: None).
    estimated_cost: float | None = Field(None, ge=0, allow_inf_nan=False)
    estimated_duration_s: float | None = Field(None, ge=0, allow_inf_nan=False)
    #: Free-form figures for strategies (a bidder's ``metadata``, e.g. ``estimated_tokens``),
    #: with the built-in bidder's ``content_confidence`` and, when a bidder judged the draft,
    #: ``draft_confidence``.
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
    The optional figures are the bidder's own claims: ``estimated_cost`` and
    ``estimated_duration_s`` replace the built-in bid's estimates (None: keep them), and
    ``metadata`` (a JSON object of at most ``METADATA_LIMIT`` bytes) is merged into the bid's,
    where strategies read it (``bid.metadata["estimated_tokens"]``).
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    will_bid: bool
    confidence: float = Field(ge=0.0, le=1.0)
    proposal: str
    reasoning: str
    estimated_cost: float | None = Field(None, ge=0)
    estimated_duration_s: float | None = Field(None, ge=0)
    metadata: dict[str, Any] = Field(default_factory=dict)

    @field_validator("metadata")
    @classmethod
    def _metadata_is_bounded(cls, value: dict[str, Any]) -> dict[str, Any]:
        return bounded_metadata(value)


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
