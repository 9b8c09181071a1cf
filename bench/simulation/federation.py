"""The simulated federation: task types, nodes with hidden true rates, and the offered load."""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from bidding.nodes.profile import NodeProfile

#: Task type -> (required skills, share of arrivals).
TASK_TYPES: dict[str, tuple[tuple[str, ...], float]] = {
    "extract": (("pdf",), 0.22),
    "translate": (("nlp",), 0.22),
    "summarize": (("nlp", "writing"), 0.20),
    "sql": (("database",), 0.20),
    "codegen": (("coding",), 0.16),
}

#: Content length bands: (share, min chars, max chars, success multiplier, duration multiplier).
#: Longer tasks are a little harder and take longer for every node: seed 000's content-length
#: confidence heuristic has some truth in it, but the same for every bidder.
LENGTH_BANDS: tuple[tuple[float, int, int, float, float], ...] = (
    (0.70, 80, 499, 1.00, 1.0),
    (0.20, 500, 1999, 0.95, 1.5),
    (0.10, 2000, 4000, 0.88, 2.5),
)
#: Spread of a task's duration around its node's mean (lognormal sigma).
DURATION_SIGMA = 0.4
#: Offered load against the founders' total capacity (work measured at capable nodes' mean).
TARGET_LOAD = 0.80
#: Fraction of the tasks counted as warm-up.
WARMUP = 0.20
NEWCOMER = "nova"


@dataclass(frozen=True)
class NodeSpec:
    """A node: its declared profile, and its hidden true success rate and speed per type."""

    profile: NodeProfile
    p_true: dict[str, float]
    mean_s: dict[str, float]
    joins_mid_run: bool = False

    @property
    def name(self) -> str:
        """The node's name (its profile's)."""
        return self.profile.name


def _node(name: str, skills: Sequence[str], capacity: int, rates: dict[str, tuple[float, float]],
          *, trust: float = 70.0, latency_ms: float = 50.0, price: float = 0.01,
          joins_mid_run: bool = False) -> NodeSpec:
    profile = NodeProfile(name=name, capabilities=list(skills), capacity=capacity, trust=trust,
                          latency_ms=latency_ms, price_per_unit=price)
    return NodeSpec(profile, {t: r[0] for t, r in rates.items()},
                    {t: r[1] for t, r in rates.items()}, joins_mid_run)


ALL_SKILLS = ("pdf", "nlp", "writing", "database", "coding")

#: (true success probability, mean duration in s) per task type the node is a candidate for.
FEDERATION: tuple[NodeSpec, ...] = (
    # The generalist: every skill, decent at everything, never the best.
    _node("atlas", ALL_SKILLS, 4, {t: (0.78, 60.0) for t in TASK_TYPES}),
    # The specialist: one skill, excellent and fast at it.
    _node("pdfpro", ["pdf"], 3, {"extract": (0.96, 40.0)}, latency_ms=30, price=0.015),
    # Good at some types, bad at others.
    _node("lingo", ["nlp", "writing", "pdf"], 3,
          {"translate": (0.93, 45.0), "summarize": (0.88, 55.0), "extract": (0.55, 70.0)}),
    _node("scribe", ["writing", "nlp"], 3,
          {"summarize": (0.93, 50.0), "translate": (0.62, 60.0)}, latency_ms=80),
    _node("dbx", ["database", "coding"], 3,
          {"sql": (0.94, 45.0), "codegen": (0.50, 70.0)}, price=0.012),
    _node("forge", ["coding", "database"], 3,
          {"codegen": (0.91, 55.0), "sql": (0.60, 60.0)}, latency_ms=70),
    # The bad node: declares every skill (and more), high trust, cheap and quick to answer.
    _node("hype", [*ALL_SKILLS, "gpu", "vision"], 4, {t: (0.35, 75.0) for t in TASK_TYPES},
          trust=90.0, latency_ms=10, price=0.004),
    # Joins at mid-run with no history: good at translation and code, the best at code.
    _node(NEWCOMER, ["nlp", "coding", "writing"], 3,
          {"translate": (0.90, 45.0), "codegen": (0.95, 50.0), "summarize": (0.80, 55.0)},
          joins_mid_run=True),
)


def capable(spec: NodeSpec, skills: Sequence[str]) -> bool:
    """The production candidate filter: the node has one of the required skills."""
    return not skills or bool(set(skills) & set(spec.profile.capabilities))


def check_federation(federation: Sequence[NodeSpec]) -> None:
    """Raise if a node's true-rate table does not list exactly the types it is capable of."""
    for spec in federation:
        for task_type, (skills, _) in TASK_TYPES.items():
            if capable(spec, skills) != (task_type in spec.p_true):
                raise ValueError(f"{spec.name}: true rate table does not match {task_type}")


def best_nodes(federation: Sequence[NodeSpec]) -> dict[str, str]:
    """The truly best node per task type among ``federation``."""
    return {t: max((s for s in federation if t in s.p_true), key=lambda s: s.p_true[t]).name
            for t in TASK_TYPES}


def best_rates(federation: Sequence[NodeSpec]) -> dict[str, float]:
    """The highest true success rate per task type among ``federation``."""
    return {t: max(s.p_true[t] for s in federation if t in s.p_true) for t in TASK_TYPES}


def replicate(federation: Sequence[NodeSpec], copies: int) -> tuple[NodeSpec, ...]:
    """A federation ``copies`` times as large: every node, and ``copies - 1`` twins of it
    (``atlas``, ``atlas-2``, ...) with the same profile and true rates. The offered load scales
    with it (``arrival_rate``)."""
    out = list(federation)
    for k in range(2, copies + 1):
        out += [replace(s, profile=s.profile.model_copy(update={"name": f"{s.name}-{k}"}))
                for s in federation]
    return tuple(out)


def varied(federation: Sequence[NodeSpec], copies: int, seed: int) -> tuple[NodeSpec, ...]:
    """Like ``replicate``, but every twin differs from its original: its true success rates
    times a factor drawn in [0.9, 1.05] (at most 0.99) and its mean durations times one drawn
    in [0.7, 1.4], per twin and seed. The first copy is ``federation`` itself."""
    rng = random.Random(seed * 7919 + copies)
    out = list(federation)
    for k in range(2, copies + 1):
        for s in federation:
            better, faster = rng.uniform(0.9, 1.05), rng.uniform(0.7, 1.4)
            out.append(replace(
                s, profile=s.profile.model_copy(update={"name": f"{s.name}-{k}"}),
                p_true={t: min(0.99, p * better) for t, p in s.p_true.items()},
                mean_s={t: m * faster for t, m in s.mean_s.items()}))
    return tuple(out)


def arrival_rate(federation: Sequence[NodeSpec], load: float = TARGET_LOAD) -> float:
    """Tasks/s giving ``load`` (default TARGET_LOAD) of the founders' capacity, each task
    costing the mean duration of the nodes capable of it (so a policy that prefers slow nodes
    runs hotter)."""
    founders = [s for s in federation if not s.joins_mid_run]
    length_factor = sum(b[0] * b[4] for b in LENGTH_BANDS)
    work = 0.0
    for task_type, (_, share) in TASK_TYPES.items():
        means = [s.mean_s[task_type] for s in founders if task_type in s.mean_s]
        work += share * statistics.fmean(means) * length_factor
    return load * sum(s.profile.capacity for s in founders) / work


def registration_order(federation: Sequence[NodeSpec], seed: int) -> list[str]:
    """The founders in the order they registered (FIFO's scan order): shuffled per seed."""
    founders = [s.name for s in federation if not s.joins_mid_run]
    random.Random(seed).shuffle(founders)
    return founders
