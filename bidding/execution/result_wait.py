"""A caller's ``.get()`` on a Redis result backend when Redis comes back from a restart.

Celery's Redis ``ResultConsumer``, when its pub/sub connection is re-established, reads the
stored results of the tasks it waits for (``MGET``) and only then subscribes to their channels
again. A result stored and published between the two is seen by neither, and the caller waits
until its timeout for a result that is in Redis. Right after a broker restart that window is
where results land: every node's retried result write goes through as soon as Redis answers.
The chaos soak (bench/soak.py) found a caller waiting so. Reading the results once more after
the subscription closes the window: a result is then seen by that read or by the subscription.
"""

from __future__ import annotations

from typing import Any

from celery.backends import redis as redis_backend


class ResultConsumer(redis_backend.ResultConsumer):  # type: ignore[misc]
    """Celery's consumer, reading the awaited results again once it has resubscribed."""

    def _reconnect_pubsub(self) -> None:
        super()._reconnect_pubsub()
        with self._locked():
            # (Tasks whose result the first read found are no longer subscribed to.)
            waiting: list[Any] = list(self.subscribed_to)
            if not waiting:
                return
            for meta in self.backend.client.mget(waiting):
                if meta:
                    self.on_state_change(self._decode_result(meta), None)


def close_the_resubscribe_gap() -> None:
    """Make Celery's Redis result backends (created from now on) use :class:`ResultConsumer`;
    idempotent."""
    current = redis_backend.RedisBackend.ResultConsumer
    if not (isinstance(current, type) and issubclass(current, ResultConsumer)):
        redis_backend.RedisBackend.ResultConsumer = ResultConsumer
