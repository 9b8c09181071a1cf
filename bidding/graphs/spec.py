"""The AITP task definition (seed 004 sections 2.1, 2.2 and 3.1) as pydantic models.

A definition is read from a dict, a JSON or YAML file, or given as the model itself. ``input``
and ``output`` are JSON schemas (as in the seed); the values the task runs with are
``input_values`` (or ``bidding.submit(..., input={...})``), completed with the schema's
defaults.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from bidding.errors import ConfigurationError
from bidding.models import (
    PRIORITY_NAMES,
    RetryPolicy,
    describe_validation,
    parse_priority,
    tag_names,
)

Priority = Literal["HIGH", "NORMAL", "LOW"]
#: A task's HIGH/NORMAL/LOW as the announcement's 0-9 priority (higher is more urgent), the
#: same as ``bidding={"priority": "high"}`` and the rest.
PRIORITY_LEVELS: dict[str, int] = {name.upper(): level for name, level in PRIORITY_NAMES.items()}
#: The id of the one step of a definition without subtasks.
SINGLE_STEP = "task"


class RetrySpec(BaseModel):
    """AITP 2.2 ``retry_policy``, mapped onto ``bidding.RetryPolicy``."""

    model_config = ConfigDict(extra="forbid")

    max_retries: int = Field(3, ge=0, le=100)
    backoff_strategy: Literal["exponential", "linear", "fixed"] = "exponential"
    backoff_base_ms: float = Field(1000, ge=0)

    def policy(self) -> RetryPolicy:
        """The equivalent retry policy of an attempt."""
        return RetryPolicy(max_retries=self.max_retries, backoff=self.backoff_strategy,
                           base_ms=self.backoff_base_ms)


#: AITP 6.2's fallback strategies -> bidding's ``Fallbacks`` values.
OFFLINE_STRATEGIES = {"SELECT_NEXT_BEST": "next_best", "REAUCTION": "reauction", "FAIL": "fail"}
TIMEOUT_STRATEGIES = {"RETRY_WITH_TIMEOUT_EXTENSION": "extend", "RETRY": "retry",
                      "FAIL": "fail"}
CAPABILITY_STRATEGIES = {"DEFER": "defer", "FAIL": "fail"}
COST_STRATEGIES = {"FAIL_AND_NOTIFY"}


class FallbackChoice(BaseModel):
    """One AITP 6.2 fallback: its ``strategy`` and that strategy's settings."""

    model_config = ConfigDict(extra="forbid")

    strategy: str
    extended_timeout_seconds: float | None = Field(None, gt=0)
    #: Seconds between announcements of a deferred task (the seed: "try again in 5 minutes").
    defer_seconds: float | None = Field(None, ge=0)
    max_deferrals: int | None = Field(None, ge=1)
    notification: str | None = None


class FallbackSpec(BaseModel):
    """AITP 6.2 ``Fallback``: what a subtask's attempts do when they cannot go as planned."""

    model_config = ConfigDict(extra="forbid")

    on_agent_offline: FallbackChoice | None = None
    on_timeout: FallbackChoice | None = None
    on_cost_exceeded: FallbackChoice | None = None
    on_capability_unavailable: FallbackChoice | None = None

    @model_validator(mode="after")
    def _known_strategies(self) -> FallbackSpec:
        for name, known in (("on_agent_offline", OFFLINE_STRATEGIES),
                            ("on_timeout", TIMEOUT_STRATEGIES),
                            ("on_capability_unavailable", CAPABILITY_STRATEGIES),
                            ("on_cost_exceeded", COST_STRATEGIES)):
            choice = getattr(self, name)
            if choice is not None and choice.strategy not in known:
                raise ValueError(f"{name}.strategy: {choice.strategy!r} is not one of "
                                 f"{', '.join(sorted(known))}")
        return self

    def fallbacks(self) -> dict[str, Any]:
        """The equivalent ``bidding={"fallbacks": ...}`` of an announcement."""
        found: dict[str, Any] = {}
        if self.on_agent_offline is not None:
            found["on_agent_offline"] = OFFLINE_STRATEGIES[self.on_agent_offline.strategy]
        if self.on_timeout is not None:
            found["on_timeout"] = TIMEOUT_STRATEGIES[self.on_timeout.strategy]
            if self.on_timeout.extended_timeout_seconds is not None:
                found["extended_timeout_seconds"] = self.on_timeout.extended_timeout_seconds
        choice = self.on_capability_unavailable
        if choice is not None:
            found["on_capability_unavailable"] = CAPABILITY_STRATEGIES[choice.strategy]
            if choice.defer_seconds is not None:
                found["defer_seconds"] = choice.defer_seconds
            if choice.max_deferrals is not None:
                found["max_deferrals"] = choice.max_deferrals
        return found


