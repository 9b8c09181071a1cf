"""celery-bidding: contract-net task allocation for Celery.

```python
import bidding
bidding.install(app)

@app.task(base=bidding.BiddingTask, task_type="extraction", required_skills=["pdf"])
def extract(url): ...

extract.delay(url).get()           # announced, bid on, awarded, run on the winner
bidding.explain(result.id, app=app)
bidding.reset(result.id, app=app)  # clear an escalated task's checking state (seed 002)
```
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bidding.app import install, mark_warm, warm
    from bidding.config import Settings, celery_conf, get_settings, load_settings
    from bidding.errors import (
        BiddingError,
        ConfigurationError,
        CostExceededError,
        DeadlinePassedError,
        EscalatedError,
        NoBidsError,
        NodeLostError,
        NotRecordedError,
        OutputValidationError,
        ProfileError,
        SubtaskFailedError,
        TaskExpiredError,
        UnknownStrategyError,
        UnknownTaskError,
    )
    from bidding.execution.current import CurrentAward, current_award
    from bidding.graphs.progress import GraphProgress
    from bidding.graphs.spec import TaskDefinition, load_definition
    from bidding.graphs.submit import GraphHandle, submit
    from bidding.graphs.validate import GraphValidationError
    from bidding.models import Announcement, Award, Bid, BidResponse, Refusal, RetryPolicy, Score
    from bidding.nodes.profile import NodeProfile, load_profile
    from bidding.observe import status
    from bidding.observe.explain import Explanation, explain
    from bidding.observe.reset import reset
    from bidding.strategies import (
        AgentJudgment,
        BestSkillMatch,
        Composite,
        HighestConfidence,
        Judgment,
        NodeCapability,
        Routing,
        SelectionStrategy,
        WeightedScore,
        llm_judge,
        register_strategy,
        resolve_strategy,
    )
    from bidding.task import BiddingTask

#: Where each public name lives, imported on first use (PEP 562): ``import bidding`` alone loads
#: none of it. A node worker's main process pays only for what its bootsteps use, and a client
#: that only calls ``.delay()`` does not load the HTTP API, the graphs' YAML or tracing (the
#: memory of a node's main process: docs/architecture.md, "Known costs").
_EXPORTS: dict[str, str] = {
    "install": "bidding.app",
    "mark_warm": "bidding.app",
    "warm": "bidding.app",
    "Settings": "bidding.config",
    "celery_conf": "bidding.config",
    "get_settings": "bidding.config",
    "load_settings": "bidding.config",
    "BiddingError": "bidding.errors",
    "ConfigurationError": "bidding.errors",
    "CostExceededError": "bidding.errors",
    "DeadlinePassedError": "bidding.errors",
    "EscalatedError": "bidding.errors",
    "NoBidsError": "bidding.errors",
    "NodeLostError": "bidding.errors",
    "NotRecordedError": "bidding.errors",
    "OutputValidationError": "bidding.errors",
    "ProfileError": "bidding.errors",
    "SubtaskFailedError": "bidding.errors",
    "TaskExpiredError": "bidding.errors",
    "UnknownStrategyError": "bidding.errors",
    "UnknownTaskError": "bidding.errors",
    "CurrentAward": "bidding.execution.current",
    "current_award": "bidding.execution.current",
    "GraphProgress": "bidding.graphs.progress",
    "TaskDefinition": "bidding.graphs.spec",
    "load_definition": "bidding.graphs.spec",
    "GraphHandle": "bidding.graphs.submit",
    "submit": "bidding.graphs.submit",
    "GraphValidationError": "bidding.graphs.validate",
    "Announcement": "bidding.models",
    "Award": "bidding.models",
    "Bid": "bidding.models",
    "BidResponse": "bidding.models",
    "Refusal": "bidding.models",
    "RetryPolicy": "bidding.models",
    "Score": "bidding.models",
    "NodeProfile": "bidding.nodes.profile",
    "load_profile": "bidding.nodes.profile",
    "Explanation": "bidding.observe.explain",
    "explain": "bidding.observe.explain",
    "reset": "bidding.observe.reset",
    "status": "bidding.observe",
    "AgentJudgment": "bidding.strategies",
    "BestSkillMatch": "bidding.strategies",
    "Composite": "bidding.strategies",
    "HighestConfidence": "bidding.strategies",
    "Judgment": "bidding.strategies",
    "NodeCapability": "bidding.strategies",
    "Routing": "bidding.strategies",
    "SelectionStrategy": "bidding.strategies",
    "WeightedScore": "bidding.strategies",
    "llm_judge": "bidding.strategies",
    "register_strategy": "bidding.strategies",
    "resolve_strategy": "bidding.strategies",
    "BiddingTask": "bidding.task",
}

__all__ = [
    "AgentJudgment",
    "Announcement",
    "Award",
    "BestSkillMatch",
    "Bid",
    "BidResponse",
    "BiddingError",
    "BiddingTask",
    "Composite",
    "ConfigurationError",
    "CostExceededError",
    "CurrentAward",
    "DeadlinePassedError",
    "EscalatedError",
    "Explanation",
    "GraphHandle",
    "GraphProgress",
    "GraphValidationError",
    "HighestConfidence",
    "Judgment",
    "NoBidsError",
    "NodeCapability",
    "NodeLostError",
    "NodeProfile",
    "NotRecordedError",
    "OutputValidationError",
    "ProfileError",
    "Refusal",
    "RetryPolicy",
    "Routing",
    "Score",
    "SelectionStrategy",
    "Settings",
    "SubtaskFailedError",
    "TaskDefinition",
    "TaskExpiredError",
    "UnknownStrategyError",
    "UnknownTaskError",
    "WeightedScore",
    "celery_conf",
    "current_award",
    "explain",
    "get_settings",
    "install",
    "llm_judge",
    "load_definition",
    "load_profile",
    "load_settings",
    "mark_warm",
    "register_strategy",
    "reset",
    "resolve_strategy",
    "status",
    "submit",
    "warm",
]


if not TYPE_CHECKING:  # mypy sees the imports above; an unknown name stays an error there

    def __getattr__(name: str) -> Any:
        """Import a public name's module when the name is first used, and keep it here."""
        where = _EXPORTS.get(name)
        if where is None:
            # As before, ``import bidding`` then ``bidding.config`` (a submodule) works.
            try:
                return importlib.import_module(f"{__name__}.{name}")
            except ModuleNotFoundError as exc:
                if exc.name != f"{__name__}.{name}":
                    raise
                raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
        # fromlist: what ``from where import name`` does (``status`` is a module).
        value = getattr(__import__(where, fromlist=[name]), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *__all__})
