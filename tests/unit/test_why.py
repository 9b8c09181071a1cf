"""Unit tests of bidding.observe.why: the sentences that say why an auction's winner won."""

from __future__ import annotations

from typing import Any

from bidding.observe.explain import BidView
from bidding.observe.why import why_won


def bid(node: str, score: float | None, *, terms: dict[str, float] | None = None,
        multipliers: dict[str, float] | None = None, winner: bool = False,
        **fields: Any) -> BidView:
    breakdown: dict[str, Any] = {}
    if score is not None:
        breakdown = {"node": node, "total": score, "terms": terms or {"confidence": score},
                     "multipliers": multipliers or {}, "eligible": True, "reason": ""}
    breakdown.update(fields.pop("breakdown", {}))
    return BidView(node=node, attempt=1, will_bid=fields.pop("will_bid", True), score=score,
                   breakdown=breakdown, is_winner=winner, answered_after_ms=5.0, **fields)


def test_the_winner_is_named_with_its_margin_and_the_terms_that_made_it() -> None:
    # given bluefin scored 1.0 and sasass 0.8, on confidence alone
    bids = [bid("bluefin", 1.0, terms={"confidence": 0.6, "skill_match": 0.4}, winner=True),
            bid("sasass", 0.8, terms={"confidence": 0.4, "skill_match": 0.4})]
    # when the award is explained
    why = why_won(bids, winner="bluefin", outcome="awarded")
    # then the first sentence names the winner, its score, the runner-up and the difference
    assert why == ["bluefin won with 1.000, 0.200 ahead of sasass (0.800); the difference: "
                   "confidence +0.200"]


def test_a_multiplier_that_decided_is_named() -> None:
    # given equal terms, but the runner-up's score shrunk by its full slots
    bids = [bid("redfin", 0.9, terms={"capability": 0.9}, winner=True),
            bid("greenfin", 0.45, terms={"capability": 0.9}, multipliers={"slot_share": 0.5})]
    # then the multiplier is the difference
    (line,) = why_won(bids, winner="redfin", outcome="awarded")
    assert line.endswith("the difference: slot_share x1 against x0.5"), line


def test_a_tie_says_how_it_was_broken() -> None:
    bids = [bid("redfin", 1.0, winner=True), bid("greenfin", 1.0)]
    (line,) = why_won(bids, winner="redfin", outcome="awarded")
    assert line == ("redfin won a tie with greenfin at 1.000: equal scores go to the least busy "
                    "node, then to chance")


def test_every_node_that_did_not_compete_is_accounted_for() -> None:
    # given one eligible bid, one below min_confidence, a refusal, a late answer, and a
    # candidate that never answered
    bids = [bid("tpm", 0.7, winner=True),
            bid("north", 0.9, breakdown={"eligible": False,
                                         "reason": "confidence 0.40 below min_confidence 0.5"}),
            bid("east", None, will_bid=False, reason="no required skill"),
            bid("west", 0.99, late=True)]
    # when the award is explained
    why = why_won(bids, winner="tpm", outcome="awarded",
                  candidates=["tpm", "north", "east", "west", "south"])
    # then the winner was the only eligible bid, and each other node says why it lost
    assert why == [
        "tpm won with 0.700: the only eligible bid",
        "east refused: no required skill",
        "north was not eligible: confidence 0.40 below min_confidence 0.5",
        "west answered after the auction closed, too late to count",
        "south did not answer within the bidding window",
    ]


def test_no_award_gives_the_reason_and_an_open_auction_says_so() -> None:
    refusal = bid("east", None, will_bid=False, reason="deadline passed")
    assert why_won([refusal], winner=None, error="No bids received: every answering node "
                   "refused") == ["no award: No bids received: every answering node refused",
                                  "east refused: deadline passed"]
    assert why_won([], winner=None, candidates=["east"], state="BIDDING") == [
        "no winner yet: the auction is open", "east has not answered yet"]
    assert why_won([], winner=None, state="RETRYING", error="ConnectionError: timed out") == [
        "no auction yet: the task is RETRYING, waiting to be announced"]


def test_a_fallback_and_a_move_to_the_next_best_bidder_are_explained() -> None:
    (fallback,) = why_won([], winner="bluefin", outcome="fallback")
    assert fallback.startswith("bluefin runs it as the fallback: no bid was eligible")
    moved = why_won([bid("north", 0.9), bid("south", 0.8, winner=True)], winner="south",
                    outcome="awarded", moved_from=("north", "node north stopped heartbeating"))
    assert moved == ["south holds it as the next-best bidder: it was moved from north "
                     "(node north stopped heartbeating)"]


def test_a_node_left_out_of_a_retry_is_named_with_why() -> None:
    # given a retry's auction that south won alone, north being left out after failing
    bids = [bid("south", 0.9, winner=True)]
    # when the award is explained with the announcement's exclusions
    why = why_won(bids, winner="south", outcome="awarded", candidates=["south"],
                  state="SUCCESS", excluded={"north": "it failed attempt #1: boom"})
    # then the node that was not asked is named, with the reason
    assert why == ["south won with 0.900: the only eligible bid",
                   "north was not asked: it failed attempt #1: boom"]
