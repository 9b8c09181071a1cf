"""``BiddingTask``: the base class that turns ``.delay()`` into an auction.

```python
@app.task(base=bidding.BiddingTask, bind=True, task_type="extraction",
          required_skills=["pdf_text_extraction"],
          retry_policy=bidding.RetryPolicy(max_retries=3, backoff="exponential", base_ms=1000))
def extract(self, url):
    self.progress(1, 3, "downloaded")
    ...

extract.delay(url).get()                          # auction, then run on the winner
extract.apply_async([url], bidding={"strategy": "composite", "budget": 2.0})
```
On the winning node the same class records the attempt (accepted, completed, retried or
failed), never runs a finished task again, and turns a failure into a retry when the task's
retry policy allows: a new auction after the backoff, by default without the node that failed.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NoReturn

from celery import Task
from celery.exceptions import Ignore, Retry, TimeLimitExceeded
from celery.result import AsyncResult
from celery.signals import task_internal_error, task_revoked

from bidding import clock, tracing
from bidding.auction.alarm import announce_at
from bidding.auction.announce import announce
from bidding.auction.announcement import arguments_json, build_announcement, check_options
from bidding.auction.celery_options import merge_priority, refuse_steering
from bidding.auction.history import history_changed
from bidding.auction.task_options import check_task_class
from bidding.config import Settings, get_settings
from bidding.context import Context
from bidding.execution import attempt as execution
from bidding.execution.canvas import canvas_of
from bidding.execution.current import running_under
from bidding.execution.dispatch import ATTEMPT_HEADER, NODE_HEADER
from bidding.execution.report import report_if_final, restore_view
from bidding.execution.room import (
    RESOURCES_HEADER,
    WAIT_PAUSE,
    RoomCheck,
    needs_from,
    room_for,
)
from bidding.execution.timing import call_delay, past_deadline
from bidding.lifecycle import events
from bidding.lifecycle.plugins import Plugin, plugins_of
from bidding.models import RetryPolicy
from bidding.nodes import incarnation
from bidding.nodes.profile import NodeProfile, current_profile
from bidding.store import keep_clock, masked_url
from bidding.store.engine import is_sqlite
from bidding.store.outage import outlasting

logger = logging.getLogger(__name__)

_RUNNING = "bidding_running"


def _header(request: Any, name: str) -> Any:
    value = getattr(request, name, None)
    if value is None:
        value = (getattr(request, "headers", None) or {}).get(name)
    return value


class BiddingTask(Task):  # type: ignore[misc]  # Celery's Task is untyped
    """A Celery task whose calls are auctioned among live nodes before they run."""

    #: The kind of work, used for experience (defaults to the task's short name).
    task_type: ClassVar[str | None] = None
    #: Skills a node needs to bid (seed 000's required_capabilities).
    required_skills: ClassVar[list[str] | tuple[str, ...] | str] = ()
    #: Default ``bidding={...}`` options of every call of this task.
    bidding: ClassVar[Mapping[str, Any]] = {}
    #: Retry policy of an attempt (AITP 6.1); None: a failed attempt fails the task.
    retry_policy: ClassVar[RetryPolicy | None] = None
    #: What one attempt holds on its node while it runs (``{"gpu_mem_gb": 20, "cpu": 2}``):
    #: a node whose profile's ``[resources]`` cannot cover it refuses, and a node starts it
    #: only while its running attempts leave room.
    resources: ClassVar[Mapping[str, float]] = {}
    #: Items the task would like warm on its node (``["model:llama-3-8b"]``).
    affinity: ClassVar[list[str] | tuple[str, ...]] = ()
    #: The AITP capability this task implements (``bidding.submit`` runs a subtask with this
    #: ``agent_capability`` as this task); ``required_skills`` default to ``[capability]``.
    capability: ClassVar[str | None] = None

    #: Marks a bidding task for code below this module (``bidding.install``'s route check).
    is_bidding_task: ClassVar[bool] = True

    #: Executions are acknowledged after they finish and requeued if the worker dies.
    acks_late = True
    reject_on_worker_lost = True

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a misspelt option or bad defaults when the task's class is made.

        ``@app.task(base=BiddingTask, ...)`` makes a subclass whose attributes are the
        decorator's options (when the app is finalized: at worker start, or at the task's
        first use in a caller), so a typo such as ``required_skill`` fails there, not never.
        """
        super().__init_subclass__(**kwargs)
        check_task_class(cls)

    def apply_async(
        self,
        args: Any = None,
        kwargs: Any = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: Any = None,
        bidding: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Announce this call for bidding and return the AsyncResult of its execution.

        ``countdown``/``eta`` delay the auction itself; ``priority`` is the task's (as
        ``bidding={"priority": ...}``); ``queue``, ``routing_key`` and ``exchange`` are refused
        (the auction picks the node). ``link``, ``link_error`` and Celery's
        canvas (chains, groups, chords) go with the task's execution (``bidding.execution.canvas``).
        Called by ``self.retry()`` inside a running bidding task, it schedules that task's next
        attempt instead.
        """
        if self.app.conf.task_always_eager:
            return super().apply_async(args, kwargs, task_id, producer, link, link_error,
                                       shadow, **options)
        settings = get_settings(self.app)
        delay = call_delay(options)
        # Celery's own expires is bidding={"expires": ...} (the call's first, the task's last).
        expires = options.pop("expires", None)
        running: execution.Running | None = getattr(self.request, _RUNNING, None)
        if running is not None and task_id == running.task_id:
            # Refused here, as a new call's are.
            arguments_json(self.name, args, kwargs, settings.max_arguments_bytes)
            due = execution.retry_requested(settings, running, delay, args, kwargs)
            if due is not None:
                announce_at(Context(settings, self.app), task_id, due)
            return AsyncResult(task_id, app=self.app)
        refuse_steering(self.name, options)
        defaults = dict(self.bidding or {})
        check_options(defaults, f"{self.name} bidding defaults")
        call = dict(bidding or {})
        check_options(call, f"{self.name}.apply_async(bidding=...)")
        merged = {**defaults, **call}
        merge_priority(self.name, merged, call, options.pop("priority", None), self.priority)
        if expires is not None or merged.get("expires") is None:
            merged["expires"] = expires if expires is not None else self.expires
        if self.retry_policy is not None and "retry_policy" not in merged:
            merged["retry_policy"] = self.retry_policy
        # Its timestamps are the store's time (bidding.clock): read it first in a new process.
        keep_clock(settings.database_url)
        announcement = build_announcement(self, settings, args, kwargs, merged, task_id)
        announcement.canvas = canvas_of(self.app, link, link_error, options)
        ctx = Context(settings, self.app)
        result = announce(ctx, announcement, delay=delay, fresh_id=task_id is None)
        if delay > 0 and not announcement.expired(announcement.announced_at):
            # A countdown or eta: this process announces it at its time, as a retry's node
            # does; the sweeper, which looks for due tasks once a second while idle, is the
            # fallback (this process gone before then, or the task further than the alarm's
            # horizon).
            announce_at(ctx, announcement.task_id, announcement.announced_at + delay)
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task body; on a node: begin its attempt, run the body, record the outcome."""
        request = self.request
        attempt = _header(request, ATTEMPT_HEADER)
        if request.called_directly or attempt is None:
            return super().__call__(*args, **kwargs)
        # Traced: a child of the award's span, whose context the message carries.
        with tracing.execution_span(_header(request, tracing.HEADER), request.id, self.name,
                                    str(_header(request, NODE_HEADER)), int(attempt)):
            return self._run_attempt(int(attempt), args, kwargs)

    def _run_attempt(self, attempt: int, args: Any, kwargs: Any) -> Any:
        """Begin the attempt, run the body, record the outcome (``__call__`` on a node)."""
        settings = get_settings(self.app)
        plugins = plugins_of(Context(settings, self.app))
        run = self._begin(settings, plugins, attempt)
        self._unless_expired(settings, plugins, run)
        try:
            result = self._run_body(run, args, kwargs)
        except Retry:
            history_changed(Context(settings, self.app), run.node)
            raise  # self.retry(): apply_async above scheduled the next attempt
        except Exception as exc:
            self._record_failure(settings, plugins, run, exc)  # raises
        return self._record_result(settings, plugins, run, result)

    @staticmethod
    def _room_check(settings: Settings, request: Any, attempt: int, node: str,
                    profile: NodeProfile | None) -> RoomCheck | None:
        """The start's room check when the attempt needs resources (``execution.room``)."""
        needs = needs_from({RESOURCES_HEADER: _header(request, RESOURCES_HEADER)})
        if not needs or profile is None:
            return None
        return room_for(request.id, attempt, node, needs, profile.resources,
                        lock=not is_sqlite(settings.database_url))

    @staticmethod
    def _wait_for_room(run: execution.Running,
                       begin: Callable[[], execution.Running]) -> execution.Running:
        """Try the start again every ``WAIT_PAUSE`` seconds until the node has room (or the
        attempt is no longer this node's to start: ``begin`` says what it is then)."""
        logger.info("task %s: waiting for room on %s (its running attempts hold what it "
                    "needs)", run.task_id, run.node)
        waited = time.monotonic()
        while run.start is execution.Start.WAITING:
            time.sleep(WAIT_PAUSE)
            run = begin()
        logger.info("task %s: waited %.1fs for room on %s", run.task_id,
                    time.monotonic() - waited, run.node)
        return run

    def _begin(
        self, settings: Settings, plugins: Sequence[Plugin], attempt: int
    ) -> execution.Running:
        """Record that the attempt starts here (its start outlasts a store restart), or drop a
        copy of a message this node (or another) has or had, or one that is not this store's
        (Ignore). Flower hears it EXECUTING."""
        request = self.request
        for plugin in plugins:
            plugin.before_start(request.id)
        profile = current_profile(settings)
        # One start time for every try: a retried begin whose first commit landed knows it.
        started = clock.now()
        node = str(_header(request, NODE_HEADER))
        room = self._room_check(settings, request, attempt, node, profile)

        def begin() -> execution.Running:
            return outlasting(
                settings.database_url,
                f"task {request.id}: recording its start",
                lambda: execution.begin(
                    settings,
                    request.id,
                    attempt,
                    node,
                    profile.price_per_unit if profile is not None else 0.0,
                    redelivered=bool((request.delivery_info or {}).get("redelivered")),
                    starter=execution.Starter(request.hostname, incarnation.boot_id(), started),
                    room=room,
                ),
            )

        run = begin()
        if run.start is execution.Start.WAITING:
            run = self._wait_for_room(run, begin)
        if run.start is execution.Start.UNKNOWN and any(
            plugin.row_coming(request.id) for plugin in plugins
        ):
            run = begin()  # its row is written now (a plug-in that writes rows behind)
        if run.start is execution.Start.DUPLICATE:
            # This worker has announced the copy (task-received/started): point Flower back at
            # the worker that has or had the task.
            if request.hostname:
                restore_view(Context(settings, self.app), request.id)
            raise Ignore()
        if run.start is execution.Start.UNKNOWN:
            # Awards are committed before their message is sent, so this message is not ours: a
            # leftover on a reused broker, or a worker whose store is not the caller's.
            logger.error(
                "execution of %s (attempt %s) dropped: no such task in this node's "
                "store (%s); check bidding_database_url",
                request.id,
                attempt,
                masked_url(settings.database_url),
            )
            raise Ignore()
        setattr(request, _RUNNING, run)
        # Flower's EXECUTING: Celery's own STARTED ranks below the auction's states there.
        events.send(
            self.app,
            events.EXECUTING,
            request.id,
            hostname=request.hostname,
            name=self.name,
            node=run.node,
            attempt=run.attempt,
        )
        return run

    def _unless_expired(
        self, settings: Settings, plugins: Sequence[Plugin], run: execution.Running
    ) -> None:
        """The last line of a task's expiry: an attempt that reached its node after its task's
        start-by time (its expiry or deadline: it waited in the node's queue too long) never
        runs its body. FAILED and logged EXPIRED, nothing charged, no episode (the caller's
        limit is no verdict on the node); the error reaches the caller (raised here)."""
        late = past_deadline(run)
        if late is None:
            return
        ended = outlasting(
            settings.database_url,
            f"task {run.task_id}: recording its expiry",
            lambda: execution.expired(settings, run, late),
        )
        if not ended:
            raise Ignore()  # another moved it meanwhile (a sweeper that expired it): theirs
        logger.info("task %s: %s", run.task_id, late)
        self._ended(plugins, run.task_id)
        raise late

    def _run_body(self, run: execution.Running, args: Any, kwargs: Any) -> Any:
        """The body (its expiry was checked as it began: ``_unless_expired``)."""
        with running_under(run):  # bidding.current_award(), for the body only
            return self.run(*args, **kwargs)

    def _record_failure(
        self, settings: Settings, plugins: Sequence[Plugin], run: execution.Running, exc: Exception
    ) -> NoReturn:
        """The body raised: a retry (Celery's Retry: .get() keeps waiting for the next
        attempt), or the task's failure (the body's error, or the policy's)."""
        verdict = outlasting(
            settings.database_url,
            f"task {run.task_id}: recording its failure",
            functools.partial(execution.fail, settings, run, exc),
        )
        history_changed(Context(settings, self.app), run.node)
        if verdict.retry_in is not None:
            # On time, though the sweeper may be idling a second between passes.
            announce_at(Context(settings, self.app), run.task_id,
                        verdict.retry_at if verdict.retry_at is not None
                        else clock.now() + verdict.retry_in)
            raise Retry(exc=exc, when=verdict.retry_in) from exc
        self._ended(plugins, run.task_id)
        if verdict.error is not None:
            raise verdict.error from exc
        raise exc

    def _record_result(
        self, settings: Settings, plugins: Sequence[Plugin], run: execution.Running, result: Any
    ) -> Any:
        """The body returned: SUCCESS, or the task's failure when its budget or output
        schema says so."""
        verdict = outlasting(
            settings.database_url,
            f"task {run.task_id}: recording its result",
            lambda: execution.complete(settings, run, result),
        )
        # Before Celery stores the result: the caller may announce again as soon as it has it.
        history_changed(Context(settings, self.app), run.node)
        self._ended(plugins, run.task_id)
        if verdict.error is not None:
            raise verdict.error
        return result

    def _ended(self, plugins: Sequence[Plugin], task_id: str) -> None:
        """The attempt ended its task: the plug-ins' ``after_end`` (a task graph's subtask
        moves its graph on)."""
        for plugin in plugins:
            plugin.after_end(task_id, self)

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        """Record a hard time limit (reported by Celery in the worker's main process)."""
        if isinstance(exc, TimeLimitExceeded):
            settings = get_settings(self.app)
            # The request context here is not the task's: the store says which node failed.
            node = execution.hard_timeout(
                settings, task_id, f"TimeLimitExceeded: hard time limit ({exc}) exceeded"
            )
            if node is not None:
                history_changed(Context(settings, self.app), node)

    def progress(self, current: float, total: float, note: str = "") -> None:
        """Report progress from the body (AITP 5.3): a PROGRESS_UPDATE message, the task's
        progress in ``bidding status``, and Celery state PROGRESS for Flower."""
        run: execution.Running | None = getattr(self.request, _RUNNING, None)
        if run is None or run.announcement is None:
            return
        info = execution.report_progress(get_settings(self.app), run, current, total, note)
        # The result backend's state (AsyncResult.state / .info) and, for Flower, which builds
        # its view from worker events, a custom "task-progress" event (state PROGRESS).
        self.update_state(state="PROGRESS", meta=info)
        if self.request.hostname:
            self.send_event("task-progress", **info)

    def report_units(self, units: float) -> None:
        """Say how many units this attempt consumed (its cost is the node's price * units)."""
        run: execution.Running | None = getattr(self.request, _RUNNING, None)
        if run is not None:
            run.units = float(units)


