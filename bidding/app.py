"""``bidding.install(app)``: the node bootsteps and the worker option, on the user's own app.

Idempotent and free of I/O: the store is touched when a worker starts or on first use,
never at install or import.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import click
from celery import Celery, bootsteps, current_app
from celery.signals import (
    task_failure,
    task_prerun,
    task_retry,
    task_unknown,
    worker_process_init,
    worker_ready,
)

from bidding.auction.bidder import node_bidder
from bidding.auction.celery_options import routed_tasks
from bidding.auction.consumer import BidConsumerStep
from bidding.auction.sweeper import Sweeper
from bidding.auction.unregistered import not_registered_on_a_node
from bidding.auction.watchdog import incarnation_ended
from bidding.auction.writebehind.plugin import JournalPlugin
from bidding.config import ENV_PREFIX, Settings, get_settings
from bidding.context import Context
from bidding.errors import ConfigurationError
from bidding.execution.active import running_tasks
from bidding.execution.current import current_award
from bidding.execution.final_results import keep_final_results_final
from bidding.execution.priority import execution_queue, redeclare_if_unprioritized
from bidding.execution.result_wait import close_the_resubscribe_gap
from bidding.graphs.plugin import GraphPlugin
from bidding.lifecycle.lease import SWEEPER
from bidding.lifecycle.plugins import use
from bidding.nodes import garbage, incarnation
from bidding.nodes.arenas import limit_arenas
from bidding.nodes.heartbeat import Heartbeat
from bidding.nodes.profile import (
    PROFILE_ENV,
    bid_queue,
    current_profile,
    profile_source,
)
from bidding.nodes.warm import add_warm
from bidding.observe.monitor import Monitor
from bidding.store import ensure_schema
from bidding.store.engine import reset_after_fork
from bidding.store.outage import PATIENCE as OUTAGE_PATIENCE
from bidding.store.outage import outlasting
from bidding.strategies.resolver import resolve_strategy

logger = logging.getLogger(__name__)

_INSTALLED = "_bidding_installed"


def install(app: Celery) -> Celery:
    """Make ``app``'s workers able to serve as nodes, and its BiddingTasks run auctions."""
    if getattr(app, _INSTALLED, False):
        return app
    # Optional behaviour, each on when the settings say (lifecycle.plugins).
    use(app, JournalPlugin, GraphPlugin)
    app.steps["worker"].add(NodeStep)
    app.steps["consumer"].add(BidConsumerStep)
    app.steps["consumer"].add(SweeperStep)
    app.steps["consumer"].add(MonitorStep)
    app.steps["consumer"].add(HeartbeatStep)
    app.user_options["worker"].add(
        click.Option(
            ["--bidding-profile"],
            default=None,
            help="Node profile (TOML) this worker bids with; also BIDDING_PROFILE.",
        )
    )
    # A caller waiting on a Redis result backend must not miss a result stored while its
    # pub/sub connection comes back (execution/result_wait.py).
    close_the_resubscribe_gap()
    # Nor may a late RETRY replace a task's final result (execution/final_results.py).
    keep_final_results_final()
    # An execution of a task the app does not register ends FAILED, with the reason.
    task_unknown.connect(not_registered_on_a_node, weak=False,
                         dispatch_uid="bidding.not_registered_on_a_node")
    if app.configured:
        _retry_result_writes(app)
    else:
        app.on_after_configure.connect(_retry_result_writes, sender=app, weak=False)
    if app.finalized:
        _warn_routed(app)
    else:
        app.on_after_finalize.connect(_warn_routed, sender=app, weak=False)
    setattr(app, _INSTALLED, True)
    return app


#: Celery's result-backend retry settings bidding sets when the user's config does not: a
#: result written while the broker (the backend too, usually) restarts is retried with
#: backoff, up to about three minutes; past that a sweeper writes it from the store.
RESULT_RETRIES: dict[str, Any] = {"result_backend_always_retry": True,
                                  "result_backend_max_retries": 20}


