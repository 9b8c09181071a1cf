"""Node profiles: the TOML file that says what a node can do, validated on load, and the
profile this process runs as a node (``current_profile``).

```toml
name = "redfin"
capabilities = ["gpu_inference", "nlp_analysis"]
capacity = 4
price_per_unit = 0.01
latency_ms = 40
trust = 70
# optional: the node's own bidder, asked for every bid (see bidding.auction.bidder)
bidder = "mypackage.bidders:judge"   # or "llm", with a [bidder_llm] table
bidder_timeout_s = 5

[checking]                     # optional: seed 002's agent-specific backoff for this node's tasks
initial_check_wait_time = 120  # any of the four bidding_*check* settings; the rest stay global
max_check_attempts = 5
```
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from bidding import resources
from bidding.config import (
    BACKOFF_FACTOR_LIMIT,
    CHECK_ATTEMPTS_LIMIT,
    CHECK_WAIT_LIMIT,
    MAX_CHECK_WAIT_LIMIT,
    Settings,
)
from bidding.errors import ProfileError
from bidding.models import describe_validation, skill_names

#: The environment variable naming this worker's profile (set by ``bidding worker``).
PROFILE_ENV = "BIDDING_PROFILE"
#: Node names become queue names (bids.<name>, exec.<name>) and Celery node names (<name>@host).
NODE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
#: ``bidder``: "llm", or the dotted path of a function ("package.module:function").
LLM_BIDDER = "llm"
BIDDER_PATTERN = r"^(llm|[A-Za-z_][\w.]*[:.][A-Za-z_][\w.]*)$"


class BidderLLM(BaseModel):
    """The ``[bidder_llm]`` table: seed 001's bidder agent (pydantic-ai) for ``bidder = "llm"``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: A pydantic-ai model name ("openai:gpt-4o"), or the dotted path of a model object or of
    #: a function that returns one ("tests.bidders:test_model").
    model: str = Field(min_length=1)
    #: What the node specialises in, for the agent's system prompt (default: the profile's
    #: ``description``).
    description: str = ""
    #: A system prompt replacing seed 001's (which names the node, its skills and description).
    prompt: str = ""


class CheckingProfile(BaseModel):
    """A node's own schedule for checking the tasks delegated to it (seed 002's agent-specific
    backoff): any of the global settings of the same names; unset keys keep the global value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The bounds of the settings of the same names (bidding.config).
    initial_check_wait_time: float | None = Field(None, gt=0, le=CHECK_WAIT_LIMIT)
    check_backoff_factor: float | None = Field(None, ge=1, le=BACKOFF_FACTOR_LIMIT)
    max_check_wait_time: float | None = Field(None, gt=0, le=MAX_CHECK_WAIT_LIMIT)
    max_check_attempts: int | None = Field(None, ge=1, le=CHECK_ATTEMPTS_LIMIT)

    def overrides(self) -> dict[str, float | int] | None:
        """The keys the profile sets (None when it sets none), as the node's row stores them."""
        found = self.model_dump(exclude_none=True)
        return found or None


