"""Unit tests of the demo's node bidder (greenfin's ``short_documents_only``): it judges a
document by its words, whether the task got it as a positional or a keyword argument."""

from __future__ import annotations

from bidding import BidResponse
from bidding.auction.request_view import bidder_view
from bidding.demo.bidders import MAX_WORDS, short_documents_only
from tests.unit.test_bid import bid_of, make_rfp

#: ``bidding_bid_request_limit``'s default is larger; any limit below the document will do.
LIMIT = 4096


def judge(**fields: object) -> BidResponse:
    rfp = make_rfp(task_type="nlp_analysis", required_skills=["gpu"], **fields)
    answer = short_documents_only(rfp, bid_of(rfp))
    assert isinstance(answer, BidResponse), answer
    return answer


def test_a_long_document_passed_as_a_keyword_argument_is_refused() -> None:
    # given an analysis called with its text as a keyword (as the HTTP API and graphs call it)
    text = "word " * 40
    # when greenfin's bidder judges it
    answer = judge(kwargs={"text": text})
    # then it counts the keyword's words and refuses, as for the same text given positionally
    assert not answer.will_bid
    assert "this one has 40:" in answer.reasoning
    assert judge(args=[text]).reasoning == answer.reasoning


def test_a_short_note_passed_as_a_keyword_argument_gets_a_bid() -> None:
    # given a note of a few words, as a keyword argument
    answer = judge(kwargs={"text": "quantum advances for executives", "max_words": 30})
    # then greenfin bids, and says how many words it read
    assert answer.will_bid and MAX_WORDS >= 4
    assert answer.proposal.startswith("read all 4 words")


def test_a_document_cut_to_fit_the_bid_request_is_refused_with_its_full_size() -> None:
    # given a document far over the bid request's limit, as a keyword argument: the bidder
    # sees it cut (a few hundred words), its full size in announcement.truncated
    rfp = make_rfp(task_type="summarize", required_skills=["gpu"],
                   kwargs={"requirement": "word " * 100_000})
    seen, whole = bidder_view(rfp, LIMIT)
    assert not whole and "kwargs" in seen.truncated
    # when greenfin's bidder judges what it sees
    answer = short_documents_only(seen, bid_of(seen))
    # then it refuses, giving the arguments' full size, not the words left after the cut
    assert isinstance(answer, BidResponse) and not answer.will_bid
    assert f"arguments are {seen.truncated['kwargs']} characters" in answer.reasoning
