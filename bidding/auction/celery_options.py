"""Celery's own call options on a bidding task: which are honoured, and which are refused.

- ``priority`` is the task's priority (the same as ``bidding={"priority": ...}``: 0-9 or a
  name, higher is more urgent); so is the task's own ``@app.task(priority=...)`` default.
- ``queue``, ``routing_key`` and ``exchange`` would steer the task to a queue, and the auction
  decides where it runs: a caller passing them is refused, and told how to steer instead.
  Routes Celery's router would add from ``task_routes`` are not the caller's: the auction
  overrides them (``routed_tasks`` finds them, so that ``bidding.install`` can say so once).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping
from typing import Any

from bidding.errors import ConfigurationError
from bidding.models import parse_priority

#: Options that pick a queue: the auction picks the node, hence its queue.
STEERING_OPTIONS = ("queue", "routing_key", "exchange")


def refuse_steering(task_name: str, options: Mapping[str, Any]) -> None:
    """Refuse ``queue``, ``routing_key`` or ``exchange`` passed on a call of a bidding task,
    naming the option and how to steer the auction instead."""
    given = [key for key in STEERING_OPTIONS if options.get(key) is not None]
    if given:
        raise ConfigurationError(
            f"{task_name}.apply_async: {', '.join(given)} cannot be set on a bidding task: the "
            "auction decides which node (and so which queue) runs it; steer it with "
            'bidding={"required_skills": [...]} (only nodes with those skills bid) or '
            'bidding={"preferred_node": "NAME"} (that node\'s bid counts for more)')


def merge_priority(
    task_name: str,
    merged: MutableMapping[str, Any],
    call: Mapping[str, Any],
    celery_priority: Any,
    task_priority: Any,
) -> None:
    """Put the call's priority into ``merged`` (the task's ``bidding`` defaults updated by the
    call's ``bidding={...}``): Celery's ``apply_async(priority=...)`` counts as the call's own
    (the two must agree when both are given), and the task's ``@app.task(priority=...)`` as a
    default below the task's ``bidding={"priority": ...}``."""
    if celery_priority is not None:
        given = parse_priority(celery_priority, f"{task_name}.apply_async(priority=...)")
        if call.get("priority") is not None:
            bidding = parse_priority(call["priority"], "bidding priority")
            if bidding != given:
                raise ConfigurationError(
                    f"{task_name}.apply_async: priority={celery_priority!r} and "
                    f"bidding={{'priority': {call['priority']!r}}} disagree; give one")
        merged["priority"] = given
    elif merged.get("priority") is None and task_priority is not None:
        merged["priority"] = parse_priority(task_priority, f"{task_name} priority (its default)")


def routed_tasks(router: Any, task_names: Iterable[str], default_queue: str) -> dict[str, str]:
    """The bidding tasks among ``task_names`` that Celery's ``router`` (``app.amqp.router``,
    from ``task_routes``) would send to a queue of their own, and that queue's name."""
    found: dict[str, str] = {}
    for name in task_names:
        try:
            route = router.route({}, name, (), {})
        except Exception:  # a router that needs real arguments: it cannot be judged here
            continue
        queue = route.get("queue")
        queue_name = getattr(queue, "name", queue)
        if queue_name and queue_name != default_queue:
            found[name] = str(queue_name)
    return found
