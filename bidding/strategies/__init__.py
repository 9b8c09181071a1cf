"""Selection strategies (seed 003): the protocol, the built-ins, the LLM judge and the resolver.

The names below are the public face of the family (``bidding.strategies.Composite`` and
``"bidding.strategies:WeightedScore"`` keep working as strategy paths).
"""

from bidding.strategies.builtins import (
    BestSkillMatch,
    Composite,
    HighestConfidence,
    Routing,
    WeightedScore,
    break_tie,
)
from bidding.strategies.judge import AgentJudgment, Judge, Judgment, judgment_prompt, llm_judge
from bidding.strategies.protocol import (
    NodeCapability,
    ScoringStrategy,
    SelectionStrategy,
    capabilities_of,
    decides_at_once,
    run_select,
)
from bidding.strategies.resolver import (
    STRATEGIES,
    register_strategy,
    resolve_strategy,
    strategy_name,
)

__all__ = [
    "STRATEGIES",
    "AgentJudgment",
    "BestSkillMatch",
    "Composite",
    "HighestConfidence",
    "Judge",
    "Judgment",
    "NodeCapability",
    "Routing",
    "ScoringStrategy",
    "SelectionStrategy",
    "WeightedScore",
    "break_tie",
    "capabilities_of",
    "decides_at_once",
    "judgment_prompt",
    "llm_judge",
    "register_strategy",
    "resolve_strategy",
    "run_select",
    "strategy_name",
]
