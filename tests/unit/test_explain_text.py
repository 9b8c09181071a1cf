"""``bidding explain``'s text report: how a bid's score breakdown reads."""

from __future__ import annotations

from bidding.observe.explain import BidView, Explanation


def test_a_term_that_takes_from_the_score_reads_as_a_subtraction() -> None:
    # given an auction whose winner was free and whose runner-up had most of its slots busy
    # (the default strategy shows what the busy slots take as a negative slot_share term)
    bids = [
        BidView(node="sasass", attempt=1, will_bid=True, score=1.0, is_winner=True,
                answered_after_ms=3.0,
                breakdown={"terms": {"confidence": 0.6, "skill_match": 0.4}}),
        BidView(node="bluefin", attempt=1, will_bid=True, score=0.886, answered_after_ms=4.0,
                breakdown={"terms": {"confidence": 0.6, "skill_match": 0.4,
                                     "slot_share": -0.114}}),
    ]
    explanation = Explanation(
        task_id="t1", task_name="work", task_type="summarize", state="SUCCESS",
        strategy="weighted", required_skills=["nlp"], preferred_node=None,
        candidates=["sasass", "bluefin"], winner="sasass", winning_score=1.0,
        outcome="awarded", closed_by="all bids in", error=None, announced_at=0.0,
        awarded_at=0.01, assignment_ms=10.0, bids=bids, messages=[])
    # when the report is rendered
    text = explanation.render()
    # then each bid's terms add up as written, the negative one as "- slot_share 0.114"
    assert "confidence 0.600 + skill_match 0.400 - slot_share 0.114" in text
    assert "+ slot_share" not in text
