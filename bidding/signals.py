"""Signals of celery-bidding, and the notification hook (AITP 6.2 FAIL_AND_NOTIFY).

```python
from bidding.signals import cost_exceeded

@cost_exceeded.connect
def page_someone(sender, task_id, budget, spent, node, **kwargs): ...
```
Receivers run in the process that detects the event (usually the node's worker), so connect
them in a module your workers import (e.g. the app module). ``bidding_notify_url`` also POSTs
every notification as JSON to a webhook.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from celery.utils.dispatch import Signal

from bidding.config import Settings

logger = logging.getLogger(__name__)

#: A task's spending went over its budget; it is failed. Args: task_id, budget, spent, node.
cost_exceeded = Signal(name="bidding.cost_exceeded")
#: A task needs a human (deferred too often, or no node could take it). Args: task_id, reason.
#: From seed 002's watch (its node silent about it for ``max_check_attempts`` checks; the task
#: keeps running) also: watch=True, node, attempt, check_attempts.
task_escalated = Signal(name="bidding.task_escalated")


def notify(settings: Settings, signal: Signal, event: str, **payload: Any) -> None:
    """Send ``signal`` and, when ``bidding_notify_url`` is set, POST the event as JSON."""
    try:
        signal.send(sender=event, **payload)
    except Exception:  # a receiver is user code: it must not break the task's bookkeeping
        logger.exception("a %s receiver failed", event)
    if not settings.notify_url:
        return
    # Imported here: only a federation with a webhook needs it (0.6 MB of every node's main
    # process otherwise).
    import urllib.request

    body = json.dumps({"event": event, **payload}, default=str).encode()
    request = urllib.request.Request(settings.notify_url, data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=settings.notify_timeout) as response:
            response.read()
    except Exception:
        logger.exception("notification %s to %s failed", event, settings.notify_url)
