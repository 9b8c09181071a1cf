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

from bidding.app import install, warm
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
    UnknownStrategyError,
    UnknownTaskError,
)
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
    "UnknownStrategyError",
    "UnknownTaskError",
    "WeightedScore",
    "celery_conf",
    "explain",
    "get_settings",
    "install",
    "llm_judge",
    "load_definition",
    "load_profile",
    "load_settings",
    "register_strategy",
    "reset",
    "resolve_strategy",
    "status",
    "submit",
    "warm",
]
