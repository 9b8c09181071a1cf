"""An auction's phases as Celery task events, so that Flower shows them as the task's states.

Flower builds its task list from Celery's events, and ``celery.events.state`` makes any
``task-<phase>`` event on a task's id the task's state ``<PHASE>`` (it creates the task if it
has not seen it). So the auction sends ``task-announced``, ``task-awarded``,
``task-reawarded``, ``task-deferred`` and ``task-escalated``, and the winning node
``task-executing`` when its attempt begins: a custom state outranks RECEIVED and STARTED in
Celery's precedence, so without it Flower would show AWARDED until the task ends. Flower
shows only Celery's fixed task fields and drops an event's own ones, so the events carry, in
those fields, what fits (name, args, retries = attempt - 1, the winner's routing key); bids,
scores and why the winner won are ``bidding explain``'s and the API's.

Sent only when the process sends task events, as Celery's own are: a node worker started with
``-E`` (``bidding worker`` passes it) or ``worker_send_task_events``; a caller with
``task_send_sent_event`` (Celery's switch for the caller's ``task-sent`` event). Bid requests
and heartbeats are no Celery tasks and send nothing, so they never reach Flower's task list.
An event is a view: a failure to send one is logged at debug level and changes nothing.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any, Final

from celery import Celery
from celery.utils.saferepr import saferepr

from bidding.models import Announcement

logger = logging.getLogger(__name__)

ANNOUNCED: Final = "task-announced"
AWARDED: Final = "task-awarded"
REAWARDED: Final = "task-reawarded"
DEFERRED: Final = "task-deferred"
ESCALATED: Final = "task-escalated"
EXECUTING: Final = "task-executing"
FAILED: Final = "task-failed"

#: Longest repr of a task's arguments in an event (Celery's ``argsrepr`` limit).
ARGS_REPR: Final = 1024


#: The name the auction's events are sent under (``auctioneer@<host>``).
AUCTIONEER: Final = "auctioneer"


def auctioneer() -> str:
    """The hostname the auction's events come from: ``auctioneer@<host>``, the process that
    announced or awarded (a caller or a node's sweeper), as no worker of its own.

    Celery's event state (Flower's) makes a worker of any hostname a task event comes from,
    and each event counts as its heartbeat, so Flower lists this name among its workers,
    Online for two minutes after an auction's event: the name says it is the auction, not a
    node (a node worker is ``<node>@<host>``), and it runs nothing."""
    return f"{AUCTIONEER}@{socket.gethostname()}"


def enabled(app: Celery) -> bool:
    """This process sends task events (see the module's docstring)."""
    conf = app.conf
    return bool(conf.worker_send_task_events or conf.task_send_sent_event)


def send(app: Celery, kind: str, task_id: str, *, hostname: str | None = None,
         force: bool = False, **fields: Any) -> None:
    """Send one task event (``force``: whatever the app's event settings). Never raises."""
    if not (force or enabled(app)):
        return
    try:
        dispatcher = _dispatcher(app, hostname or auctioneer())
        # On a producer of the app's pool, as Celery publishes its own task-sent event: a
        # dispatcher of its own per event (``default_dispatcher``) costs a connection and a
        # producer each time, on the award's path.
        with app.producer_or_acquire() as producer:
            dispatcher.publish(kind, {"uuid": task_id, **fields}, producer, retry=False)
    except Exception:  # a view only: the store holds the truth
        logger.debug("%s event of %s not sent", kind, task_id, exc_info=True)


_DISPATCHERS = "_bidding_event_dispatchers"


def _dispatcher(app: Celery, hostname: str) -> Any:
    """This process's event dispatcher for ``hostname`` (it publishes on a given producer;
    a forked pool process makes its own, since an event carries its sender's pid)."""
    cache: dict[tuple[str, int], Any] = app.__dict__.setdefault(_DISPATCHERS, {})
    key = (hostname, os.getpid())
    found = cache.get(key)
    if found is None:
        found = cache[key] = app.events.Dispatcher(hostname=hostname, enabled=False,
                                                   buffer_while_offline=False)
    return found


def _task(announcement: Announcement) -> dict[str, Any]:
    """The Celery fields of ``announcement`` Flower shows: its name, arguments and retries."""
    return {"name": announcement.task_name, "args": saferepr(announcement.args, ARGS_REPR),
            "kwargs": saferepr(announcement.kwargs, ARGS_REPR), "retries": announcement.attempt - 1}


def announced(app: Celery, announcement: Announcement, candidates: int) -> None:
    """``announcement``'s auction is open (ANNOUNCED)."""
    send(app, ANNOUNCED, announcement.task_id, **_task(announcement), attempt=announcement.attempt,
         candidates=candidates)


def awarded(app: Celery, announcement: Announcement, node: str, queue: str, *,
            outcome: str = "awarded") -> None:
    """``announcement`` was awarded to ``node``: sent before its execution, so that Flower has it
    before the node's own events (``routing_key`` is the queue it is sent to)."""
    send(
        app,
        AWARDED,
        announcement.task_id,
        name=announcement.task_name,
        routing_key=queue,
        node=node,
        attempt=announcement.attempt,
        outcome=outcome,
    )


def reawarded(
    app: Celery, announcement: Announcement, lost: str, node: str, queue: str, reason: str
) -> None:
    """``announcement`` moved from ``lost`` to the next-best bidder ``node`` (REAWARDED)."""
    send(
        app,
        REAWARDED,
        announcement.task_id,
        name=announcement.task_name,
        routing_key=queue,
        node=node,
        from_node=lost,
        reason=reason,
        attempt=announcement.attempt,
    )


def deferred(app: Celery, announcement: Announcement, reason: str) -> None:
    """No live node can take ``announcement`` now: it is announced again later (DEFERRED)."""
    send(app, DEFERRED, announcement.task_id, **_task(announcement), reason=reason)


def escalated(app: Celery, announcement: Announcement, reason: str) -> None:
    """``announcement`` needs an operator (ESCALATED)."""
    send(app, ESCALATED, announcement.task_id, name=announcement.task_name, reason=reason)


def failed(app: Celery, announcement: Announcement, exc: BaseException) -> None:
    """``announcement`` failed outside any worker (no bid, escalated, a lost winner, never sent):
    Celery's ``task-failed``, so that Flower shows FAILURE, not the last phase for ever."""
    send(
        app,
        FAILED,
        announcement.task_id,
        name=announcement.task_name,
        exception=f"{type(exc).__name__}({str(exc)!r})",
        traceback="",
    )
