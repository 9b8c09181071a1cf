"""The demo's node bidder: greenfin judges each task itself (its profile names
``bidder = "bidding.demo.bidders:short_documents_only"``).

greenfin is a monitoring host that also writes short summaries. It takes documents of up to
``MAX_WORDS`` words, saying how it would handle them, and refuses longer ones with its reason;
other work (a monitoring probe) it bids on as the built-in bidder drafted.
"""

from __future__ import annotations

from bidding import Announcement, Bid, BidResponse

#: The longest document (in words) greenfin takes on.
MAX_WORDS = 10


def short_documents_only(announcement: Announcement, draft: Bid) -> BidResponse | None:
    """Refuse documents over ``MAX_WORDS`` words; say how a short one would be handled."""
    if announcement.task_type not in ("nlp_analysis", "summarize"):
        return None  # the built-in bid stands
    text = " ".join(a for a in announcement.args if isinstance(a, str))
    words = len(text.split())
    if words > MAX_WORDS:
        return BidResponse(
            will_bid=False, confidence=0.0, proposal="",
            reasoning=(f"greenfin summarises notes of up to {MAX_WORDS} words; this one has "
                       f"{words}: a node with more memory will do it better"))
    return BidResponse(
        will_bid=True, confidence=draft.confidence,
        proposal=f"read all {words} words in one pass, answer in a sentence",
        reasoning=f"a {words}-word note is well within what greenfin handles")
