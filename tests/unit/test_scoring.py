"""Unit tests of the pure scores: seed 000's sub-scores and learned trust
(``bidding.auction.scores``), skill match, slot share, composite and routing
(``bidding.strategies.formulas``)."""

from __future__ import annotations

import pytest

from bidding.auction import scores
from bidding.strategies import formulas

# --- capability_score (seed 000 _calculate_capability_score) -------------------------------


def test_capability_without_requirements_assumes_capable():
    # given a task that requires no skills
    # when a node with any skills scores it
    # then seed 000's "assume capable" value 0.8 is returned
    assert scores.capability_score([], ["sql"]) == 0.8
    assert scores.capability_score([], []) == 0.8


def test_capability_of_node_without_skills_is_unknown():
    # given a task that requires skills and a node that declares none
    # when the capability is scored
    # then seed 000's "unknown capabilities" value 0.5 is returned
    assert scores.capability_score(["sql"], []) == 0.5


def test_capability_partial_match_is_fraction_of_required():
    # given a task requiring two skills, one of which the node has
    # when the capability is scored
    # then it is 1/2
    assert scores.capability_score(["sql", "gpu_inference"], ["sql", "coding"]) == 0.5


def test_capability_full_and_no_match():
    # given a node that has every required skill, and one that has none of them
    # then they score 1.0 and 0.0
    assert scores.capability_score(["sql", "coding"], ["coding", "sql", "x"]) == 1.0
    assert scores.capability_score(["sql", "coding"], ["monitoring"]) == 0.0


def test_capability_counts_duplicate_requirements_once():
    # given a requirement list that names "sql" twice and "gpu" once; the node has only "sql"
    # when the capability is scored
    # then the duplicate counts once: 1 of 2 distinct skills, not 2 of 3
    assert scores.capability_score(["sql", "sql", "gpu"], ["sql"]) == 0.5


def test_skill_match_is_zero_without_requirements():
    # given no required skills (seed 003 BestSkillMatch)
    # then the raw skill match is 0.0, unlike the capability score's 0.8
    assert formulas.skill_match([], ["sql"]) == 0.0


# --- experience_score ----------------------------------------------------------------------


def test_experience_without_episodes_is_0_3():
    # given a node with no episode of this task type
    # then its experience score is seed 000's 0.3
    assert scores.experience_score([]) == 0.3


def test_experience_is_success_rate():
    # given 3 successes out of 4 episodes
    # then the experience score is 0.75
    assert scores.experience_score([True, True, False, True]) == 0.75
    # and all failures give 0.0 (not the 0.3 of "no experience")
    assert scores.experience_score([False, False]) == 0.0


# --- load_score ----------------------------------------------------------------------------


def test_load_idle_node_is_fully_available():
    # given no work in flight on a node of capacity 4
    # then it is fully available
    assert scores.load_score(0, 4) == 1.0


def test_load_half_busy_node():
    # given 2 tasks in flight out of 4
    # then the load score is 0.5
    assert scores.load_score(2, 4) == 0.5


def test_load_over_capacity_is_floored():
    # given a node at and over its capacity
    # then the load score is floored at 0.1 so the node can still win on merit
    assert scores.load_score(4, 4) == pytest.approx(0.1)
    assert scores.load_score(9, 4) == pytest.approx(0.1)
    # and just under the floor is floored too: 1 - 19/20 = 0.05 -> 0.1
    assert scores.load_score(19, 20) == pytest.approx(0.1)


def test_load_with_zero_capacity_is_floor():
    # given a node that declares capacity 0 (cannot take work)
    # then the load score is the floor 0.1 rather than a division by zero
    assert scores.load_score(0, 0) == pytest.approx(0.1)


# --- confidence_score (length heuristic) ---------------------------------------------------


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.9), (499, 0.9), (500, 0.7), (1999, 0.7), (2000, 0.5), (10_000, 0.5)],
)
def test_confidence_by_content_length(length, expected):
    # given task content of a given length
    # when the node self-assesses
    # then short (<500) is 0.9, medium (<2000) is 0.7, long is 0.5
    assert scores.confidence_score("x" * length) == expected


# --- learned_trust -------------------------------------------------------------------------


def test_learned_trust_without_attempts_is_declared():
    # given a node that declared trust 70 and has no episodes yet
    # then its learned trust is the declared 70
    assert scores.learned_trust(70.0, 0, 0) == 70.0


