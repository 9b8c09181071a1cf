"""Announcing a task: build and validate the announcement, pick candidates, ask them to bid.

Candidates are chosen as the Kubernetes scheduler does: filter (live, at least one required
skill), then score and cap. Above ``candidate_cap`` eligible nodes we keep the best half by a
prior score (skill match and declared trust) and draw the rest at random, so good nodes are
always asked and new or unlucky ones still get a chance to earn a history.
"""

from __future__ import annotations

import json
import math
import random
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from celery import Celery
from celery.result import AsyncResult
from pydantic import ValidationError

from bidding import journal, lifecycle, scoring
from bidding.award import close_auction
from bidding.config import Settings
from bidding.consumer import request_body, request_queue
from bidding.errors import ConfigurationError
from bidding.models import OPTION_KEYS, Announcement, describe_validation
from bidding.registry import LiveNode, live_nodes
from bidding.store import ensure_schema, write_session
from bidding.store.schema import Announcement as AnnouncementRow
from bidding.strategies import resolve_strategy, strategy_name

if TYPE_CHECKING:
    from celery import Task


def check_options(options: Mapping[str, Any], where: str) -> None:
    """Refuse unknown ``bidding={...}`` keys, naming them and listing the valid ones."""
    unknown = sorted(set(options) - set(OPTION_KEYS))
    if unknown:
        raise ConfigurationError(
            f"{where}: unknown option(s) {', '.join(unknown)}; "
            f"valid options: {', '.join(OPTION_KEYS)}"
        )


def _strategy_spec(value: Any) -> str:
    """A strategy as a string that a worker can resolve (names and importable classes)."""
    if isinstance(value, str):
        resolve_strategy(value)  # fail here, at the boundary, not later on a worker
        return value
    name = strategy_name(resolve_strategy(value))
    try:
        resolve_strategy(name)
    except ConfigurationError:
        raise ConfigurationError(
            f"strategy: {value!r} cannot be rebuilt on a worker; register it with "
            "bidding.register_strategy(name, factory) in your app module and pass the name"
        ) from None
    return name


def _skill_list(skills: Any) -> list[Any]:
    """A single skill name counts as one skill, not as its letters."""
    return [skills] if isinstance(skills, str) else list(skills)


def build_announcement(
    task: Task,
    settings: Settings,
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    options: Mapping[str, Any],
    task_id: str | None = None,
) -> Announcement:
    """Merge task-level defaults, call options and settings into a validated announcement."""
    check_options(options, "bidding")
    args = list(args or ())
    kwargs = dict(kwargs or {})
    try:
        payload = json.dumps([args, kwargs])
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"args/kwargs of {task.name}: not JSON serializable ({exc}); "
            "celery-bidding sends JSON only"
        ) from None
    merged: dict[str, Any] = {
        "task_type": getattr(task, "task_type", None) or task.name.rsplit(".", 1)[-1],
        "required_skills": _skill_list(getattr(task, "required_skills", None) or ()),
        "strategy": settings.strategy,
        "no_bid": settings.no_bid,
        "window": settings.window,
        "min_confidence": settings.min_confidence,
        "min_trust": settings.min_trust,
        "candidate_cap": settings.candidate_cap,
        "content": payload,
    }
    merged.update({k: v for k, v in options.items() if v is not None})
    merged["strategy"] = _strategy_spec(merged["strategy"])
    merged["required_skills"] = _skill_list(merged.get("required_skills") or ())
    try:
        return Announcement(
            task_id=task_id or str(uuid.uuid4()),
            task_name=task.name,
            args=args,
            kwargs=kwargs,
            **merged,
        )
    except ValidationError as exc:
        raise ConfigurationError(
            f"bidding options of {task.name}: {describe_validation(exc)}"
        ) from None


def prior_score(rfp: Announcement, node: LiveNode) -> float:
    """What the producer can tell about a node before it bids: skill match and declared trust."""
    match = scoring.capability_score(rfp.required_skills, node.capabilities)
    return 0.7 * match + 0.3 * node.trust / 100.0


def select_candidates(
    rfp: Announcement, live: Sequence[LiveNode], rng: random.Random | None = None
) -> list[str]:
    """Live nodes that could bid (filter), capped at ``rfp.candidate_cap`` (best half + random)."""
    required = set(rfp.required_skills)
    eligible = [n for n in live if not required or required & set(n.capabilities)]
    cap = rfp.candidate_cap
    if cap == 0 or len(eligible) <= cap:
        return [n.name for n in eligible]
    rng = rng or random.Random()
    ranked = sorted(eligible, key=lambda n: (-prior_score(rfp, n), rng.random()))
    keep = math.ceil(cap / 2)
    chosen = ranked[:keep] + rng.sample(ranked[keep:], cap - keep)
    return [n.name for n in chosen]


def announce(
    app: Celery,
    settings: Settings,
    rfp: Announcement,
    *,
    link: Any = None,
    link_error: Any = None,
) -> AsyncResult:
    """Record ``rfp``, ask the candidates to bid, and return the execution's AsyncResult."""
    if link is not None or link_error is not None:
        raise ConfigurationError(
            "link/link_error: callbacks on a bidding task are not supported yet; "
            "chain on the AsyncResult instead"
        )
    if settings.auto_migrate:
        ensure_schema(settings.database_url)
    candidates = select_candidates(rfp, live_nodes(settings))
    with write_session(settings.database_url) as session:
        session.add(
            AnnouncementRow(
                task_id=rfp.task_id,
                task_name=rfp.task_name,
                task_type=rfp.task_type,
                content=rfp.content,
                required_skills=rfp.required_skills,
                preferred_node=rfp.preferred_node,
                priority=rfp.priority,
                deadline=rfp.deadline,
                budget=rfp.budget,
                strategy=rfp.strategy,
                spec=rfp.model_dump(mode="json"),
                state=lifecycle.BIDDING,
                attempt=rfp.attempt,
                candidates=candidates,
                expected_bids=len(candidates),
                announced_at=rfp.announced_at,
                closes_at=rfp.announced_at + rfp.window,
            )
        )
        journal.record(session, rfp.task_id, journal.ANNOUNCED, attempt=rfp.attempt,
                       at=rfp.announced_at, task_type=rfp.task_type, candidates=candidates,
                       required_skills=rfp.required_skills)
    if not candidates:
        close_auction(settings, app, rfp.task_id, rfp.attempt, closed_by="no candidates")
    else:
        request_bids(app, rfp, candidates)
    return AsyncResult(rfp.task_id, app=app)


def request_bids(app: Celery, rfp: Announcement, candidates: Sequence[str]) -> None:
    """Publish one bid request per candidate, pipelined in one batch where the broker allows.

    No closer message is sent: node workers sweep the store for auctions past their window.
    """
    # A request still queued after the window is worthless: the node drops it unread.
    expires_at = rfp.announced_at + rfp.window
    with app.producer_or_acquire() as producer, producer.batch():
        for node in candidates:
            queue = request_queue(node)
            producer.publish(request_body(rfp, node, expires_at), exchange="",
                             routing_key=queue.routing_key, declare=[queue], serializer="json",
                             retry=True)
