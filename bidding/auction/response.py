"""A node's own bidder's answer, checked and applied to the built-in draft bid (pure).

A bidder (``auction.bidder``) returns seed 001's ``BidResponse``, a dict with its fields, or
None. ``judged`` turns that into what the node answers the auction:

- None: the draft, unchanged (the bidder agrees with the built-in bid);
- ``will_bid=False``: a refusal whose reason is the bidder's ``reasoning``;
- ``will_bid=True``: the draft's sub-scores (capability, experience, load, cost, trust...)
  with the bidder's ``confidence``, ``proposal`` and ``reasoning``; its ``estimated_cost``
  and ``estimated_duration_s`` where it gives them (else the draft's); its ``metadata``
  merged over the draft's; the draft's own confidence is kept in
  ``metadata["draft_confidence"]``;
- anything else: a refusal saying what was wrong with it (the auction goes on).

A dict may carry ``usage`` besides seed 001's fields (tokens, requests, cost: numbers), which
is recorded with the answer; the LLM bidder reports its model's usage so.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from bidding.models import Bid, BidResponse, Refusal, describe_validation

#: Characters of a bidder's proposal and reasoning kept with the bid (an LLM may write pages).
TEXT_LIMIT = 2000
#: The key of a dict answer that reports usage; not one of seed 001's fields.
USAGE_KEY = "usage"


class InvalidResponse(ValueError):
    """A bidder's answer that is neither a ``BidResponse``, a dict of its fields, nor None."""


def parse_response(value: Any) -> tuple[BidResponse | None, dict[str, float]]:
    """The ``BidResponse`` in a bidder's answer (None: keep the draft) and the usage it
    reported; ``InvalidResponse`` says what is wrong with anything else."""
    if value is None:
        return None, {}
    if isinstance(value, BidResponse):
        return value, {}
    if not isinstance(value, Mapping):
        raise InvalidResponse(f"returned {type(value).__name__} {_short(value)}; expected a "
                              "BidResponse, a dict with its fields, or None")
    fields = dict(value)
    usage = _usage(fields.pop(USAGE_KEY, None))
    try:
        return BidResponse.model_validate(fields), usage
    except ValidationError as exc:
        raise InvalidResponse(f"returned an invalid BidResponse: {describe_validation(exc)}"
                              ) from None


def _usage(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
            for v in value.values()):
        # (NaN or infinity would not survive JSON: the board drops it, PostgreSQL refuses it.)
        raise InvalidResponse(f"returned usage {_short(value)}; expected a dict of finite numbers "
                              "(input_tokens, output_tokens, requests, cost...)")
    return {str(k): float(v) for k, v in value.items()}


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def judged(draft: Bid, value: Any, bidder: str, now: float) -> Bid | Refusal:
    """What the node answers at ``now`` when its bidder ``bidder`` returned ``value`` on
    ``draft``.

    Raises ``InvalidResponse`` for an answer that is none of the accepted forms; the caller
    turns it into a refusal (``failed_answer``) and logs it.
    """
    response, usage = parse_response(value)
    if response is None:
        return draft.model_copy(update={"bidder": bidder, "usage": usage, "bid_at": now})
    reasoning = response.reasoning[:TEXT_LIMIT]
    if not response.will_bid:
        return Refusal(task_id=draft.task_id, node=draft.node, attempt=draft.attempt,
                       reason=reasoning or f"its bidder {bidder} declined (no reasoning given)",
                       bid_at=now, bidder=bidder, usage=usage)
    return draft.model_copy(update={
        "confidence": response.confidence,
        "proposal": response.proposal[:TEXT_LIMIT],
        "reasoning": reasoning,
        "bidder": bidder,
        "usage": usage,
        "bid_at": now,
        "estimated_cost": (draft.estimated_cost if response.estimated_cost is None
                           else response.estimated_cost),
        "estimated_duration_s": (draft.estimated_duration_s
                                 if response.estimated_duration_s is None
                                 else response.estimated_duration_s),
        # The bidder's figures over the draft's; the draft's confidence is ours to record.
        "metadata": {**draft.metadata, **response.metadata,
                     "draft_confidence": draft.confidence},
    })


def failed_answer(draft: Bid, bidder: str, reason: str, now: float,
                  usage: dict[str, float] | None = None) -> Refusal:
    """The refusal of a node whose bidder raised, timed out or answered something invalid:
    ``reason`` says which. It is a refusal like any other (the node could not judge the task
    in time), not a failed bid: the auction goes on with the other answers."""
    return Refusal(task_id=draft.task_id, node=draft.node, attempt=draft.attempt,
                   reason=reason, bid_at=now, bidder=bidder, usage=usage or {})