@task_revoked.connect  # type: ignore[untyped-decorator]  # Celery is untyped
def _revoked_on_a_node(
    sender: Any = None,
    request: Any = None,
    terminated: bool = False,
    signum: Any = None,
    expired: bool = False,
    **_: Any,
) -> None:
    """``AsyncResult.revoke()``, ``celery control revoke`` or Flower's button reached the node
    that won a bidding task: Celery dropped its message (or terminated its process) and stored
    REVOKED for the caller; the store records it too, so the task ends FAILED, not ASSIGNED
    or EXECUTING for ever. Runs in the worker's main process."""
    if not isinstance(sender, BiddingTask) or request is None:
        return
    attempt, node = _header(request, ATTEMPT_HEADER), _header(request, NODE_HEADER)
    if attempt is None or node is None:
        return
    why = (
        "expired"
        if expired
        else (f"terminated (signal {signum})" if terminated else "dropped before it started")
    )
    settings = get_settings(sender.app)
    try:
        if execution.revoked(settings, request.id, int(attempt), str(node), f"revoked: {why}"):
            history_changed(Context(settings, sender.app), str(node))
    except Exception:  # never break the worker's revoke handling; the watchdogs remain
        logger.exception("recording the revoke of %s failed", request.id)


@task_internal_error.connect  # type: ignore[untyped-decorator]  # Celery is untyped
def _outcome_not_written(
    sender: Any = None,
    task_id: str | None = None,
    exception: BaseException | None = None,
    **_: Any,
) -> None:
    """Celery failed outside a bidding task's body, typically writing its result while the
    broker (the result backend too) restarts, after its retries: the store holds the outcome,
    and a sweeper writes it to the backend once it can, so the caller gets the real result."""
    if not isinstance(sender, BiddingTask) or task_id is None:
        return
    try:
        if report_if_final(get_settings(sender.app), task_id):
            logger.warning(
                "task %s: its outcome did not reach the result backend (%r); a "
                "sweeper writes it from the store",
                task_id,
                exception,
            )
    except Exception:  # the store is down too: the watchdogs and the next incarnation remain
        logger.exception("recording that %s's outcome was not written failed", task_id)