def warm(app: Celery) -> None:
    """Pay a process's first-call costs now rather than in its first ``.delay()`` (about
    140 ms here): Celery's import of its result backend and broker connection, the store's
    engine and schema check, the live-node list and the bid board. ``install`` does no I/O,
    so a caller that cares about its first call's latency calls this at start-up."""
    from bidding.auction.board import get_board
    from bidding.nodes.registry import live_nodes

    settings = get_settings(app)
    if settings.auto_migrate:
        ensure_schema(settings.database_url)
    live_nodes(settings)
    get_board(Context(settings, app))
    _ = app.backend
    with app.producer_or_acquire():
        pass


def _warn_routed(sender: Celery, **_: Any) -> None:
    """Say once, when the app's tasks are known, which bidding tasks ``task_routes`` routes:
    the auction decides where they run, and the route is not followed."""
    names = [name for name, task in sender.tasks.items()
             if getattr(task, "is_bidding_task", False) is True]
    try:
        routed = routed_tasks(sender.amqp.router, names, sender.conf.task_default_queue)
    except Exception:  # never stop an app from finalizing over a warning
        logger.debug("checking task_routes against the bidding tasks failed", exc_info=True)
        return
    for name, queue in sorted(routed.items()):
        logger.warning(
            "task_routes sends %s to queue %r, but it is a bidding task: the auction decides "
            "which node runs it and the route is not followed; steer it with required_skills "
            "or preferred_node", name, queue)


def _retry_result_writes(sender: Celery, **_: Any) -> None:
    conf = sender.conf
    # conf.maps: the changes made in code, the config source(s), then Celery's defaults.
    for key, value in RESULT_RETRIES.items():
        if not any(key in layer for layer in conf.maps[:-1]):
            conf[key] = value


