"""A task's final result in the result backend stays final.

Celery's key-value backends (Redis among them) keep a SUCCESS from being overwritten, not a
FAILURE, and write whatever a worker sends last. A retried task's attempt writes RETRY as it
ends; when that write is held up (a broker restart: Celery retries it for minutes) it can land
after the next attempt has stored the task's final result, and the caller's ``.get()`` then
waits for ever on a task that has ended (the chaos soak found one). Here a RETRY, STARTED or
PROGRESS write never replaces a SUCCESS, FAILURE or REVOKED: the store's final state is what
the caller must see.
"""

from __future__ import annotations

from typing import Any

from celery import states
from celery.backends.base import BaseKeyValueStoreBackend

_original = BaseKeyValueStoreBackend._store_result
_GUARD = "_bidding_keeps_final_results"


def _store_result(self: Any, task_id: str, result: Any, state: str, traceback: Any = None,
                  request: Any = None, **kwargs: Any) -> Any:
    if state not in states.READY_STATES:
        current = self._get_task_meta_for(task_id)
        if current.get("status") in states.READY_STATES:
            return result  # a late interim state: the final result stays
    return _original(self, task_id, result, state, traceback, request, **kwargs)


def keep_final_results_final() -> None:
    """Make Celery's key-value result backends keep a final result (idempotent)."""
    if not getattr(BaseKeyValueStoreBackend, _GUARD, False):
        BaseKeyValueStoreBackend._store_result = _store_result
        setattr(BaseKeyValueStoreBackend, _GUARD, True)
