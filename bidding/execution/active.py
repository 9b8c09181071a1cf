"""The tasks this worker's pool is running now, from Celery's own bookkeeping in the worker's
main process (what its heartbeat carries, so that a check of a delegated task can ask the node
whether it runs it without a broadcast: ``inspect()`` blocks for a timeout on every call)."""

from __future__ import annotations

from celery.worker import state as worker_state

#: Reads of Celery's set of active requests before giving up on one beat's list.
_TRIES = 5


def running_tasks() -> list[str]:
    """Ids of the tasks this worker's pool has accepted and not finished (sorted)."""
    for _ in range(_TRIES):
        try:
            # The consumer thread adds and removes requests while the heartbeat thread reads:
            # a set that changed size under the iteration is read again.
            return sorted({request.id for request in list(worker_state.active_requests)})
        except RuntimeError:
            continue
    return []