class NodeStep(bootsteps.Step):  # type: ignore[misc]  # Celery is untyped
    """Worker bootstep: load the node profile and consume its execution queue (before forking)."""

    label = "bidding node"

    def __init__(self, worker: Any, bidding_profile: str | None = None, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        if bidding_profile:
            # Set before the pool forks, so every child runs as the same node.
            os.environ[PROFILE_ENV] = bidding_profile
        if getattr(worker, "task_events", False):
            # -E on the command line is the worker's, not the app's: recorded where this
            # process (and its pool, forked from it) looks when it sends the auction's task
            # events (``lifecycle.events``), as Celery's own are sent.
            worker.app.conf.worker_send_task_events = True
        settings = get_settings(worker.app)
        check_default_strategy(settings)
        profile = current_profile(settings)
        if profile is None:
            return
        # Before this process starts its threads (and forks its pool, which inherits it).
        limit_arenas(settings.malloc_arenas)
        # A bidder that does not resolve stops the worker here, naming the profile and key,
        # rather than refusing every bid later.
        node_bidder(profile, profile_source(settings))
        queues = worker.app.amqp.queues
        # With priorities on RabbitMQ (bidding.execution.priority); an earlier version's queue
        # without them is replaced before anything consumes it.
        queues.select_add(execution_queue(worker.app, profile.name))
        redeclare_if_unprioritized(worker.app, profile.name)
        if bid_queue(profile.name) in (queues.consume_from or {}):
            # Bid requests are not Celery tasks: the bid consumer (main process) reads them.
            queues.deselect(bid_queue(profile.name))
            logger.info("%s is read by the bid consumer, not the task pool",
                        bid_queue(profile.name))
        url = settings.database_url
        if settings.auto_migrate:
            # (A dropped store connection at start-up is waited out, as everywhere: the worker
            # would exit otherwise, and its supervisor start it again for nothing.)
            outlasting(url, "the store's schema", lambda: ensure_schema(url))
        # A new incarnation of this worker's name, registered before any consumer starts (so
        # no attempt this worker begins is taken for its predecessor's). The attempts of an
        # earlier incarnation under the same name are lost: handled off the start-up path.
        # (Registered again after a lost reply, it finds its own row: the watchdog then knows
        # the predecessor's attempts lost by their boot id.)
        me = incarnation.begin(worker.hostname, profile.name, _slots(worker))
        mismatch = capacity_mismatch(profile.name, profile.capacity, me.slots)
        if mismatch:
            logger.warning("%s", mismatch)
        earlier = outlasting(url, f"registering worker {worker.hostname}",
                             lambda: incarnation.register(settings, me))
        if earlier is not None:
            threading.Thread(target=_handle_ended, args=(settings, earlier),
                             name="bidding-predecessor", daemon=True).start()
        logger.info("node %s: capabilities %s, capacity %s, bidder %s (worker %s, %s pool "
                    "process(es))", profile.name, ", ".join(profile.capabilities),
                    profile.capacity, profile.bidder or "built-in", me.hostname,
                    me.slots or "?")


def capacity_mismatch(node: str, capacity: int, slots: int | None) -> str | None:
    """What to say when a worker runs more or fewer tasks at once than its node's capacity
    (``--concurrency`` given otherwise); None when they agree, or the slots are unknown."""
    if slots is None or slots == capacity:
        return None
    then = ("tasks awarded beyond its slots wait in its queue" if slots < capacity
            else "its extra slots stay idle while the auction counts it full")
    return (f"node {node}: its profile's capacity is {capacity} but this worker runs {slots} "
            f"task(s) at once (--concurrency); bids count the capacity, so {then}")


def check_default_strategy(settings: Settings) -> None:
    """Refuse a ``bidding_strategy`` that does not resolve, naming the setting as it was set.

    Otherwise the worker would start and every auction it announces or closes would fail. A
    worker runs this after importing the app's task modules, so a strategy they register
    resolves.
    """
    try:
        resolve_strategy(settings.strategy, settings.strategy_allowlist)
    except ConfigurationError as exc:
        where = (ENV_PREFIX + "STRATEGY" if os.environ.get(ENV_PREFIX + "STRATEGY") is not None
                 else "bidding_strategy")
        reason = str(exc).removeprefix("strategy: ")
        raise ConfigurationError(f"invalid settings: {where}: {reason}") from None


def _slots(worker: Any) -> int | None:
    """How many attempts the worker's pool runs at once."""
    pool = getattr(worker, "pool_cls", None)
    if pool is not None and "solo" in getattr(pool, "__module__", ""):
        return 1
    concurrency = getattr(worker, "concurrency", None)
    return concurrency if isinstance(concurrency, int) and concurrency > 0 else None


def _handle_ended(settings: Settings, earlier: incarnation.Ended) -> None:
    try:
        # In a thread of its own, so it may outlast a dropped connection as long as a write
        # that must not fail does.
        incarnation_ended(settings, earlier, patience=OUTAGE_PATIENCE)
    except Exception:  # the watchdogs still find its lost attempts
        logger.exception("handling the earlier incarnation of %s failed", earlier.hostname)


class _NodeLoopStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """A consumer bootstep that runs something only on node workers (those with a profile)."""

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.settings = get_settings(consumer.app)
        self.profile = current_profile(self.settings)

    def shutdown(self, consumer: Any) -> None:
        """Same as stop, on the final shutdown."""
        self.stop(consumer)


class SweeperStep(_NodeLoopStep):
    """Run the sweeper (``auction.sweeper``): close expired auctions, announce due tasks, watch
    winners, each phase on a loop of its own.

    Every node worker runs one; the holder of the sweeper lease sweeps the federation, the
    others stand by (``lifecycle.lease``).
    """

    label = "bidding sweeper"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.sweeper = Sweeper(self.settings, consumer.app, holder=consumer.hostname)

    def start(self, consumer: Any) -> None:
        """Start sweeping."""
        if self.profile is not None:
            self.sweeper.start()

    def stop(self, consumer: Any) -> None:
        """Stop sweeping."""
        self.sweeper.stop()


class MonitorStep(_NodeLoopStep):
    """Run the watch of delegated work (``observe.monitor``, seed 002): check tasks their
    nodes have been silent about, escalate those that stay silent.

    Every node worker watches, its passes spaced by the number of nodes (four passes an
    interval across the federation); each check is claimed by a compare-and-set. Unlike the
    sweeps it is not left to one node: a watched node that hangs (SIGSTOP) must be escalated
    without waiting for a lease to lapse, in case it is the one that would watch.
    """

    label = "bidding monitor"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.monitor = Monitor(self.settings, app=consumer.app)

    def start(self, consumer: Any) -> None:
        """Start watching."""
        if self.profile is not None:
            self.monitor.start()

    def stop(self, consumer: Any) -> None:
        """Stop watching."""
        self.monitor.stop()


class HeartbeatStep(_NodeLoopStep):
    """Heartbeat only while this worker consumes its bid and execution queues.

    Started after both consumers, so a node is never a candidate before it can answer (worker
    start-up with mingle takes about a second), and stopped with them, e.g. on a lost broker
    connection.
    """

    label = "bidding heartbeat"
    requires = ("celery.worker.consumer.tasks:Tasks", "bidding.auction.consumer:BidConsumerStep",
                SweeperStep)

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        # Each beat says which tasks this worker's pool runs (what the watch's checks ask), and
        # reads the sweeper lease for this worker's sweeper: a node standing by then reads the
        # lease on its own only when it could lapse.
        sweeper_step = consumer.blueprint.steps.get(SweeperStep.name)
        lease = ((SWEEPER, sweeper_step.sweeper.saw_lease)
                 if isinstance(sweeper_step, SweeperStep) else None)
        if lease is None and self.profile is not None:
            logger.warning("node %s: its heartbeat found no sweeper to tell of the sweeper "
                           "lease; standing by, it reads the lease itself every half TTL",
                           self.profile.name)
        self.heartbeat = (Heartbeat(self.settings, self.profile, incarnation.current(),
                                    running=running_tasks, lease=lease)
                          if self.profile is not None else None)

    def start(self, consumer: Any) -> None:
        """Announce the node as alive."""
        if self.heartbeat is not None:
            self.heartbeat.start()

    def stop(self, consumer: Any) -> None:
        """Mark the node offline (its consumer restarts: the broker connection was lost)."""
        if self.heartbeat is not None:
            self.heartbeat.stop()

    def shutdown(self, consumer: Any) -> None:
        """Mark the node stopped (the worker exits)."""
        if self.heartbeat is not None:
            self.heartbeat.stop(final=True)


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _fresh_engines_in_child(**_: Any) -> None:
    """A forked pool process must not share its parent's database connections; what its
    start-up made is left out of later collections (nodes/garbage.py)."""
    reset_after_fork()
    garbage.freeze_start_up()


@worker_ready.connect  # type: ignore[untyped-decorator]
def _frozen_start_up(**_: Any) -> None:
    """The worker's main process (where a solo or threads pool runs its tasks) too."""
    garbage.freeze_start_up()


@task_failure.connect  # type: ignore[untyped-decorator]
@task_retry.connect  # type: ignore[untyped-decorator]
def _note_failure(**_: Any) -> None:
    garbage.task_failed()


@task_prerun.connect  # type: ignore[untyped-decorator]
def _collect_after_failure(**_: Any) -> None:
    garbage.before_task()



def mark_warm(*items: str, node: str | None = None, app: Celery | None = None) -> list[str]:
    """Say that this node now holds ``items`` warm (``"model:llama-3-8b"``), from a bidding
    task's body after it loaded them: awards of tasks whose ``affinity`` names them prefer
    this node (``bidding.resources.WARM_BONUS``) until its worker starts again.

    ``node``: default, the node running the current task (``bidding.current_award()``);
    outside a task body, name it. Returns everything the node holds warm now."""
    if node is None:
        award = current_award()
        if award is None:
            raise ConfigurationError("mark_warm: outside a bidding task's body, name the node "
                                     "(mark_warm(..., node=\"gpu-a\"))")
        node = award.node
    try:
        return add_warm(get_settings(app or current_app), node, list(items))
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None
