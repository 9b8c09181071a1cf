"""Task states and the transitions allowed between them (AITP section 5), as pure data.

A transition is applied in the store as a compare-and-set (``UPDATE ... WHERE state IN
(allowed sources)``), so concurrent actors (a late bid, a sweeper, a duplicate award, a
watchdog) can never move a task twice; a refused transition is logged, never applied.

```
PENDING -> BIDDING -> ASSIGNED -> EXECUTING -> COMPLETED -> SUCCESS
   |          |  \\        |  ^       |    \\          \\
   |          |   DEFERRED |  |       |     RETRYING    FAILED (output invalid)
   |          |      |     |  |       |        |
   |          FAILED  ESCALATED   (next-best re-award)  -> BIDDING (new attempt)
```
"""

from __future__ import annotations

from typing import Final

PENDING: Final = "PENDING"
BIDDING: Final = "BIDDING"
ASSIGNED: Final = "ASSIGNED"
EXECUTING: Final = "EXECUTING"
RETRYING: Final = "RETRYING"
COMPLETED: Final = "COMPLETED"
SUCCESS: Final = "SUCCESS"
FAILED: Final = "FAILED"
DEFERRED: Final = "DEFERRED"
ESCALATED: Final = "ESCALATED"

STATES: Final = (PENDING, BIDDING, ASSIGNED, EXECUTING, RETRYING, COMPLETED, SUCCESS, FAILED,
                 DEFERRED, ESCALATED)
FINAL_STATES: Final = frozenset({SUCCESS, FAILED, ESCALATED})
#: States in which a task occupies its node (the node's in-flight count is derived from these).
IN_FLIGHT_STATES: Final = (ASSIGNED, EXECUTING)
#: States a sweeper announces when their ``due_at`` has come.
DUE_STATES: Final = (PENDING, RETRYING, DEFERRED)

#: target state -> the states it may be entered from, and why (AITP 5.2 plus our additions).
ALLOWED: Final[dict[str, frozenset[str]]] = {
    # announced now, or when a scheduled start / retry backoff / deferral comes due
    BIDDING: frozenset({PENDING, RETRYING, DEFERRED}),
    # awarded; or re-awarded to the next-best bidder when the winner went offline or never
    # started the task (AITP 6.2 SELECT_NEXT_BEST)
    ASSIGNED: frozenset({BIDDING, ASSIGNED, EXECUTING}),
    # the winner's worker accepted the task (TASK_ACCEPTED)
    EXECUTING: frozenset({ASSIGNED}),
    # the body returned within its time limit
    COMPLETED: frozenset({EXECUTING}),
    # the output matches the task's output schema (or it has none)
    SUCCESS: frozenset({COMPLETED}),
    # an attempt failed with retries left: wait the backoff, then a new auction
    RETRYING: frozenset({EXECUTING, ASSIGNED}),
    # no capable node: announce again later (AITP 6.2 DEFER); a due task that still finds
    # none is deferred again
    DEFERRED: frozenset({PENDING, BIDDING, RETRYING, DEFERRED}),
    # no bid / no retries left / output invalid / budget exceeded / deadline passed
    FAILED: frozenset({PENDING, BIDDING, ASSIGNED, EXECUTING, RETRYING, COMPLETED, DEFERRED}),
    # needs a human: deferred too often, or a watchdog ran out of options
    ESCALATED: frozenset({DEFERRED, ASSIGNED, EXECUTING, RETRYING}),
}


def sources(target: str) -> frozenset[str]:
    """The states from which ``target`` may be entered (empty for an unknown target)."""
    return ALLOWED.get(target, frozenset())


def can_transition(current: str, target: str) -> bool:
    """True when ``current -> target`` is allowed."""
    return current in sources(target)