def test_learned_trust_rises_with_successes():
    # given declared trust 70 and 90 successes out of 90 attempts
    # then trust moves toward 100: (70*10 + 100*90) / (10 + 90) = 97.0
    assert scores.learned_trust(70.0, 90, 90) == pytest.approx(97.0)
    assert scores.learned_trust(70.0, 90, 90) > 95.0


def test_learned_trust_falls_with_failures():
    # given declared trust 70 and 0 successes out of 90 attempts
    # then trust moves toward 0: (70*10 + 0) / 100 = 7.0
    assert scores.learned_trust(70.0, 0, 90) == pytest.approx(7.0)


def test_learned_trust_formula_weighs_declared_as_ten_episodes():
    # given declared 80, 3 successes of 10 attempts
    # then trust = (80*10 + 100*3) / (10 + 10) = 55.0
    assert scores.TRUST_PRIOR_WEIGHT == 10.0
    assert scores.learned_trust(80.0, 3, 10) == pytest.approx(55.0)
    # and after exactly 10 perfect episodes the declared trust and the record weigh the same
    assert scores.learned_trust(60.0, 10, 10) == pytest.approx(80.0)


# --- composite_score (seed 000) ------------------------------------------------------------


def test_composite_all_ones_is_one():
    # given every sub-score 1.0
    # then the 40/30/20/10 sum is 1.0 with no multipliers
    total, terms, multipliers = formulas.composite_score(1.0, 1.0, 1.0, 1.0)
    assert total == pytest.approx(1.0)
    assert terms == pytest.approx(
        {"capability": 0.4, "experience": 0.3, "load": 0.2, "confidence": 0.1}
    )
    assert multipliers == {}


def test_composite_is_weighted_sum():
    # given capability 0.5, experience 0.3, load 1.0, confidence 0.9
    # when the composite is computed
    # then it is 0.4*0.5 + 0.3*0.3 + 0.2*1.0 + 0.1*0.9 = 0.2 + 0.09 + 0.2 + 0.09 = 0.58
    total, terms, _ = formulas.composite_score(0.5, 0.3, 1.0, 0.9)
    assert total == pytest.approx(0.4 * 0.5 + 0.3 * 0.3 + 0.2 * 1.0 + 0.1 * 0.9)
    assert total == pytest.approx(0.58)
    assert terms["capability"] == pytest.approx(0.2)
    assert terms["experience"] == pytest.approx(0.09)
    assert terms["load"] == pytest.approx(0.2)
    assert terms["confidence"] == pytest.approx(0.09)


def test_composite_preferred_node_bonus():
    # given the 0.58 bid above, on the task's preferred node
    # then the total is 0.58 * 1.1 = 0.638 and the multiplier is recorded
    total, _, multipliers = formulas.composite_score(0.5, 0.3, 1.0, 0.9, is_preferred_node=True)
    assert total == pytest.approx(0.638)
    assert multipliers == {"preferred_node": pytest.approx(1.1)}


def test_composite_two_recent_failures_no_penalty():
    # given a node with exactly 2 recent failures (seed 000 penalises > 2)
    # then no penalty is applied
    total, _, multipliers = formulas.composite_score(0.5, 0.3, 1.0, 0.9, recent_failures=2)
    assert total == pytest.approx(0.58)
    assert "recent_failures" not in multipliers


def test_composite_three_recent_failures_penalised():
    # given a node with 3 recent failures
    # then the total is 0.58 * 0.8 = 0.464 and the multiplier is recorded
    total, _, multipliers = formulas.composite_score(0.5, 0.3, 1.0, 0.9, recent_failures=3)
    assert total == pytest.approx(0.464)
    assert multipliers == {"recent_failures": pytest.approx(0.8)}


def test_composite_bonus_and_penalty_combine():
    # given a preferred node that also failed 3 times recently
    # then both multipliers apply: 0.58 * 1.1 * 0.8 = 0.5104
    total, _, multipliers = formulas.composite_score(
        0.5, 0.3, 1.0, 0.9, is_preferred_node=True, recent_failures=3
    )
    assert total == pytest.approx(0.5104)
    assert set(multipliers) == {"preferred_node", "recent_failures"}


def test_composite_capped_at_one():
    # given a perfect preferred bid: 1.0 * 1.1 = 1.1
    # then the total is capped at 1.0
    total, _, multipliers = formulas.composite_score(1.0, 1.0, 1.0, 1.0, is_preferred_node=True)
    assert total == 1.0
    assert multipliers == {"preferred_node": pytest.approx(1.1)}
    # and a near-perfect one is capped as well: 0.95 * 1.1 = 1.045 -> 1.0
    total, _, _ = formulas.composite_score(1.0, 1.0, 0.75, 1.0, is_preferred_node=True)
    assert total == 1.0


