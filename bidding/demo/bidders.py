"""The demo's node bidder: greenfin judges each task itself (its profile names
``bidder = "bidding.demo.bidders:short_documents_only"``).

greenfin is a monitoring host that also writes short summaries. It takes documents of up to
``MAX_WORDS`` words, saying how it would handle them, and refuses longer ones with its reason;
other work (a monitoring probe) it bids on as the built-in bidder drafted. It counts the words of
the task's text arguments, positional and keyword alike.
"""

from __future__ import annotations

from bidding import Announcement, Bid, BidResponse

#: The longest document (in words) greenfin takes on.
MAX_WORDS = 10


def document_words(announcement: Announcement) -> int:
    """Words in the task's text arguments, positional and keyword alike: a task called as
    ``analyze_text(text=...)`` (as the HTTP API and task graphs call it) has no positional
    argument at all."""
    texts = [*announcement.args, *announcement.kwargs.values()]
    return len(" ".join(a for a in texts if isinstance(a, str)).split())


def short_documents_only(announcement: Announcement, draft: Bid) -> BidResponse | None:
    """Refuse documents over ``MAX_WORDS`` words; say how a short one would be handled."""
    if announcement.task_type not in ("nlp_analysis", "summarize"):
        return None  # the built-in bid stands
    cut = {k: n for k, n in announcement.truncated.items() if k in ("args", "kwargs")}
    if cut:
        # The bid request carries the arguments cut to bidding_bid_request_limit characters:
        # what is left is not the document's length, and anything that long is too long.
        size = sum(cut.values())
        return BidResponse(
            will_bid=False, confidence=0.0, proposal="",
            reasoning=(f"greenfin summarises notes of up to {MAX_WORDS} words; this one's "
                       f"arguments are {size} characters, cut to fit the bid request: a node "
                       "with more memory will do it better"))
    words = document_words(announcement)
    if words > MAX_WORDS:
        return BidResponse(
            will_bid=False, confidence=0.0, proposal="",
            reasoning=(f"greenfin summarises notes of up to {MAX_WORDS} words; this one has "
                       f"{words}: a node with more memory will do it better"))
    return BidResponse(
        will_bid=True, confidence=draft.confidence,
        proposal=f"read all {words} words in one pass, answer in a sentence",
        reasoning=f"a {words}-word note is well within what greenfin handles")
