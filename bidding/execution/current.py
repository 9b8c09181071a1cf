"""The award a task's body runs under: ``bidding.current_award()``.

```python
@app.task(base=bidding.BiddingTask)
def summarize(text):
    award = bidding.current_award()
    return run_with(award.proposal, text)    # "with your approach": the winner's proposal
```
Set by the node for the time of the body only (a context variable: each thread of a thread
pool, and each asyncio task, sees its own), so the caller, a plain Celery task and the code
that records the outcome see None.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from bidding.execution.running import Running

__all__ = ["CurrentAward", "current_award", "running_under"]


@dataclass(frozen=True)
class CurrentAward:
    """The award a bidding task's body runs under (immutable)."""

    task_id: str
    #: The node that won the task and runs it.
    node: str
    #: The winning bid's proposal: how the node said it would do the task ("" when the award
    #: was no bid's, as a fallback award is).
    proposal: str
    #: The winning bid's score under the task's strategy (None when the award was no bid's).
    score: float | None
    #: The attempt (1, then 2 for the first retry, ...).
    attempt: int
    #: The task's budget minus what its earlier attempts spent (never below 0); None when the
    #: task has no budget.
    budget_left: float | None


_CURRENT: ContextVar[CurrentAward | None] = ContextVar("bidding_current_award", default=None)


def current_award() -> CurrentAward | None:
    """The award of the bidding task whose body calls this; None anywhere else (the caller, a
    plain Celery task, after the body)."""
    return _CURRENT.get()


def award_of(run: Running) -> CurrentAward:
    """The award ``run`` runs under, from what its begin read."""
    announcement = run.announcement
    budget = None if announcement is None else announcement.budget
    spent = 0.0 if announcement is None else announcement.spent
    return CurrentAward(
        task_id=run.task_id,
        node=run.node,
        proposal=run.proposal,
        score=run.score,
        attempt=run.attempt,
        budget_left=None if budget is None else max(0.0, budget - spent),
    )


@contextmanager
def running_under(run: Running) -> Iterator[CurrentAward]:
    """``current_award()`` is ``run``'s award inside the block, and what it was before after it
    (whatever the block raised)."""
    award = award_of(run)
    token = _CURRENT.set(award)
    try:
        yield award
    finally:
        _CURRENT.reset(token)