class NodeProfile(BaseModel):
    """What a node declares about itself; every key is validated, unknown keys are refused."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=NODE_NAME_PATTERN)
    capabilities: list[str] = Field(min_length=1)
    capacity: int = Field(4, ge=1, le=10_000)
    # Bounded so that no arithmetic on them (a bid's cost, its latency score) can overflow.
    price_per_unit: float = Field(0.01, ge=0, le=1_000_000)
    latency_ms: float = Field(50.0, ge=0, le=3_600_000)
    trust: float = Field(70.0, ge=0, le=100)
    description: str = ""
    #: The ``[resources]`` table: what the node has (``gpu_mem_gb = 24``, ``cpu = 8``); a
    #: resource it does not declare is 0 here. Tasks' needs are reserved against it.
    resources: dict[str, float] = Field(default_factory=dict)
    #: Items the node holds warm from its start (``["model:llama-3-8b"]``); a task body adds
    #: to them with ``bidding.mark_warm``.
    warm: list[str] = Field(default_factory=list)
    #: The ``[checking]`` table: how the tasks delegated to this node are watched.
    checking: CheckingProfile = Field(default_factory=CheckingProfile)
    #: The node's own bidder, asked for each bid with the announcement and the built-in draft:
    #: "package.module:function", or "llm" (seed 001's bidder agent, ``bidder_llm``). None:
    #: the built-in bidder alone, and announcers in "auto" bid mode bid for the node.
    bidder: str | None = None
    #: Seconds the bidder may take (seed 001: 5); past them the node refuses, saying so.
    bidder_timeout_s: float = Field(5.0, gt=0, le=600)
    bidder_llm: BidderLLM | None = Field(None, validate_default=True)

    @field_validator("capabilities")
    @classmethod
    def _distinct_names(cls, value: list[str]) -> list[str]:
        return skill_names(value, "capabilities")

    @field_validator("resources", mode="before")
    @classmethod
    def _resource_totals(cls, value: Any) -> dict[str, float]:
        return resources.totals_of(value, "resources")

    @field_validator("warm", mode="before")
    @classmethod
    def _warm_items(cls, value: Any) -> list[str]:
        return resources.warm_items(value, "warm")

    @field_validator("bidder")
    @classmethod
    def _bidder_spec(cls, value: str | None) -> str | None:
        if value is not None and not re.match(BIDDER_PATTERN, value):
            raise ValueError('expected "llm" or a dotted path such as "package.module:function"')
        return value

    @field_validator("bidder_llm")
    @classmethod
    def _llm_table(cls, value: BidderLLM | None, info: ValidationInfo) -> BidderLLM | None:
        bidder = info.data.get("bidder")
        if bidder == LLM_BIDDER and value is None:
            raise ValueError('bidder = "llm" needs this table, with a model')
        if value is not None and bidder != LLM_BIDDER:
            raise ValueError('used only with bidder = "llm"')
        return value

    @property
    def bid_queue(self) -> str:
        """The queue this node's bid requests arrive on."""
        return bid_queue(self.name)

    @property
    def exec_queue(self) -> str:
        """The queue this node's awarded executions arrive on."""
        return exec_queue(self.name)


def bid_queue(node: str) -> str:
    """Name of the bid-request queue of ``node``."""
    return f"bids.{node}"


def exec_queue(node: str) -> str:
    """Name of the execution queue of ``node``."""
    return f"exec.{node}"


def parse_profile(data: dict[str, object], source: str = "<profile>") -> NodeProfile:
    """Validate a profile mapping; errors name the source, the key and the reason."""
    try:
        return NodeProfile.model_validate(data)
    except ValidationError as exc:
        valid = ", ".join(NodeProfile.model_fields)
        raise ProfileError(
            f"{source}: {describe_validation(exc, model=NodeProfile)} (valid keys: {valid})"
        ) from None


def load_profile(path: str | Path) -> NodeProfile:
    """Load and validate a node profile from a TOML file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"{p}: cannot read profile: {exc.strerror or exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{p}: not valid TOML: {exc}") from None
    return parse_profile(data, str(p))


_profiles: dict[str, NodeProfile] = {}


def profile_source(settings: Settings) -> str:
    """The path of this process's profile (``bidding_profile`` / ``BIDDING_PROFILE``), as
    errors about it name it; "<profile>" outside a node."""
    return settings.profile or os.environ.get(PROFILE_ENV) or "<profile>"


def current_profile(settings: Settings) -> NodeProfile | None:
    """The profile named by ``bidding_profile`` / ``BIDDING_PROFILE``, or None outside a node."""
    path = settings.profile or os.environ.get(PROFILE_ENV)
    if not path:
        return None
    found = _profiles.get(path)
    if found is None:
        found = _profiles[path] = load_profile(path)
    return found
