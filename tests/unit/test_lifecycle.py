"""Unit tests of bidding.lifecycle: which state transitions are allowed, exhaustively."""

from __future__ import annotations

import itertools

import pytest

from bidding import lifecycle
from bidding.lifecycle import (
    ALLOWED,
    ASSIGNED,
    BIDDING,
    EXECUTING,
    FAILED,
    FINAL_STATES,
    IN_FLIGHT_STATES,
    PENDING,
    STATES,
    SUCCESS,
    can_transition,
    sources,
)

#: AITP section 5, written out independently of ALLOWED: (from, to).
DOCUMENTED = {
    (PENDING, BIDDING),
    (BIDDING, ASSIGNED),
    (ASSIGNED, EXECUTING),
    (EXECUTING, SUCCESS),
    (PENDING, FAILED),
    (BIDDING, FAILED),
    (ASSIGNED, FAILED),
    (EXECUTING, FAILED),
}
ALLOWED_PAIRS = {(src, target) for target, srcs in ALLOWED.items() for src in srcs}
ALL_PAIRS = list(itertools.product(STATES, STATES))


def test_allowed_table_is_the_documented_lifecycle():
    # given the transition table
    # then it allows exactly the documented transitions
    assert ALLOWED_PAIRS == DOCUMENTED


def test_states_are_the_six_lifecycle_states():
    # given the lifecycle module
    # then it names six distinct states, two of them final, two occupying a node
    assert STATES == ("PENDING", "BIDDING", "ASSIGNED", "EXECUTING", "SUCCESS", "FAILED")
    assert sorted(FINAL_STATES) == ["FAILED", "SUCCESS"]
    assert IN_FLIGHT_STATES == (ASSIGNED, EXECUTING)
    # and the table only mentions known states
    assert {s for pair in ALLOWED_PAIRS for s in pair} <= set(STATES)


@pytest.mark.parametrize(("current", "target"), sorted(ALLOWED_PAIRS))
def test_every_allowed_transition_is_allowed(current, target):
    # given a transition listed in ALLOWED
    # then can_transition allows it
    assert can_transition(current, target) is True


@pytest.mark.parametrize(
    ("current", "target"), [p for p in ALL_PAIRS if p not in ALLOWED_PAIRS],
    ids=[f"{c}->{t}" for c, t in ALL_PAIRS if (c, t) not in ALLOWED_PAIRS],
)
def test_every_other_transition_is_refused(current, target):
    # given any pair of states not listed in ALLOWED (self-transitions and final states too)
    # then can_transition refuses it
    assert can_transition(current, target) is False


def test_exhaustive_count():
    # given the 6 x 6 pairs of states
    # then 8 are allowed and 28 refused
    allowed = [p for p in ALL_PAIRS if can_transition(*p)]
    assert len(ALL_PAIRS) == 36
    assert len(allowed) == 8
    assert set(allowed) == DOCUMENTED


@pytest.mark.parametrize("state", STATES)
def test_no_self_transition(state):
    # given any state
    # then it cannot be re-entered from itself (a duplicate actor cannot move it "again")
    assert can_transition(state, state) is False


@pytest.mark.parametrize("final", sorted(FINAL_STATES))
def test_final_states_have_no_way_out(final):
    # given a final state
    # then no transition leaves it
    assert [t for t in STATES if can_transition(final, t)] == []


def test_unknown_states_are_refused():
    # given a state name that does not exist
    # then it has no sources, and no transition into or out of it is allowed
    assert sources("ARCHIVED") == frozenset()
    assert can_transition(PENDING, "ARCHIVED") is False
    assert can_transition("ARCHIVED", BIDDING) is False
    assert lifecycle.sources(PENDING) == frozenset()
