"""The API's response models (pydantic), and how a task's own states read as AITP states."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from bidding.lifecycle import states
from bidding.observe.watch import WatchView

#: Our states as AITP 5.1's (PENDING, EXECUTING, COMPLETED, RETRYING, FAILED): waiting for or in
#: an auction is PENDING; COMPLETED before its output is checked is still EXECUTING; SUCCESS
#: is COMPLETED (as a task graph's final state is); ESCALATED (needs a human) is FAILED.
AITP_STATE: dict[str, str] = {
    states.PENDING: "PENDING",
    states.BIDDING: "PENDING",
    states.ASSIGNED: "PENDING",
    states.DEFERRED: "PENDING",
    states.EXECUTING: "EXECUTING",
    states.COMPLETED: "EXECUTING",
    states.RETRYING: "RETRYING",
    states.SUCCESS: "COMPLETED",
    states.FAILED: "FAILED",
    states.ESCALATED: "FAILED",
}
#: AITP states after which nothing changes.
FINAL = frozenset({"COMPLETED", "FAILED"})


def aitp_state(state: str) -> str:
    """The AITP state of a bidding task's state (a task graph's states are AITP's already)."""
    return AITP_STATE.get(state, state)


class Submitted(BaseModel):
    """AITP 8.1's answer: the task was recorded and its first subtasks announced."""

    task_id: str
    status: str
    created_at: float


class TaskState(BaseModel):
    """AITP 8.2: where a task stands."""

    task_id: str
    #: The AITP state: PENDING, EXECUTING, RETRYING, COMPLETED or FAILED.
    status: str
    #: The finer bidding state (BIDDING, ASSIGNED, DEFERRED, ESCALATED...), for a plain task.
    state: str
    #: 0-9, higher is more urgent ("high" 8, "normal" 5, "low" 2), for a plain task (a task
    #: graph's subtasks show their own).
    priority: int | None = None
    #: AITP 5.3: ``percent_complete``, ``total_steps`` and each step; a plain task's latest
    #: progress report (``current``, ``total``, ``percent``, ``note``) when it made one.
    progress: dict[str, Any]
    current_step: int
    #: Unix time; None when nothing allows an estimate.
    estimated_completion: float | None
    cost_so_far: float
    #: Seed 002's watch of a plain task delegated to a node (ASSIGNED or EXECUTING): checks
    #: without news, the next check, and ``escalated`` with its ``reason`` (a flag for a
    #: human: the task keeps running). None for a task graph or a task not on a node.
    watch: WatchView | None = None
    #: Why the sweepers stopped looking at a plain task (one of their scans failed on it pass
    #: after pass: an announcement this version cannot read); ``reset`` puts it back. None
    #: while it is not parked.
    parked: str | None = None
    #: Unix time after which a task not started never starts (the earlier of its expiry and
    #: its deadline); it then ends FAILED with the reason ``expired: ...``. None without one.
    expires_at: float | None = None
    #: AITP metadata: tags, creator, the cost its winning bid(s) estimated (a graph's: its
    #: subtasks' sum; None when no bid said) and the actual cost (its ledger's sum).
    tags: list[str] = []
    created_by: str | None = None
    estimated_cost: float | None = None
    actual_cost: float = 0.0
    #: A task graph's ledger: each subtask's entries in the order charged, with the budget
    #: left after each (``graphs.progress.GraphLedgerLine``); a plain task's entries.
    ledger: list[dict[str, Any]] = []
    remaining_budget: float | None = None


class TaskResult(BaseModel):
    """AITP 8.3: a final task's outcome."""

    task_id: str
    status: str
    #: The task's JSON output (a plain task's return value); None when it failed.
    result: Any = None
    cost: float
    execution_time_ms: float | None
    error: str | None = None


class NotDone(BaseModel):
    """The answer of ``/result`` before the task is final (409)."""

    task_id: str
    status: str
    detail: str


class Problem(BaseModel):
    """An error answer (401, 404, 422 of a definition that cannot run)."""

    detail: Any = Field(description="why: a sentence, or FastAPI's list of field errors")