class Metadata(BaseModel):
    """AITP 2.2 task metadata."""

    model_config = ConfigDict(extra="forbid")

    #: Unix time after which no subtask may start.
    deadline: float | None = None
    #: Soft time limit of each subtask's attempt.
    timeout_seconds: float | None = Field(None, gt=0)
    retry_policy: RetrySpec | None = None
    #: The most the whole task may cost: the sum of its subtasks' ledgers.
    cost_limit: float | None = Field(None, ge=0)
    estimated_cost: float | None = None
    actual_cost: float | None = None
    tags: list[str] = Field(default_factory=list)
    #: Ids of other top-level tasks (graphs) that must succeed before this one starts.
    dependencies: list[str] = Field(default_factory=list)
    #: AITP 6.2 fallbacks of every subtask (a subtask's own ``fallback`` overrides them).
    fallback: FallbackSpec | None = None

    @field_validator("tags")
    @classmethod
    def _tags_are_names(cls, value: list[str]) -> list[str]:
        # Checked here, at submit: each subtask is announced with them.
        return tag_names(value)


class Subtask(BaseModel):
    """AITP 3.1: one step, routed by bidding on its ``agent_capability``."""

    model_config = ConfigDict(extra="forbid")

    subtask_id: str = Field(min_length=1, max_length=64)
    name: str = ""
    agent_capability: str = Field(min_length=1)
    depends_on: list[str] = Field(default_factory=list)
    #: Keyword arguments of the capability's task; strings may hold ``${...}`` templates.
    input: dict[str, Any] = Field(default_factory=dict)
    #: The task's output field -> the name everything downstream sees it under. Empty: the
    #: whole output, under its own names.
    output_mapping: dict[str, str] = Field(default_factory=dict)
    #: Its announcement's priority (0-9 or a name, higher is more urgent; None: the task's).
    #: Among subtasks ready together, the most urgent is announced first.
    priority: int | None = None
    timeout_seconds: float | None = Field(None, gt=0)
    retry_policy: RetrySpec | None = None
    fallback: FallbackSpec | None = None

    @field_validator("priority", mode="before")
    @classmethod
    def _priority(cls, value: Any) -> int | None:
        if value is None:
            return None
        try:
            return parse_priority(value)
        except ConfigurationError as exc:
            raise ValueError(str(exc).removeprefix("priority: ")) from None


#: An example definition, shown in the HTTP API's schema for ``POST /aitp/tasks``: a research
#: paper analysed in three subtasks (the same as ``examples/api/definition.json`` and
#: ``examples/graphs/research_paper.yaml``, which a test keeps equal).
DEFINITION_EXAMPLE: dict[str, Any] = {
    "name": "Research Paper Analysis",
    "description": "Analyze a research paper and extract key findings",
    "goal": "Extract key findings from the research paper including:\n- Main hypothesis\n"
            "- Methodology\n- Key results\n- Limitations\n",
    "input": {"type": "object", "required": ["paper_pdf_url"],
              "properties": {"paper_pdf_url": {"type": "string", "format": "uri"},
                             "max_pages": {"type": "integer", "default": 50}}},
    "output": {"type": "object",
               "properties": {"hypothesis": {"type": "string"},
                              "methodology": {"type": "string"},
                              "results": {"type": "array", "items": {"type": "string"}},
                              "limitations": {"type": "string"}}},
    "input_values": {
        "paper_pdf_url": "https://example.org/papers/contract-net-protocol-markets.pdf"},
    "priority": "HIGH",
    "metadata": {"timeout_seconds": 3600,
                 "retry_policy": {"max_retries": 3, "backoff_strategy": "exponential",
                                  "backoff_base_ms": 1000},
                 "cost_limit": 10.0, "tags": ["research", "nlp", "analysis"],
                 "dependencies": []},
    "subtasks": [
        {"subtask_id": "subtask_1", "name": "Extract Text from PDF",
         "agent_capability": "pdf_text_extraction",
         "input": {"paper_pdf_url": "${parent.input.paper_pdf_url}",
                   "max_pages": "${parent.input.max_pages}"},
         "output_mapping": {"extracted_text": "raw_text"}, "priority": 1},
        {"subtask_id": "subtask_2", "name": "Analyze Text with NLP",
         "agent_capability": "nlp_analysis", "depends_on": ["subtask_1"],
         "input": {"text": "${subtask_1.output.raw_text}"},
         "output_mapping": {"analysis": "nlp_results"}, "priority": 2},
        {"subtask_id": "subtask_3", "name": "Aggregate Results",
         "agent_capability": "orchestration", "depends_on": ["subtask_1", "subtask_2"],
         "input": {"raw_text": "${subtask_1.output.raw_text}",
                   "nlp_results": "${subtask_2.output.nlp_results}"},
         "output_mapping": {}, "priority": 3},
    ],
}


