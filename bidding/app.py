"""``bidding.install(app)``: register the bidding tasks, the node bootstep and the worker option.

Idempotent and free of I/O: the store is touched on first use, never at install or import.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import click
from celery import Celery, bootsteps
from celery.signals import worker_process_init

from bidding import tasks
from bidding.announce import BID_TASK, CLOSE_TASK
from bidding.node import PROFILE_ENV, current_profile
from bidding.profile import bid_queue, exec_queue
from bidding.registry import Heartbeat
from bidding.settings import get_settings
from bidding.store import ensure_schema
from bidding.store.engine import reset_after_fork

logger = logging.getLogger(__name__)

_INSTALLED = "_bidding_installed"


def install(app: Celery) -> Celery:
    """Make ``app`` run auctions for tasks declared with ``base=bidding.BiddingTask``."""
    if getattr(app, _INSTALLED, False):
        return app
    app.task(name=BID_TASK, bind=True, ignore_result=True, acks_late=False)(tasks.bid)
    app.task(name=CLOSE_TASK, bind=True, ignore_result=True, acks_late=False)(tasks.close)
    app.steps["worker"].add(NodeStep)
    app.user_options["worker"].add(
        click.Option(
            ["--bidding-profile"],
            default=None,
            help="Node profile (TOML) this worker bids with; also BIDDING_PROFILE.",
        )
    )
    setattr(app, _INSTALLED, True)
    return app


class NodeStep(bootsteps.StartStopStep):  # type: ignore[misc]  # Celery is untyped
    """Worker bootstep: load the node profile, consume its queues, heartbeat while running."""

    label = "bidding node"

    def __init__(self, worker: Any, bidding_profile: str | None = None, **kwargs: Any) -> None:
        super().__init__(worker, **kwargs)
        self.heartbeat: Heartbeat | None = None
        if bidding_profile:
            # Set before the pool forks, so every child bids with the same profile.
            os.environ[PROFILE_ENV] = bidding_profile
        settings = get_settings(worker.app)
        profile = current_profile(settings)
        if profile is None:
            return
        queues = worker.app.amqp.queues
        for name in (bid_queue(profile.name), exec_queue(profile.name), settings.control_queue):
            queues.select_add(name)
        if settings.auto_migrate:
            ensure_schema(settings.database_url)
        self.heartbeat = Heartbeat(settings, profile)
        logger.info("node %s: capabilities %s, capacity %s", profile.name,
                    ", ".join(profile.capabilities), profile.capacity)

    def start(self, worker: Any) -> None:
        """Announce the node as alive."""
        if self.heartbeat is not None:
            self.heartbeat.start()

    def stop(self, worker: Any) -> None:
        """Mark the node offline on a clean shutdown."""
        if self.heartbeat is not None:
            self.heartbeat.stop()


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _fresh_engines_in_child(**_: Any) -> None:
    """A forked pool process must not share its parent's database connections."""
    reset_after_fork()
