"""An execution that reaches a node whose app does not register its task: the store ends
the task FAILED with the reason, as Celery's ``NotRegistered`` ends the caller's result.

``bidding.install`` connects the receiver to Celery's ``task_unknown``: every node worker has
it, whether or not its app defines a bidding task (and so imports ``bidding.task``).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import current_app
from celery.exceptions import NotRegistered

from bidding.auction.history import history_changed
from bidding.config import get_settings
from bidding.context import Context
from bidding.execution import attempt as execution
from bidding.execution.dispatch import ATTEMPT_HEADER, NODE_HEADER
from bidding.execution.report import fail_caller

logger = logging.getLogger(__name__)


def not_registered_on_a_node(
    sender: Any = None, message: Any = None, name: str = "", id: str = "", **_: Any
) -> None:
    """A node's worker received the execution of a task its app does not register: Celery
    drops the message and stores ``NotRegistered`` for the caller; the store ends the task
    FAILED with the reason (instead of keeping it ASSIGNED and sending it again for ever) and
    the task's canvas runs its failure path. Runs in the worker's main process."""
    headers = getattr(message, "headers", None) or {}
    attempt, node = headers.get(ATTEMPT_HEADER), headers.get(NODE_HEADER)
    if attempt is None or node is None or not id:
        return  # not a bidding execution
    app = getattr(sender, "app", None) or current_app
    reason = (
        f"node {node} cannot run {name}: no task of that name is registered in its "
        f"workers' app ({app.main}); register it there, or keep it off that node"
    )
    settings = get_settings(app)
    error = NotRegistered(name)  # what Celery stored: the caller sees one error, not two
    try:
        announcement = execution.unrunnable(settings, id, int(attempt), str(node), reason, error)
        if announcement is not None:
            logger.error("task %s: %s", id, reason)
            fail_caller(Context(settings, app), announcement, error)
            history_changed(Context(settings, app), str(node))
    except Exception:  # never break the worker's consumer; the watchdogs remain
        logger.exception("recording that %s cannot run on %s failed", id, node)
