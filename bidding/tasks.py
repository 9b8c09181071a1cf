"""The bidding machinery's Celery tasks. Thin: deserialize, call the modules, route.

``bidding.bid`` runs on a node (queue ``bids.<node>``) and never raises: any failure becomes a
refusal with the reason. ``bidding.close`` runs on the control queue at the deadline.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import Task
from pydantic import ValidationError

from bidding.award import close_auction, receive_bid
from bidding.bid import place_bid
from bidding.models import Announcement, Bid, Refusal
from bidding.node import current_profile
from bidding.settings import get_settings

logger = logging.getLogger(__name__)


def bid(self: Task, payload: dict[str, Any], node: str) -> None:
    """Answer one announcement with this node's bid or refusal, and record it."""
    settings = get_settings(self.app)
    try:
        rfp = Announcement.model_validate(payload)
    except ValidationError:
        logger.exception("malformed announcement for node %s dropped", node)
        return
    response: Bid | Refusal
    try:
        profile = current_profile(settings)
        if profile is None:
            response = Refusal(task_id=rfp.task_id, node=node, attempt=rfp.attempt,
                               reason="this worker has no node profile (bidding_profile)")
        elif profile.name != node:
            response = Refusal(task_id=rfp.task_id, node=node, attempt=rfp.attempt,
                               reason=f"profile mismatch: worker runs node {profile.name!r}")
        else:
            response = place_bid(settings, rfp, profile)
    except Exception as exc:  # a bid never raises: the auction must still close
        logger.exception("bid of %s on %s failed", node, rfp.task_id)
        response = Refusal(task_id=rfp.task_id, node=node, attempt=rfp.attempt,
                           reason=f"bid failed: {type(exc).__name__}: {exc}")
    try:
        receive_bid(settings, self.app, response)
    except Exception:
        # The deadline closer still closes the auction with the bids that were recorded.
        logger.exception("could not record the bid of %s on %s", node, rfp.task_id)


def close(self: Task, task_id: str, attempt: int) -> None:
    """Close the auction at its deadline with the bids that arrived (no-op if already closed)."""
    settings = get_settings(self.app)
    try:
        close_auction(settings, self.app, task_id, attempt, closed_by="deadline")
    except Exception as exc:
        logger.exception("closing auction %s failed; retrying", task_id)
        raise self.retry(exc=exc, countdown=1.0, max_retries=30) from exc
