"""Sending an awarded attempt to its node: the execution message, and what a failed send does.

The execution is the task itself, sent to ``exec.<node>`` under the id ``.delay()`` returned,
with the attempt and node in its headers. An award is committed before its execution is sent,
so a send that fails (the broker down past Celery's publish retries) is logged (SEND_FAILED)
and made due at once, and a sweeper sends it again (``auction.watchdog.resend``). Every award
sets when a sweeper next looks at an attempt that has not started (``delivery_due``).
"""

from __future__ import annotations

import logging

from celery import Celery

from bidding import clock, tracing
from bidding.config import Settings
from bidding.execution.canvas import message_options
from bidding.execution.priority import execution_queue, message_priority
from bidding.execution.room import RESOURCES_HEADER
from bidding.lifecycle import journal, states
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import Announcement
from bidding.nodes.profile import exec_queue
from bidding.store import write_session

logger = logging.getLogger(__name__)


#: Header names carried by an execution message.
ATTEMPT_HEADER = "bidding_attempt"


NODE_HEADER = "bidding_node"


def mark_undelivered(settings: Settings, announcement: Announcement, node: str, exc: BaseException,
                     now: float | None = None, retry_in: float = 0.0,
                     lease: float | None = None) -> bool:
    """Log that the announcement's execution never reached ``node`` (SEND_FAILED) and make the
    task due in ``retry_in`` seconds, so that a sweep then sends it again (``sweeper.resend``).
    With a resender's ``lease``, only while it still holds it. False when the task moved on
    meanwhile or the store could not be written either (then the error is logged; the task's
    delivery check or schedule-to-start deadline, set with its award, still comes)."""
    now = clock.now() if now is None else now
    error = f"{type(exc).__name__}: {exc}"
    logger.error(
        "task %s: sending it to %s failed (%s); a sweeper will send it again",
        announcement.task_id,
        exec_queue(node),
        error,
    )
    try:
        with write_session(settings.database_url) as session:
            return transition(
                session,
                announcement.task_id,
                states.ASSIGNED,
                Log(
                    journal.SEND_FAILED,
                    node=node,
                    at=now,
                    detail={"error": error, "queue": exec_queue(node), "retry_in_s": retry_in},
                ),
                Expect(
                    states=(states.ASSIGNED,),
                    attempt=announcement.attempt,
                    node=node,
                    due_by=lease,
                ),
                due_at=now + retry_in,
            )
    except Exception:
        logger.exception("task %s: could not record the failed send either", announcement.task_id)
        return False


def delivery_due(
    settings: Settings, announcement: Announcement, at: float, waited: float = 0.0
) -> float | None:
    """When a sweeper next looks at a task awarded (or sent) at ``at`` and not started: its
    schedule-to-start deadline, or without one a delivery check ``bidding_delivery_check_seconds``
    later, or as long as it has ``waited`` already (so the checks of a task that waits in a
    long queue thin out)."""
    deadline = start_by(settings, announcement, at)
    if deadline is not None or settings.delivery_check_seconds <= 0:
        return deadline
    return at + max(settings.delivery_check_seconds, waited)


def start_by(settings: Settings, announcement: Announcement, awarded_at: float) -> float | None:
    """When the winner must have started the task (schedule-to-start), or None for no limit."""
    # The task's own (its announcer's default is kept with it), 0 meaning no limit.
    limit = (
        announcement.schedule_to_start_timeout
        if announcement.schedule_to_start_timeout is not None
        else settings.schedule_to_start_timeout
    )
    return awarded_at + limit if limit else None


def send_execution(
    app: Celery, announcement: Announcement, node: str, settings: Settings | None = None
) -> None:
    """Send the task itself to ``exec.<node>`` under the id ``.delay()`` returned.

    ``timeout_seconds`` becomes the soft time limit (the body sees SoftTimeLimitExceeded and the
    timeout fallback applies), with a hard limit ``bidding_hard_timeout_grace`` seconds later.
    """
    # No ``expires`` for the deadline: Celery would revoke a late message without a word to the
    # store. BiddingTask checks the deadline as the attempt begins and fails the task, saying why.
    soft = hard = None
    if announcement.timeout_seconds:
        grace = settings.hard_timeout_grace if settings is not None else 5.0
        soft = announcement.timeout_seconds
        hard = announcement.timeout_seconds + max(grace, 0.1)
    # app.send_task minus its result bookkeeping: with a Redis result backend it subscribes this
    # process to the task's result channel and unsubscribes when the AsyncResult is collected,
    # two round trips (and a result message to drop later) for a process that never waits on
    # the result. The message, its headers, signals and the task-sent event are Celery's own.
    amqp = app.amqp
    message = amqp.create_task_message(
        announcement.task_id,
        announcement.task_name,
        announcement.args,
        announcement.kwargs,
        time_limit=hard,
        soft_time_limit=soft,
        create_sent_event=bool(app.conf.task_send_sent_event),
        reply_to=app.thread_oid,
        # Celery's own count, which self.retry() checks against max_retries.
        retries=announcement.attempt - 1,
        **message_options(announcement.canvas),
    )
    # The queue as the node declares it (with priorities on RabbitMQ), and the task's
    # priority as the broker reads it (bidding.execution.priority).
    queue = execution_queue(app, node)
    with app.producer_or_acquire() as producer:
        amqp.send_task_message(
            producer,
            announcement.task_name,
            message,
            queue=queue,
            routing_key=queue.name,
            headers={ATTEMPT_HEADER: announcement.attempt, NODE_HEADER: node,
                     # What the attempt holds while it runs: the node's start waits for room.
                     **({RESOURCES_HEADER: announcement.resources}
                        if announcement.resources else {}),
                     **tracing.execution_headers(announcement)},
            priority=message_priority(app, announcement.priority),
        )