class TaskDefinition(BaseModel):
    """AITP 2.1 task, decomposed (3.1) or not (then one auction for ``agent_capability``)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [DEFINITION_EXAMPLE]})

    task_id: str | None = Field(None, min_length=1, max_length=64)
    name: str = Field(min_length=1)
    description: str = ""
    goal: str = ""
    #: The capability of a task without subtasks.
    agent_capability: str | None = None
    #: JSON schema of the task's input.
    input: dict[str, Any] = Field(default_factory=dict)
    #: JSON schema of the task's output (its result is checked against it).
    output: dict[str, Any] = Field(default_factory=dict)
    #: The input the task runs with (``submit(..., input=...)`` adds to it).
    input_values: dict[str, Any] = Field(default_factory=dict)
    created_at: float | None = None
    created_by: str | None = Field(None, min_length=1, max_length=255)
    priority: Priority = "NORMAL"
    status: str | None = None
    metadata: Metadata = Field(default_factory=Metadata)
    subtasks: list[Subtask] = Field(default_factory=list)
    #: The task's result: ``field: "${subtask.output.x}"`` templates, or renames of the merged
    #: output of the sink subtasks. Empty: that merged output as it is.
    output_mapping: dict[str, str] = Field(default_factory=dict)

    def steps(self) -> list[Subtask]:
        """The subtasks, or the single step of a task without subtasks."""
        if self.subtasks:
            return list(self.subtasks)
        if not self.agent_capability:
            return []
        inputs = {key: f"${{parent.input.{key}}}" for key in self.input_with_defaults()}
        return [Subtask(subtask_id=SINGLE_STEP, name=self.name,
                        agent_capability=self.agent_capability, input=inputs)]

    def input_with_defaults(self, given: dict[str, Any] | None = None) -> dict[str, Any]:
        """The input values, completed with the defaults of the input schema's properties."""
        values: dict[str, Any] = {}
        for key, prop in (self.input.get("properties") or {}).items():
            if isinstance(prop, dict) and "default" in prop:
                values[key] = prop["default"]
        values.update(self.input_values)
        values.update(given or {})
        return values


def load_definition(source: Any) -> TaskDefinition:
    """A definition from a dict, a JSON/YAML file path, JSON text or the model itself."""
    if isinstance(source, TaskDefinition):
        return source
    where = "task definition"
    if isinstance(source, (str, Path)):
        path = Path(source)
        if isinstance(source, str) and source.lstrip().startswith("{"):
            source = json.loads(source)
        elif path.exists():
            where = str(path)
            source = _read(path)
        else:
            raise ConfigurationError(f"task definition: no such file {path}")
    if not isinstance(source, dict):
        raise ConfigurationError(f"{where}: expected a mapping (got {type(source).__name__})")
    if "task" in source and isinstance(source["task"], dict) and len(source) == 1:
        source = source["task"]  # a file with a top-level ``task:`` key
    try:
        return TaskDefinition.model_validate(source)
    except ValidationError as exc:
        raise ConfigurationError(f"{where}: {describe_validation(exc)}") from None


def _read(path: Path) -> Any:
    text = path.read_text()
    if path.suffix.lower() == ".json":
        return json.loads(text)
    try:
        import yaml
    except ImportError:  # pragma: no cover - PyYAML is a dependency
        raise ConfigurationError(f"{path}: reading YAML needs PyYAML") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigurationError(f"{path}: not valid YAML ({exc})") from None
