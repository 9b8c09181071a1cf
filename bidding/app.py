"""``bidding.install(app)``: the node bootsteps and the worker option, on the user's own app.

Idempotent and free of I/O: the store is touched when a worker starts or on first use,
never at install or import.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import click
from celery import Celery, bootsteps
from celery.signals import worker_process_init

from bidding.consumer import BidConsumerStep
from bidding.node import PROFILE_ENV, current_profile
from bidding.periodic import Periodic
from bidding.profile import bid_queue, exec_queue
from bidding.registry import Heartbeat
from bidding.settings import get_settings
from bidding.store import ensure_schema
from bidding.store.engine import reset_after_fork
from bidding.sweeper import sweep, sweep_interval

logger = logging.getLogger(__name__)

_INSTALLED = "_bidding_installed"


def install(app: Celery) -> Celery:
    """Make ``app``'s workers able to serve as nodes, and its BiddingTasks run auctions."""
    if getattr(app, _INSTALLED, False):
        return app
    app.steps["worker"].add(NodeStep)
    app.steps["consumer"].add(BidConsumerStep)
    app.steps["consumer"].add(SweeperStep)
    app.steps["consumer"].add(HeartbeatStep)
    app.user_options["worker"].add(
        click.Option(
            ["--bidding-profile"],
            default=None,
            help="Node profile (TOML) this worker bids with; also BIDDING_PROFILE.",
        )
    )
    setattr(app, _INSTALLED, True)
    return app


class NodeStep(bootsteps.Step):  # type: ignore[misc]  # Celery is untyped
    """Worker bootstep: load the node profile and consume its execution queue (before forking)."""

    label = "bidding node"

    def __init__(self, worker: Any, bidding_profile: str | None = None, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        if bidding_profile:
            # Set before the pool forks, so every child runs as the same node.
            os.environ[PROFILE_ENV] = bidding_profile
        settings = get_settings(worker.app)
        profile = current_profile(settings)
        if profile is None:
            return
        queues = worker.app.amqp.queues
        queues.select_add(exec_queue(profile.name))
        if bid_queue(profile.name) in (queues.consume_from or {}):
            # Bid requests are not Celery tasks: the bid consumer (main process) reads them.
            queues.deselect(bid_queue(profile.name))
            logger.info("%s is read by the bid consumer, not the task pool",
                        bid_queue(profile.name))
        if settings.auto_migrate:
            ensure_schema(settings.database_url)
        logger.info("node %s: capabilities %s, capacity %s", profile.name,
                    ", ".join(profile.capabilities), profile.capacity)


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
    """Run ``bidding.sweeper.sweep``: close expired auctions, announce due tasks, watch winners.

    Every node worker sweeps; the transitions' compare-and-set makes concurrent sweeps harmless.
    """

    label = "bidding sweeper"
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        app = consumer.app
        self.alive = 1

        def run() -> None:
            self.alive = sweep(self.settings, app)

        self.loop = Periodic("bidding-sweeper", lambda: sweep_interval(self.settings, self.alive),
                             run, jitter=0.25)

    def start(self, consumer: Any) -> None:
        """Start sweeping."""
        if self.profile is not None:
            self.loop.start()

    def stop(self, consumer: Any) -> None:
        """Stop sweeping."""
        self.loop.stop()


class HeartbeatStep(_NodeLoopStep):
    """Heartbeat only while this worker consumes its bid and execution queues.

    Started after both consumers, so a node is never a candidate before it can answer (worker
    start-up with mingle takes about a second), and stopped with them, e.g. on a lost broker
    connection.
    """

    label = "bidding heartbeat"
    requires = ("celery.worker.consumer.tasks:Tasks", "bidding.consumer:BidConsumerStep")

    def __init__(self, consumer: Any, **kwargs: Any) -> None:
        super().__init__(consumer, **kwargs)
        self.heartbeat = (Heartbeat(self.settings, self.profile)
                          if self.profile is not None else None)

    def start(self, consumer: Any) -> None:
        """Announce the node as alive."""
        if self.heartbeat is not None:
            self.heartbeat.start()

    def stop(self, consumer: Any) -> None:
        """Mark the node offline."""
        if self.heartbeat is not None:
            self.heartbeat.stop()


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _fresh_engines_in_child(**_: Any) -> None:
    """A forked pool process must not share its parent's database connections."""
    reset_after_fork()

