"""The task state machine (AITP section 5 plus retries, deferral, escalation): every allowed
transition is allowed, every other pair of states is refused."""

from __future__ import annotations

import itertools

import pytest

from bidding.lifecycle.states import (
    ALLOWED,
    ASSIGNED,
    BIDDING,
    COMPLETED,
    DEFERRED,
    DUE_STATES,
    ESCALATED,
    EXECUTING,
    FAILED,
    FINAL_STATES,
    IN_FLIGHT_STATES,
    PENDING,
    RETRYING,
    STATES,
    SUCCESS,
    can_transition,
    sources,
)

#: Written out independently of ALLOWED: (from, to) and why.
DOCUMENTED = {
    (PENDING, BIDDING),        # announced (now, or when a scheduled start comes due)
    (RETRYING, BIDDING),       # backoff complete: a new auction (AITP: new agent selected)
    (DEFERRED, BIDDING),       # deferral over: announced again
    (BIDDING, ASSIGNED),       # awarded
    (ASSIGNED, ASSIGNED),      # re-awarded to the next-best bidder (winner lost before start)
    (EXECUTING, ASSIGNED),     # re-awarded to the next-best bidder (winner died while running)
    (ASSIGNED, EXECUTING),     # the winner accepted the task
    (EXECUTING, COMPLETED),    # the body returned within its time limit
    (COMPLETED, SUCCESS),      # the output matches the schema
    (EXECUTING, RETRYING),     # an attempt failed with retries left
    (ASSIGNED, RETRYING),      # the winner was lost and no other bidder is left: new auction
    (PENDING, DEFERRED),       # no capable node at the start
    (BIDDING, DEFERRED),
    (RETRYING, DEFERRED),      # a due retry finds no capable node
    (DEFERRED, DEFERRED),      # still none: deferred again
    (PENDING, FAILED),
    (BIDDING, FAILED),         # no valid bid
    (ASSIGNED, FAILED),        # winner lost and the fallback is to fail
    (EXECUTING, FAILED),       # no retries left / not retryable / budget exceeded
    (RETRYING, FAILED),        # deadline passed during the backoff
    (COMPLETED, FAILED),       # output invalid or budget exceeded
    (DEFERRED, FAILED),        # deadline passed while deferred
    (DEFERRED, ESCALATED),     # deferred too often: needs a human
    (ASSIGNED, ESCALATED),
    (EXECUTING, ESCALATED),
    (RETRYING, ESCALATED),
}
ALLOWED_PAIRS = {(src, target) for target, srcs in ALLOWED.items() for src in srcs}
ALL_PAIRS = list(itertools.product(STATES, STATES))


def test_allowed_table_is_the_documented_lifecycle() -> None:
    # given the table in bidding.lifecycle, then it is exactly the documented transitions
    assert ALLOWED_PAIRS == DOCUMENTED


def test_the_ten_states_and_their_groups() -> None:
    assert set(STATES) == {PENDING, BIDDING, ASSIGNED, EXECUTING, RETRYING, COMPLETED, SUCCESS,
                           FAILED, DEFERRED, ESCALATED}
    assert {SUCCESS, FAILED, ESCALATED} == FINAL_STATES
    assert IN_FLIGHT_STATES == (ASSIGNED, EXECUTING)
    assert set(DUE_STATES) == {PENDING, RETRYING, DEFERRED}


@pytest.mark.parametrize(("current", "target"), sorted(DOCUMENTED))
def test_every_documented_transition_is_allowed(current: str, target: str) -> None:
    assert can_transition(current, target) is True


@pytest.mark.parametrize(
    ("current", "target"), [p for p in ALL_PAIRS if p not in DOCUMENTED],
    ids=[f"{c}->{t}" for c, t in ALL_PAIRS if (c, t) not in DOCUMENTED],
)
def test_every_other_transition_is_refused(current: str, target: str) -> None:
    assert can_transition(current, target) is False


@pytest.mark.parametrize("final", sorted(FINAL_STATES))
def test_nothing_leaves_a_final_state(final: str) -> None:
    # given a task in a final state, then no transition out of it exists
    assert not any(can_transition(final, t) for t in STATES)


def test_unknown_states_are_refused() -> None:
    assert sources("NOPE") == frozenset()
    assert can_transition("NOPE", BIDDING) is False
    assert can_transition(PENDING, "NOPE") is False
