"""Task states and the transitions allowed between them (AITP section 5), as pure data.

A transition is applied in the store as a compare-and-set (``UPDATE ... WHERE state IN
(allowed sources)``), so concurrent actors (a late bid, the deadline closer, a duplicate
award) can never move a task twice.
"""

from __future__ import annotations

from typing import Final

PENDING: Final = "PENDING"
BIDDING: Final = "BIDDING"
ASSIGNED: Final = "ASSIGNED"
EXECUTING: Final = "EXECUTING"
SUCCESS: Final = "SUCCESS"
FAILED: Final = "FAILED"

STATES: Final = (PENDING, BIDDING, ASSIGNED, EXECUTING, SUCCESS, FAILED)
FINAL_STATES: Final = frozenset({SUCCESS, FAILED})
#: States in which a task occupies its node (the node's in-flight count is derived from these).
IN_FLIGHT_STATES: Final = (ASSIGNED, EXECUTING)

#: target state -> the states it may be entered from.
ALLOWED: Final[dict[str, frozenset[str]]] = {
    BIDDING: frozenset({PENDING}),
    ASSIGNED: frozenset({BIDDING}),
    EXECUTING: frozenset({ASSIGNED}),
    SUCCESS: frozenset({EXECUTING}),
    FAILED: frozenset({PENDING, BIDDING, ASSIGNED, EXECUTING}),
}


def sources(target: str) -> frozenset[str]:
    """The states from which ``target`` may be entered (empty for an unknown target)."""
    return ALLOWED.get(target, frozenset())


def can_transition(current: str, target: str) -> bool:
    """True when ``current -> target`` is allowed."""
    return current in sources(target)
