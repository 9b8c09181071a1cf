"""A task's priority on the broker: its execution queue and the priority its message carries.

A bidding priority is 0-9, higher more urgent (``bidding.models.parse_priority``). Brokers
disagree on the direction, so the message's priority is translated here, once:

- RabbitMQ (and every AMQP broker) orders a queue declared with ``x-max-priority`` by the
  message's priority, higher first: the execution queues are declared with ``x-max-priority``
  9 and the message carries the bidding priority as it is.
- kombu's Redis transport (and its other virtual transports) keeps one list per priority band
  and reads the band of the *lowest* number first (``priority_steps``, by default 0, 3, 6 and 9):
  the message carries ``9 - priority``. With the default steps the ten levels fall into four
  bands, most urgent first: 7-9, 4-6, 1-3, 0 ("high", "normal" and "low" each in their own);
  within a band, first come first served. ``broker_transport_options = {"priority_steps":
  list(range(10))}`` (on callers and workers alike) gives every level a band of its own.

A node runs as many tasks at once as its pool has slots, and fetches the next message only when
a slot frees (acknowledged late, a prefetch of one per slot), so what waits is taken most
urgent first.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

from celery import Celery
from kombu.connection import Connection

from bidding.models import MAX_PRIORITY
from bidding.nodes.profile import exec_queue

logger = logging.getLogger(__name__)

#: The ``x-max-priority`` of a node's execution queue on RabbitMQ.
QUEUE_MAX_PRIORITY = MAX_PRIORITY
#: Queue types that take ``x-max-priority`` (a quorum or stream queue refuses the argument).
_PRIORITY_QUEUE_TYPES = (None, "classic")


@functools.lru_cache(maxsize=32)
def _native(broker_url: str) -> bool:
    """True when the broker orders by priority higher first (AMQP), False for kombu's virtual
    transports (Redis and the rest), which read the lowest number first."""
    # The transport's class, from the URL alone: nothing connects.
    driver: str = Connection(broker_url).transport.driver_type  # type: ignore[no-untyped-call]
    return driver == "amqp"


def is_native(app: Celery) -> bool:
    """Whether ``app``'s broker orders a queue by priority, higher first (AMQP)."""
    return _native(str(app.conf.broker_write_url or app.conf.broker_url or "amqp://"))


def message_priority(app: Celery, priority: int) -> int:
    """The priority an execution message of bidding ``priority`` carries on ``app``'s broker."""
    return priority if is_native(app) else MAX_PRIORITY - priority


def execution_queue(app: Celery, node: str) -> Any:
    """``node``'s execution queue as ``app`` declares it, registered in its queues (so a
    caller's send and the node's consumer declare it alike): on AMQP with ``x-max-priority``."""
    name = exec_queue(node)
    queues = app.amqp.queues
    known = queues.get(name)  # kombu's Queue (untyped)
    if known is not None and _declared_here(known):
        return known
    queue = queues.new_missing(name)
    if is_native(app) and queues.create_missing_queue_type in _PRIORITY_QUEUE_TYPES:
        arguments: dict[str, Any] = dict(queue.queue_arguments or {})
        arguments["x-max-priority"] = QUEUE_MAX_PRIORITY
        queue.queue_arguments = arguments
    queue.bidding_execution = True  # a mark, see _declared_here
    return queues.add(queue)


def _declared_here(queue: Any) -> bool:
    """True for a queue this module made (a ``-Q exec.<node>`` on the command line makes one
    without the priority argument first: it is replaced)."""
    return bool(getattr(queue, "bidding_execution", False))


def redeclare_if_unprioritized(app: Celery, node: str) -> None:
    """Make sure ``node``'s execution queue on RabbitMQ takes priorities.

    A queue declared by an earlier version (no ``x-max-priority``) cannot be declared again
    with it (the broker refuses: PRECONDITION_FAILED) and must be replaced. It is deleted and
    declared anew as the node's worker starts, before it consumes; executions it still held
    are ASSIGNED in the store, and the sweepers' delivery check sends them again (as after a
    broker that lost its messages). Nothing on other brokers.
    """
    if not is_native(app):
        return
    queue = execution_queue(app, node)
    if not queue.queue_arguments:
        return
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=3)
        first = conn.channel()
        try:
            queue(first).declare()
            first.close()
            return
        except conn.channel_errors as exc:
            if getattr(exc, "code", None) != 406:  # PRECONDITION_FAILED: the arguments differ
                raise
        # The refused declaration closed that channel: another for the rest.
        channel = conn.channel()
        try:
            held = channel.queue_declare(queue.name, passive=True).message_count
            channel.queue_delete(queue.name)
            queue(channel).declare()
        finally:
            channel.close()
    logger.warning(
        "%s was declared without priorities (by an earlier version): declared again with "
        "x-max-priority %s%s", queue.name, QUEUE_MAX_PRIORITY,
        f"; the {held} execution(s) it held are sent again by the sweepers' delivery check"
        if held else "")
