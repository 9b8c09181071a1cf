"""Unit tests of the pure parts of bidding.award: eligibility, decide, loads, fallback.

No broker and no database: ``decide``, ``refresh_loads`` and ``fallback_node`` are pure, and the
in-flight reservation is simulated with a dict of counts updated after each award.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from bidding.auction.decision import decide, fallback_node, ineligibility, refresh_loads
from bidding.models import Announcement, Bid, Refusal
from bidding.nodes.registry import LiveNode
from bidding.strategies import (
    AgentJudgment,
    Judgment,
    NodeCapability,
    WeightedScore,
    resolve_strategy,
)

# --- helpers -------------------------------------------------------------------------------


def make_rfp(**fields: Any) -> Announcement:
    values: dict[str, Any] = {"task_id": "t-1", "task_name": "demo.work", "task_type": "analysis"}
    values.update(fields)
    return Announcement(**values)


def make_bid(node: str, **fields: Any) -> Bid:
    values: dict[str, Any] = {
        "task_id": "t-1",
        "capability": 1.0,
        "experience": 0.5,
        "load": 1.0,
        "confidence": 0.8,
        "trust": 70.0,
        "skills": ["x"],
    }
    values.update(fields)
    return Bid(node=node, **values)


def refusal(node: str, reason: str) -> Refusal:
    return Refusal(task_id="t-1", node=node, reason=reason)


def live(name: str, capacity: int = 4) -> LiveNode:
    return LiveNode(name=name, capabilities=("x",), capacity=capacity, price_per_unit=0.01,
                    latency_ms=10.0, trust=70.0, last_heartbeat=0.0)


def award_of(announcement: Announcement, bids: Sequence[Bid], strategy: Any = None,
             refusals: Sequence[Refusal] = (), candidates: int = 3):
    return decide(announcement, bids, refusals, strategy or WeightedScore(rng=random.Random(0)),
                  closed_by="all bids in", candidates=candidates)


class RefuseAll:
    """A custom strategy that finds every bid unacceptable."""

    name = "refuse_all"

    def select(self, bids: Sequence[Bid], announcement: Announcement,
               capabilities: Mapping[str, NodeCapability]) -> Bid | None:
        return None


class CostAwareStrategy:
    """Seed 003 section 5, async form: most confident bid within a token budget."""

    def __init__(self, max_tokens: int = 1000):
        self.max_tokens = max_tokens

    async def select(self, bids: Sequence[Bid], announcement: Announcement,
                     capabilities: Mapping[str, NodeCapability]) -> Bid | None:
        affordable = [b for b in bids if b.metadata.get("estimated_tokens", 0) <= self.max_tokens]
        if not affordable:
            affordable = list(bids)
        return max(affordable, key=lambda b: b.confidence) if affordable else None


# --- ineligibility -------------------------------------------------------------------------


def test_ineligible_when_confidence_below_min_confidence():
    # given a task requiring confidence 0.6 and a bid at 0.55
    announcement = make_rfp(min_confidence=0.6)
    # when its eligibility is checked
    why = ineligibility(make_bid("a", confidence=0.55), announcement)
    # then the reason names both numbers
    assert why == "confidence 0.55 below min_confidence 0.60"


def test_ineligible_when_trust_below_min_trust():
    # given a task requiring trust 60 and a bid from a node trusted 42.5
    announcement = make_rfp(min_trust=60)
    # when its eligibility is checked
    why = ineligibility(make_bid("a", trust=42.5), announcement)
    # then the reason names both numbers
    assert why == "trust 42.5 below min_trust 60.0"


def test_ineligible_when_cost_above_budget():
    # given a task with budget 0.05 and a bid costing 0.1
    announcement = make_rfp(budget=0.05)
    # when its eligibility is checked
    why = ineligibility(make_bid("a", cost=0.1), announcement)
    # then the reason names the cost and the budget
    assert why == "cost 0.1000 exceeds remaining budget 0.0500"


def test_eligible_bid_has_no_reason():
    # given a bid meeting every threshold exactly (confidence 0.5, trust 50, cost == budget)
    announcement = make_rfp(min_confidence=0.5, min_trust=50, budget=0.1)
    bid = make_bid("a", confidence=0.5, trust=50.0, cost=0.1)
    # when its eligibility is checked
    # then it is eligible: the thresholds are inclusive
    assert ineligibility(bid, announcement) is None


def test_no_budget_means_any_cost_is_eligible():
    # given a task without budget and an expensive bid
    # then cost does not make it ineligible
    assert ineligibility(make_bid("a", cost=1e6), make_rfp()) is None


# --- decide: no winner ---------------------------------------------------------------------


def test_no_candidates_fails_with_no_bidders_registered():
    # given an auction that had no candidate at all for skill "gpu"
    announcement = make_rfp(required_skills=["gpu"])
    # when it is decided
    award = award_of(announcement, [], candidates=0)
    # then it fails with seed 001's "No bidders registered", naming the skill
    assert award.outcome == "failed"
    assert award.winner is None
    assert award.error is not None
    assert award.error.startswith("No bidders registered")
    assert award.error == "No bidders registered: no live node offers gpu"


def test_no_candidates_without_required_skills_says_any_skill():
    # given no candidates and a task that requires no skill
    award = award_of(make_rfp(), [], candidates=0)
    # then the message says no node offers any skill
    assert award.error == "No bidders registered: no live node offers any skill"


def test_only_refusals_lists_every_refusal_reason():
    # given two candidates that both refused
    refusals = [refusal("north", "deadline passed"), refusal("south", "no matching capability")]
    # when the auction is decided
    award = award_of(make_rfp(), [], refusals=refusals, candidates=2)
    # then it fails with "No bids received" and each node's reason
    assert award.outcome == "failed"
    assert award.error == (
        "No bids received: every answering node refused "
        "(north: deadline passed; south: no matching capability)"
    )
    assert award.scores == []


def test_no_answers_at_all_names_candidates_and_window():
    # given two candidates that did not answer within a 1.5 s window
    announcement = make_rfp(window=1.5)
    # when the auction is decided
    award = award_of(announcement, [], candidates=2)
    # then the message counts the candidates and states the window
    assert award.outcome == "failed"
    assert award.error == "No bids received: none of 2 candidate(s) answered within 1.5s"


def test_all_bids_below_min_confidence():
    # given two bids, both below min_confidence 0.7
    announcement = make_rfp(min_confidence=0.7)
    bids = [make_bid("a", confidence=0.6), make_bid("b", confidence=0.5)]
    # when the auction is decided
    award = award_of(announcement, bids)
    # then it fails with seed 001's "No bids met minimum confidence"
    assert award.outcome == "failed"
    assert award.winner is None
    assert award.error is not None
    assert award.error.startswith("No bids met minimum confidence")
    assert award.error == (
        "No bids met minimum confidence (0.70): "
        "a: confidence 0.60 below min_confidence 0.70; "
        "b: confidence 0.50 below min_confidence 0.70"
    )
    # and every bid is recorded as ineligible with its reason and a zero total
    assert [(s.node, s.eligible, s.total) for s in award.scores] == [
        ("a", False, 0.0),
        ("b", False, 0.0),
    ]
    assert award.scores[0].reason == "confidence 0.60 below min_confidence 0.70"
    assert award.scores[1].reason == "confidence 0.50 below min_confidence 0.70"


def test_mixed_ineligibility_reasons_say_no_valid_bids():
    # given one bid below min_confidence and one over budget
    announcement = make_rfp(min_confidence=0.6, budget=0.5)
    bids = [make_bid("a", confidence=0.4), make_bid("b", cost=0.75)]
    # when the auction is decided
    award = award_of(announcement, bids)
    # then the error is "No valid bids" with both reasons (not the confidence message)
    assert award.outcome == "failed"
    assert award.error == (
        "No valid bids: a: confidence 0.40 below min_confidence 0.60; "
        "b: cost 0.7500 exceeds remaining budget 0.5000"
    )


def test_strategy_that_selects_none_fails_the_auction():
    # given two eligible bids and a strategy that accepts none
    bids = [make_bid("a"), make_bid("b")]
    # when the auction is decided
    award = award_of(make_rfp(), bids, strategy=RefuseAll())
    # then it fails, naming the strategy and the number of eligible bids
    assert award.outcome == "failed"
    assert award.winner is None
    assert award.strategy == "refuse_all"
    assert award.error == "No valid bids: strategy refuse_all selected none of 2 eligible bid(s)"


# --- decide: a winner ----------------------------------------------------------------------


def test_best_bid_wins_and_every_bid_is_scored():
    # given a task requiring "x" and three bids: a (0.9, has x), b (0.7, has x), c (too unsure)
    announcement = make_rfp(required_skills=["x"], min_confidence=0.5)
    bids = [
        make_bid("a", confidence=0.9, skills=["x"]),
        make_bid("b", confidence=0.7, skills=["x", "y"]),
        make_bid("c", confidence=0.3, skills=["x"]),
    ]
    # when the default strategy decides
    award = award_of(announcement, bids, strategy=resolve_strategy("weighted"), candidates=3)
    # then a wins with 0.6 * 0.9 + 0.4 * 1.0
    assert award.outcome == "awarded"
    assert award.winner == "a"
    assert award.strategy == "weighted"
    assert award.closed_by == "all bids in"
    assert award.error is None
    by_node = {s.node: s for s in award.scores}
    assert set(by_node) == {"a", "b", "c"}
    assert by_node["a"].eligible is True
    assert by_node["a"].total == pytest.approx(0.94)
    assert by_node["a"].terms == pytest.approx({"confidence": 0.54, "skill_match": 0.4})
    assert by_node["b"].eligible is True
    assert by_node["b"].total == pytest.approx(0.82)
    assert by_node["b"].terms == pytest.approx({"confidence": 0.42, "skill_match": 0.4})
    # and the filtered bid is recorded as ineligible, with its reason and no terms
    assert by_node["c"].eligible is False
    assert by_node["c"].total == 0.0
    assert by_node["c"].terms == {}
    assert by_node["c"].reason == "confidence 0.30 below min_confidence 0.50"


def test_ineligible_best_bid_does_not_win():
    # given the most confident bid is over budget
    announcement = make_rfp(budget=1.0)
    bids = [make_bid("rich", confidence=0.95, cost=2.0), make_bid("cheap", confidence=0.6)]
    # when decided
    award = award_of(announcement, bids)
    # then the eligible one wins
    assert award.winner == "cheap"


def test_agent_judgment_reasoning_is_on_the_winners_score():
    # given a judge that picks b, with its reasoning
    def judge(bids, announcement, capabilities):
        return Judgment(selected_agent_id="b", reasoning="b knows the domain")

    announcement = make_rfp(required_skills=["x"])
    bids = [make_bid("a", confidence=0.9), make_bid("b", confidence=0.6)]
    # when AgentJudgment decides
    award = award_of(announcement, bids, strategy=AgentJudgment(judge=judge))
    # then the judge's pick wins, although the fallback scores favour a
    assert award.outcome == "awarded"
    assert award.winner == "b"
    assert award.strategy == "agent_judgment"
    by_node = {s.node: s for s in award.scores}
    assert by_node["b"].reason == "b knows the domain"
    # and only the winner's score carries the reasoning; the others keep their terms
    assert by_node["a"].reason == ""
    assert by_node["a"].total > by_node["b"].total
    assert set(by_node["a"].terms) == {"confidence", "skill_match"}


def test_agent_judgment_fallback_reason_when_judge_names_a_non_bidder():
    # given a judge that names a node that did not bid
    def judge(bids, announcement, capabilities):
        return Judgment(selected_agent_id="ghost", reasoning="ghost is best")

    bids = [make_bid("a", confidence=0.9), make_bid("b", confidence=0.6)]
    # when AgentJudgment decides
    award = award_of(make_rfp(), bids, strategy=AgentJudgment(judge=judge))
    # then the fallback (weighted) picks a, and a's score says why
    assert award.winner == "a"
    reason = {s.node: s.reason for s in award.scores}["a"]
    assert reason == "judge named 'ghost', which did not bid; fell back to weighted"


def test_async_custom_strategy_decides():
    # given seed 003's async CostAwareStrategy and a confident bid over the token budget
    bids = [
        make_bid("big", confidence=0.9, metadata={"estimated_tokens": 800}),
        make_bid("small", confidence=0.7, metadata={"estimated_tokens": 200}),
    ]
    # when it decides with a 500-token budget
    award = award_of(make_rfp(), bids, strategy=CostAwareStrategy(max_tokens=500))
    # then its coroutine is run to completion and the affordable bid wins
    assert award.outcome == "awarded"
    assert award.winner == "small"
    # and the strategy is recorded by its class path; it scores nothing
    assert award.strategy == "tests.unit.test_award:CostAwareStrategy"
    assert award.scores == []


def test_award_carries_task_id_and_attempt():
    # given the second attempt of a task
    announcement = make_rfp(task_id="t-42", attempt=2)
    # when decided
    award = decide(announcement, [make_bid("a", task_id="t-42", attempt=2)], [], WeightedScore(),
                   closed_by="deadline", candidates=1)
    # then the award names that task and attempt and what closed it
    assert (award.task_id, award.attempt, award.closed_by) == ("t-42", 2, "deadline")


# --- refresh_loads -------------------------------------------------------------------------


def test_refresh_loads_counts_work_awarded_since_the_bid():
    # given a bid made while its node was idle (0 of 4 busy), and 2 tasks awarded since
    bid = make_bid("a", in_flight=0, capacity=4, load=1.0)
    # when loads are refreshed
    (fresh,) = refresh_loads([bid], {"a": 2})
    # then the bid sees 2 in flight and load 1 - 2/4
    assert fresh.in_flight == 2
    assert fresh.load == 0.5
    # and the original bid is untouched
    assert (bid.in_flight, bid.load) == (0, 1.0)


def test_refresh_loads_keeps_a_bid_that_already_knew_more():
    # given a bid that reported 3 in flight; the store now counts only 1
    bid = make_bid("a", in_flight=3, capacity=4, load=0.25)
    # when loads are refreshed
    (fresh,) = refresh_loads([bid], {"a": 1})
    # then the bid is unchanged
    assert fresh == bid


def test_refresh_loads_never_raises_the_bids_own_load():
    # given a bid with in_flight 1 but a load of 0.2 (e.g. the node throttled itself)
    bid = make_bid("a", in_flight=1, capacity=4, load=0.2)
    # when 2 tasks are now counted (fresh load 0.5)
    (fresh,) = refresh_loads([bid], {"a": 2})
    # then the lower of the two loads is kept, and in_flight is brought up to date
    assert fresh.load == 0.2
    assert fresh.in_flight == 2


def test_refresh_loads_leaves_uncounted_nodes_and_keeps_order():
    # given bids of three nodes, only b is busy now
    bids = [make_bid("a"), make_bid("b", capacity=2), make_bid("c")]
    # when loads are refreshed
    fresh = refresh_loads(bids, {"b": 1})
    # then a and c are unchanged, b is half busy, and the order is kept
    assert [b.node for b in fresh] == ["a", "b", "c"]
    assert fresh[0] == bids[0]
    assert fresh[2] == bids[2]
    assert (fresh[1].in_flight, fresh[1].load) == (1, 0.5)


# --- fallback_node -------------------------------------------------------------------------


def test_fallback_picks_the_least_loaded_live_node():
    # given three live nodes: a 3/4 busy, b 1/4 busy, c 2/2 busy
    nodes = [live("a", 4), live("b", 4), live("c", 2)]
    # when the fallback chooses
    chosen = fallback_node(nodes, {"a": 3, "b": 1, "c": 2}, random.Random(0))
    # then b, the least loaded, is chosen
    assert chosen == "b"


def test_fallback_counts_missing_nodes_as_idle():
    # given a busy node and a node absent from the counts
    nodes = [live("a"), live("b")]
    # then the absent (idle) one is chosen
    assert fallback_node(nodes, {"a": 1}, random.Random(0)) == "b"


def test_fallback_breaks_ties_at_random_among_the_least_loaded():
    # given a and c equally idle and b busy
    nodes = [live("a"), live("b"), live("c")]
    counts = {"b": 2}
    # when the fallback chooses with many seeds
    chosen = {fallback_node(nodes, counts, random.Random(seed)) for seed in range(50)}
    # then both idle nodes are sometimes chosen, and the busy one never
    assert chosen == {"a", "c"}
    # and a given seed always makes the same choice
    assert fallback_node(nodes, counts, random.Random(7)) == fallback_node(
        nodes, counts, random.Random(7)
    )


def test_fallback_without_live_nodes_is_none():
    # given no live node
    # then there is no fallback
    assert fallback_node([], {}, random.Random(0)) is None
    assert fallback_node([], {"a": 1}) is None


# --- in-flight reservation through the pure pieces ----------------------------------------


def simulate_awards(strategy: Any, n_awards: int, refresh: bool = True) -> Counter[str]:
    # three equal bids, all made while their 2-process nodes were idle (as concurrent
    # auctions' bids are), awarded one after another; each award reserves its node
    announcement = make_rfp(required_skills=["x"])
    bids = [make_bid(n, confidence=0.8, in_flight=0, capacity=2, load=1.0) for n in "abc"]
    counts: dict[str, int] = {}
    for _ in range(n_awards):
        seen = refresh_loads(bids, counts) if refresh else bids
        award = decide(announcement, seen, [], strategy, closed_by="all bids in", candidates=3)
        assert award.winner is not None
        counts[award.winner] = counts.get(award.winner, 0) + 1
    return Counter(counts)


@pytest.mark.parametrize("seed", range(20))
def test_six_awards_over_three_equal_bids_spread_two_per_node(seed):
    # given the default strategy (WeightedScore, which ignores load) with a seeded tie-break
    strategy = WeightedScore(rng=random.Random(seed))
    # when six auctions over three equal bids are awarded in turn, counts refreshed each time
    spread = simulate_awards(strategy, 6)
    # then every node gets exactly two (the tie goes to the least busy node)
    assert spread == Counter({"a": 2, "b": 2, "c": 2})


def test_default_strategy_by_name_spreads_too():
    # given the default strategy as resolved from settings ("weighted", unseeded rng)
    # when six awards are simulated, several times
    # then the spread is always 2/2/2, whatever the random tie-break draws
    for _ in range(10):
        spread = simulate_awards(resolve_strategy("weighted"), 6)
        assert spread == Counter({"a": 2, "b": 2, "c": 2})


def test_without_refreshed_counts_equal_bids_pile_up():
    # given the same simulation but with the bids' stale (idle) in-flight counts
    # when six awards are made for each of 20 seeds
    spreads = [simulate_awards(WeightedScore(rng=random.Random(s)), 6, refresh=False)
               for s in range(20)]
    # then the tie is pure chance and some seed does not spread 2/2/2 (the refresh matters)
    assert any(s != Counter({"a": 2, "b": 2, "c": 2}) for s in spreads)
