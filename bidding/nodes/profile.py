"""Node profiles: the TOML file that says what a node can do, validated on load, and the
profile this process runs as a node (``current_profile``).

```toml
name = "redfin"
capabilities = ["gpu_inference", "nlp_analysis"]
capacity = 4
price_per_unit = 0.01
latency_ms = 40
trust = 70

[checking]                     # optional: seed 002's agent-specific backoff for this node's tasks
initial_check_wait_time = 120  # any of the four bidding_*check* settings; the rest stay global
max_check_attempts = 5
```
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from bidding.config import Settings
from bidding.errors import ProfileError
from bidding.models import describe_validation, skill_names

#: The environment variable naming this worker's profile (set by ``bidding worker``).
PROFILE_ENV = "BIDDING_PROFILE"
#: Node names become queue names (bids.<name>, exec.<name>) and Celery node names (<name>@host).
NODE_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"


class CheckingProfile(BaseModel):
    """A node's own schedule for checking the tasks delegated to it (seed 002's agent-specific
    backoff): any of the global settings of the same names; unset keys keep the global value."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    initial_check_wait_time: float | None = Field(None, gt=0)
    check_backoff_factor: float | None = Field(None, ge=1)
    max_check_wait_time: float | None = Field(None, gt=0)
    max_check_attempts: int | None = Field(None, ge=1)

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
    price_per_unit: float = Field(0.01, ge=0)
    latency_ms: float = Field(50.0, ge=0)
    trust: float = Field(70.0, ge=0, le=100)
    description: str = ""
    #: The ``[checking]`` table: how the tasks delegated to this node are watched.
    checking: CheckingProfile = Field(default_factory=CheckingProfile)

    @field_validator("capabilities")
    @classmethod
    def _distinct_names(cls, value: list[str]) -> list[str]:
        return skill_names(value, "capabilities")

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
            f"{source}: {describe_validation(exc)} (valid keys: {valid})"
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


def current_profile(settings: Settings) -> NodeProfile | None:
    """The profile named by ``bidding_profile`` / ``BIDDING_PROFILE``, or None outside a node."""
    path = settings.profile or os.environ.get(PROFILE_ENV)
    if not path:
        return None
    found = _profiles.get(path)
    if found is None:
        found = _profiles[path] = load_profile(path)
    return found