# --- routing_score (AITP 4.2, parentheses corrected) ---------------------------------------


def test_routing_perfect_bid_is_one():
    # given capability 1, trust 100, latency 0 ms, cost 0 of a max 1.0
    # then every term is full and the total is 1.0
    total, terms = formulas.routing_score(1.0, 100.0, 0.0, 0.0, 1.0)
    assert total == pytest.approx(1.0)
    assert terms == pytest.approx({"capability": 0.3, "trust": 0.3, "latency": 0.2, "cost": 0.2})


def test_routing_latency_500ms_halves_latency_term():
    # given a latency of 500 ms
    # then the latency term is (1 - 500/1000) * 0.2 = 0.1 (not 1 - 0.5*0.2 = 0.9)
    total, terms = formulas.routing_score(1.0, 100.0, 500.0, 0.0, 1.0)
    assert terms["latency"] == pytest.approx(0.1)
    assert total == pytest.approx(0.9)


def test_routing_latency_over_one_second_clamps_to_zero():
    # given a latency of 2500 ms
    # then the latency term is 0, not negative
    total, terms = formulas.routing_score(1.0, 100.0, 2500.0, 0.0, 1.0)
    assert terms["latency"] == 0.0
    assert total == pytest.approx(0.8)


def test_routing_zero_max_cost_gives_full_cost_term():
    # given max_cost 0 (every bid is free)
    # then the cost term is the full 0.2, with no division by zero
    _, terms = formulas.routing_score(0.0, 0.0, 0.0, 0.0, 0.0)
    assert terms["cost"] == pytest.approx(0.2)


def test_routing_cost_terms():
    # given a cost of 0.25 against a max of 1.0
    # then the cost term is (1 - 0.25) * 0.2 = 0.15
    _, terms = formulas.routing_score(1.0, 100.0, 0.0, 0.25, 1.0)
    assert terms["cost"] == pytest.approx(0.15)
    # and a cost above the max clamps the term to 0, not negative
    total, terms = formulas.routing_score(1.0, 100.0, 0.0, 3.0, 1.0)
    assert terms["cost"] == 0.0
    assert total == pytest.approx(0.8)


def test_routing_mixed_bid():
    # given capability 0.5, trust 70, latency 200 ms, cost 0.5 of max 2.0
    # then 0.3*0.5 + 0.3*0.7 + 0.2*0.8 + 0.2*0.75 = 0.15 + 0.21 + 0.16 + 0.15 = 0.67
    total, terms = formulas.routing_score(0.5, 70.0, 200.0, 0.5, 2.0)
    assert terms["trust"] == pytest.approx(0.21)
    assert total == pytest.approx(0.67)


def test_estimated_cost_is_price_times_units():
    # given a price of 0.02 per unit and 150 units
    # then the cost is 3.0
    assert scores.estimated_cost(0.02, 150) == pytest.approx(3.0)


def test_estimated_success_is_optimistic_without_history():
    # given no record, a node bids as if it could do it (so a newcomer gets tried)
    assert scores.estimated_success(()) == 1.0
    # and two failures bring it to 0.5: (0 + 2) / (2 + 2)
    assert scores.estimated_success((False, False)) == 0.5


def test_estimated_success_starts_at_the_prior_and_learns():
    # given no history, the estimate is the prior (seed 000's content heuristic)
    assert scores.estimated_success((), 0.9) == 0.9
    # given 10 successes of 10, it rises toward 1: (10 + 1.8) / 12
    assert scores.estimated_success((True,) * 10, 0.9) == pytest.approx(11.8 / 12)
    # given 10 failures of 10, it falls below min_confidence 0.5: 1.8 / 12
    assert scores.estimated_success((False,) * 10, 0.9) == pytest.approx(0.15)
    # and a heavier prior moves slower
    assert scores.estimated_success((False,), 0.9, weight=8) == pytest.approx(7.2 / 9)


def test_slot_share_is_one_with_a_free_slot_then_shrinks():
    assert formulas.slot_share(0, 4) == 1.0
    assert formulas.slot_share(3, 4) == 1.0  # the fourth slot is free
    assert formulas.slot_share(4, 4) == pytest.approx(0.8)  # queued behind 4: 4/5
    assert formulas.slot_share(7, 4) == pytest.approx(0.5)
    assert formulas.slot_share(0, 0) == 0.0
