"""The soak's checks at the end (pure): every accepted task in its right final state in the
store and at its caller, none lost, and every body that ran more often than its attempts
explained by a kill that fell between the body's end and its recorded completion."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.chaos.runs import Runs

#: Seconds after a body's end within which a kill of its node explains a second run (the
#: completion is recorded within milliseconds; a store restarting can stretch it).
KILL_WINDOW = 10.0


@dataclass(frozen=True)
class Submitted:
    """One task the soak submitted."""

    task_id: str
    i: int
    fails: bool
    #: Attempts its right outcome takes: 1, or 2 for a failing task (retried once).
    attempts: int


@dataclass(frozen=True)
class Outcome:
    """What one side (the store, or the caller's ``.get()``) says about a task."""

    #: "SUCCESS", "FAILED", "ESCALATED", or "MISSING"/"TIMEOUT" when there is none.
    state: str
    value: Any = None
    error: str = ""


@dataclass
class Verdict:
    """The soak's figures and every problem found (none means it held)."""

    accepted: int = 0
    refused: int = 0
    #: Exception name -> how many ``.delay()`` calls raised it (the broker or store down).
    refusals: Counter[str] = field(default_factory=Counter)
    succeeded: int = 0
    failed_as_meant: int = 0
    duplicates: int = 0
    duplicates_explained: int = 0
    interrupted_runs: int = 0
    journal: Counter[str] = field(default_factory=Counter)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every task was right and every duplicate explained."""
        return not self.problems


def judge(submitted: list[Submitted], refused: int, store: dict[str, Outcome],
          caller: dict[str, Outcome], runs: Runs, kills: list[tuple[str, float]],
          journal: Counter[str], expected: Any) -> Verdict:
    """Check every accepted task; ``expected(i, fails)`` is its right value or error text."""
    verdict = Verdict(accepted=len(submitted), refused=refused, journal=journal)
    for task in submitted:
        right = expected(task.i, task.fails)
        for side, outcome in (("store", store.get(task.task_id, Outcome("MISSING"))),
                              ("caller", caller.get(task.task_id, Outcome("MISSING")))):
            problem = _wrong(task, right, outcome)
            if problem:
                verdict.problems.append(f"task {task.i} ({task.task_id}) {side}: {problem}")
        if task.fails:
            verdict.failed_as_meant += store.get(task.task_id, Outcome("MISSING")).state == "FAILED"
        else:
            verdict.succeeded += store.get(task.task_id, Outcome("MISSING")).state == "SUCCESS"
        finished = sorted(runs.finished(task.task_id), key=lambda r: r.started)
        verdict.interrupted_runs += len(runs.interrupted(task.task_id))
        extra = len(finished) - task.attempts
        if extra > 0:
            verdict.duplicates += extra
            explained = sum(1 for run in finished[:-1] if any(
                node == run.node and run.ended is not None
                and run.ended <= at <= run.ended + KILL_WINDOW for node, at in kills))
            verdict.duplicates_explained += min(extra, explained)
            if explained < extra:
                verdict.problems.append(
                    f"task {task.i} ({task.task_id}): its body finished {len(finished)} times "
                    f"for {task.attempts} attempt(s), {extra - explained} not explained by a "
                    "kill between a body's end and its recorded completion")
    return verdict


def _wrong(task: Submitted, right: Any, outcome: Outcome) -> str:
    """Why ``outcome`` is not ``task``'s right one ("" when it is)."""
    if task.fails:
        if outcome.state != "FAILED":
            return f"{outcome.state} {outcome.error or outcome.value!r}, expected FAILED"
        if right not in outcome.error:
            return f"FAILED with {outcome.error!r}, expected its own error {right!r}"
        return ""
    if outcome.state != "SUCCESS":
        return f"{outcome.state} {outcome.error!r}, expected SUCCESS"
    if outcome.value != right:
        return f"SUCCESS with {outcome.value!r}, expected {right!r}"
    return ""
