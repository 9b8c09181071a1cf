"""An answer (a bid or a refusal) as the board and the store keep it: its JSON, its bid row and
its BID or REFUSED message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session

from bidding.auction.board.protocol import Answer
from bidding.lifecycle import journal
from bidding.models import Bid, Refusal
from bidding.store.schema import BidRow


def parse_answer(data: dict[str, Any]) -> Answer:
    """A bid or refusal from its JSON form (a refusal has a ``reason`` and no scores)."""
    if "capability" in data:
        return Bid.model_validate(data)
    return Refusal.model_validate(data)


def answer_message(answer: Answer, *, late: bool) -> dict[str, Any]:
    """The BID or REFUSED message of an answer (``journal.write`` form)."""
    detail: dict[str, Any] = {"late": late}
    if isinstance(answer, Refusal):
        detail["reason"] = answer.reason
    return journal.message(answer.task_id,
                           journal.BID if isinstance(answer, Bid) else journal.REFUSED,
                           node=answer.node, attempt=answer.attempt, at=answer.bid_at, **detail)


def write_answer(session: Session, answer: Answer, *, late: bool) -> None:
    """Store one answer as it came: its bid row and its message (unscored). A late one is kept
    for ``explain``; it cannot win."""
    session.add(bid_row(answer, late=late))
    journal.write(session, [answer_message(answer, late=late)])


def bid_values(answer: Answer, *, late: bool = False) -> dict[str, Any]:
    """The bids-table columns of a bid or refusal (every column, so rows batch together)."""
    values: dict[str, Any] = {
        "task_id": answer.task_id, "attempt": answer.attempt, "node": answer.node,
        "will_bid": isinstance(answer, Bid), "reason": "", "capability": None,
        "experience": None, "load": None, "confidence": None, "cost": None,
        "latency_ms": None, "trust": None, "payload": answer.model_dump(mode="json"),
        "score": None, "breakdown": {}, "is_winner": False, "late": late,
        "bid_at": answer.bid_at, "estimated_cost": None, "estimated_duration_s": None,
    }
    if isinstance(answer, Refusal):
        values["reason"] = answer.reason
    else:
        values.update(capability=answer.capability, experience=answer.experience,
                      load=answer.load, confidence=answer.confidence, cost=answer.cost,
                      latency_ms=answer.latency_ms, trust=answer.trust,
                      estimated_cost=answer.estimated_cost,
                      estimated_duration_s=answer.estimated_duration_s)
    return values


def bid_row(answer: Answer, *, late: bool = False) -> BidRow:
    """The store row (ORM object) of a bid or refusal."""
    return BidRow(**bid_values(answer, late=late))


def sorted_answers(answers: Sequence[Answer]) -> tuple[list[Bid], list[Refusal]]:
    """Split answers into bids and refusals."""
    bids = [a for a in answers if isinstance(a, Bid)]
    refusals = [a for a in answers if isinstance(a, Refusal)]
    return bids, refusals
