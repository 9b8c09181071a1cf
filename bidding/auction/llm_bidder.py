"""Seed 001's bidder agent: a pydantic-ai agent that answers a node's bid requests
(``bidder = "llm"`` with a ``[bidder_llm]`` table; ``pip install 'celery-bidding[llm]'``).

```toml
bidder = "llm"
bidder_timeout_s = 5

[bidder_llm]
model = "openai:gpt-4o"          # or the dotted path of a model object: "pkg.mod:model"
description = "Quick, concise summaries"   # default: the profile's description
# prompt = "..."                 # replaces seed 001's system prompt
```

The agent's output type is ``BidResponse``; the prompt is seed 001's ("RFP: ... / Skills
needed: ...") with the rest of what the bid request shows (arguments, budget, deadline) and
the node's built-in estimate. Tokens and cost, when the model reports them, are returned as
``usage`` and recorded with the answer.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from bidding import clock
from bidding.errors import ProfileError
from bidding.models import Announcement, Bid, BidResponse
from bidding.nodes.profile import NodeProfile
from bidding.strategies.resolver import IMPORT_ERRORS, import_path

#: Seed 001's instructions, after "You are {name}, specializing in: {skills}. {description}".
BIDDER_INSTRUCTIONS = (
    "When presented with a task RFP, evaluate if you can help. "
    "Set will_bid=True only if your skills match. "
    "Be honest about your confidence level."
)


def system_prompt(profile: NodeProfile) -> str:
    """Seed 001's ``create_bidder_agent`` prompt for ``profile``'s node (or the profile's own
    ``bidder_llm.prompt``)."""
    llm = profile.bidder_llm
    if llm is not None and llm.prompt:
        return llm.prompt
    description = (llm.description if llm is not None else "") or profile.description
    return (f"You are {profile.name}, specializing in: {', '.join(profile.capabilities)}.\n\n"
            f"{description}\n\n{BIDDER_INSTRUCTIONS}")


def announcement_prompt(announcement: Announcement, draft: Bid, now: float | None = None) -> str:
    """Seed 001's RFP message, with the arguments, budget, deadline and the node's built-in
    estimate (what its bid would be without the agent)."""
    now = clock.now() if now is None else now
    lines = [
        f"RFP: {announcement.content or announcement.task_name}",
        f"Skills needed: {announcement.required_skills}",
        f"Task: {announcement.task_name} (type {announcement.task_type}), "
        f"{announcement.units:g} unit(s) of work",
    ]
    if announcement.args or announcement.kwargs:
        lines.append(
            f"Arguments: {json.dumps(announcement.args, default=str)} "
            f"{json.dumps(announcement.kwargs, default=str)}"
        )
    if announcement.truncated:
        cut = ", ".join(f"{k} ({n} characters)" for k, n in announcement.truncated.items())
        lines.append(f"Shortened for this request: {cut}")
    if announcement.budget is not None:
        lines.append(f"Budget: {announcement.budget:g} (spent so far: {announcement.spent:g})")
    if announcement.start_by is not None:
        lines.append(f"Deadline: in {max(0.0, announcement.start_by - now):.0f} s")
    lines.append(
        f"Your record suggests confidence {draft.confidence:.2f}; your cost would be "
        f"{draft.cost:.4f}; {draft.in_flight}/{draft.capacity} of your slots are busy."
    )
    return "\n".join(lines)


def resolve_model(spec: str, source: str = "<profile>") -> Any:
    """The model ``bidder_llm.model`` names: the object at a dotted path ("pkg.mod:model";
    a class or a function there is called for it), else a pydantic-ai model name as is."""
    if ":" not in spec:
        return spec
    try:
        obj = import_path(spec)
    except IMPORT_ERRORS:
        return spec  # "openai:gpt-4o": a provider and a model name
    from pydantic_ai.models import Model

    if not isinstance(obj, Model) and callable(obj):
        try:
            obj = obj()
        except Exception as exc:
            raise ProfileError(
                f"{source}: bidder_llm.model: {spec!r} could not be called "
                f"without arguments ({type(exc).__name__}: {exc})"
            ) from None
    return obj


def usage_of(result: Any) -> dict[str, float]:
    """Tokens, requests and (when the provider's prices are known) cost of an agent run."""
    usage = result.usage
    if not hasattr(usage, "requests") and callable(usage):
        usage = usage()  # a method before pydantic-ai 2
    out: dict[str, float] = {}
    for name in ("input_tokens", "output_tokens", "requests"):
        value = getattr(usage, name, None)
        if isinstance(value, int | float) and value:
            out[name] = float(value)
    try:
        price = result.response.cost()
        out["cost"] = float(price.total_price)
    except Exception:  # no price for this provider or model (a test model, say)
        pass
    return out


def llm_bidder(
    profile: NodeProfile, source: str = "<profile>"
) -> Callable[[Announcement, Bid], dict[str, Any]]:
    """Seed 001's ``create_bidder_agent`` for ``profile``'s node, as a bidder function."""
    llm = profile.bidder_llm
    if llm is None:
        raise ProfileError(f'{source}: bidder_llm: bidder = "llm" needs this table')
    try:
        from pydantic_ai import Agent
    except ImportError:  # pragma: no cover - depends on the optional extra
        raise ProfileError(
            f"{source}: bidder: \"llm\" needs pydantic-ai: pip install 'celery-bidding[llm]'"
        ) from None
    model = resolve_model(llm.model, source)
    try:
        agent = Agent(model, system_prompt=system_prompt(profile), output_type=BidResponse)
    except Exception as exc:  # an unknown model name, a provider without its package or key
        raise ProfileError(
            f"{source}: bidder_llm.model: {llm.model!r}: {type(exc).__name__}: {exc}"
        ) from None
    timeout = profile.bidder_timeout_s

    def bid(announcement: Announcement, draft: Bid) -> dict[str, Any]:
        # The HTTP request's own timeout; the node also stops waiting after bidder_timeout_s.
        result = agent.run_sync(
            announcement_prompt(announcement, draft), model_settings={"timeout": timeout}
        )
        output: BidResponse = result.output
        return {**output.model_dump(), "usage": usage_of(result)}

    return bid
