"""The bidder of the integration tests' node east (tests/integration/test_bidders.py), imported
by its worker from its profile: ``bidder = "tests.integration.bidders:choosy"``."""

from __future__ import annotations

import time

from bidding import Announcement, Bid, BidResponse

#: The kind of task east refuses, and why.
REFUSED_TYPE = "legal_review"
REFUSAL = "east does no legal reviews: it has nobody to sign them off"
#: Seconds east's bidder takes on a task whose value is "sleep" (past its bidder_timeout_s).
SLEEP = 3.0


def choosy(announcement: Announcement, draft: Bid) -> BidResponse:
    """Refuses legal reviews; takes ``SLEEP`` s over a task whose value is "sleep"; bids on
    the rest with its own confidence and approach."""
    if announcement.task_type == REFUSED_TYPE:
        return BidResponse(will_bid=False, confidence=0.0, proposal="", reasoning=REFUSAL)
    if announcement.args[:1] == ["sleep"]:
        time.sleep(SLEEP)
    if announcement.truncated:
        # A document too long for the bid request: east says what it was shown.
        shown = len(announcement.args[0]) if announcement.args else 0
        return BidResponse(
            will_bid=True,
            confidence=0.95,
            proposal=f"east read {shown} characters of {announcement.truncated['args']}",
            reasoning="a long document, shortened for the bid request",
        )
    return BidResponse(
        will_bid=True,
        confidence=0.95,
        proposal=f"east runs {announcement.task_type} {announcement.args[:1]} on its GPU",
        reasoning="idle GPU, and the task is small",
    )


#: What thrifty's and lavish's bidders claim (tests/integration/test_figures.py): thrifty is
#: modest and within the documented strategy's token budget (500); lavish claims near
#: certainty, a tenth of the real cost, and a hundredth of the time, and wants many tokens.
THRIFTY = {"confidence": 0.7, "estimated_cost": 0.02, "estimated_duration_s": 0.5,
           "metadata": {"estimated_tokens": 300, "model": "small"}}
LAVISH = {"confidence": 0.99, "estimated_cost": 0.001, "estimated_duration_s": 0.003,
          "metadata": {"estimated_tokens": 5000, "model": "large"}}


def thrifty(announcement: Announcement, draft: Bid) -> BidResponse:
    """Bids with ``THRIFTY``'s figures (a ``BidResponse``)."""
    return BidResponse(will_bid=True, proposal="a small model, one pass",
                       reasoning="cheap and good enough", **THRIFTY)  # type: ignore[arg-type]


def lavish(announcement: Announcement, draft: Bid) -> dict[str, object]:
    """Bids with ``LAVISH``'s figures (a dict of ``BidResponse``'s fields)."""
    return {"will_bid": True, "proposal": "the largest model, many passes",
            "reasoning": "nothing can go wrong", **LAVISH}
