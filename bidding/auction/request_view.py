"""What a bid request carries to a node's bidder: the announcement without what is none of its
business, and its content, args and kwargs cut to a size limit (pure).

A bidder judges the task (seed 001: "will you bid on this RFP?"): it needs the task type, the
skills, the content, the args and kwargs, the budget, the deadline. It does not need, and is not
shown:

- Celery's canvas (``Announcement.canvas``): the callbacks, errbacks, chain and chord around
  the call are other tasks' signatures, with their own arguments (its ids, root, parent and
  group, are kept: they are no secret, and hiding them would make every task called from
  another task's body a partial request);
- ``exclude_nodes``: which other nodes failed the task or lost it;
- ``last_error``: the error another node's attempt ended with.

``bidding_bid_request_limit`` (characters) caps the content, and separately the args and kwargs
together as JSON: a longer content is cut; args and kwargs keep their shape, with strings cut
and the items past the limit left out. ``Announcement.truncated`` then gives each cut field's
full size, so a bidder can still judge by it (a document over some size, say).

When anything was left out or cut, the request is *partial*: the node that closes the auction
reads the full announcement from the store before it awards and sends the execution.
"""

from __future__ import annotations

import json
from typing import Any

from bidding.models import Announcement

#: Canvas fields that are other tasks' signatures: never shown to a bidder.
CANVAS_SIGNATURES: tuple[str, ...] = ("callbacks", "errbacks", "chain", "chord")
#: Announcement fields a bidder is never shown, and their empty values.
HIDDEN: dict[str, Any] = {"exclude_nodes": [], "last_error": None}


def _size(value: Any) -> int:
    """Characters of ``value`` as compact JSON."""
    return len(json.dumps(value, separators=(",", ":"), default=str))


def fit(value: Any, budget: int) -> tuple[Any, int] | None:
    """``value`` cut to at most ``budget`` characters of compact JSON, and its size; None when
    not even its empty form fits. Strings are cut at the end, lists and dicts lose their last
    items; numbers, booleans and null are kept whole or left out."""
    size = _size(value)
    if size <= budget:
        return value, size
    if isinstance(value, str):
        if budget < 2:
            return None
        cut = value[: budget - 2]
        # Escaped characters (quotes, newlines, non-ASCII) take more than one character.
        while _size(cut) > budget:
            cut = cut[: len(cut) - (_size(cut) - budget)]
        return cut, _size(cut)
    if isinstance(value, list | tuple):
        if budget < 2:
            return None
        items: list[Any] = []
        used = 2
        for item in value:
            comma = 1 if items else 0
            got = fit(item, budget - used - comma)
            if got is None:
                break
            items.append(got[0])
            used += got[1] + comma
        return items, used
    if isinstance(value, dict):
        if budget < 2:
            return None
        entries: dict[str, Any] = {}
        used = 2
        for key, item in value.items():
            head = _size(str(key)) + 1 + (1 if entries else 0)
            got = fit(item, budget - used - head)
            if got is None:
                break
            entries[str(key)] = got[0]
            used += head + got[1]
        return entries, used
    return None


def bidder_view(announcement: Announcement, limit: int) -> tuple[Announcement, bool]:
    """``announcement`` as a bid request shows it to a node's bidder, and whether that is all of it
    (False: fields were hidden or cut, and the awarder must read the announcement from the
    store)."""
    update: dict[str, Any] = {}
    canvas = announcement.canvas
    if any(getattr(canvas, name) is not None for name in CANVAS_SIGNATURES):
        update["canvas"] = canvas.model_copy(update=dict.fromkeys(CANVAS_SIGNATURES))
    for name, empty in HIDDEN.items():
        if getattr(announcement, name) != empty:
            update[name] = empty
    truncated: dict[str, int] = {}
    if len(announcement.content) > limit:
        truncated["content"] = len(announcement.content)
        update["content"] = announcement.content[:limit]
    args_size, kwargs_size = _size(announcement.args), _size(announcement.kwargs)
    if args_size + kwargs_size > limit:
        # The args first (a task's main input, usually), then the kwargs in what is left.
        args, used = fit(announcement.args, limit - 2) or ([], 2)
        kwargs, _ = fit(announcement.kwargs, limit - used) or ({}, 2)
        if args != announcement.args:
            truncated["args"] = args_size
            update["args"] = args
        if kwargs != announcement.kwargs:
            truncated["kwargs"] = kwargs_size
            update["kwargs"] = kwargs
    if truncated:
        update["truncated"] = truncated
    if not update:
        return announcement, True
    return announcement.model_copy(update=update), False
