"""What every node worker's sweeper does, every ``bidding_sweep_interval`` seconds.

1. closes auctions past their window (``close.close_expired``, the deadline closer);
2. announces tasks whose scheduled start, retry backoff or deferral has come
   (``announce.announce_due``);
3. watches winners (``watchdog.check_winners``): lost or late winners are replaced, undelivered
   executions sent again;
4. reports outcomes (``report.report_results``): a final result or error the result backend
   may lack (its write failed while the broker restarted) is written from the store.

Beside them run the loops of the plug-ins that are on (``lifecycle.plugins``: task graphs
advance those nobody moved for a while; the write-behind journal writes its awards to the
store), and the node's turn at the retention job: one node at a time prunes the tasks
finished more than ``bidding_retention_days`` ago (``lifecycle.retention``).

All of it is driven by the store, so a lost message or a broker restart cannot leave a task
without a final state; concurrent sweeps of several nodes are made harmless by the transitions'
compare-and-set. On a node each phase runs on a loop of its own (``Sweeper``), so one that
blocks (a half-open connection until its timeout, a store waiting for a lock) cannot stop the
others.
"""

from __future__ import annotations

import functools
import logging
import os
import socket

from celery import Celery

from bidding.auction.announce import announce_due
from bidding.auction.close import close_expired
from bidding.auction.watchdog import check_winners
from bidding.config import Settings
from bidding.context import Context
from bidding.execution.report import report_results
from bidding.lifecycle.plugins import plugins_of
from bidding.lifecycle.retention import RetentionJob
from bidding.nodes.periodic import Periodic

logger = logging.getLogger(__name__)


#: Sweeps per ``bidding_sweep_interval`` across the whole federation, on average: each node's
#: interval grows with the number of live nodes, so 64 idle nodes cost what 4 do.
SWEEPS_PER_INTERVAL = 4


def sweep(ctx: Context) -> int:
    """One sweep: close expired auctions, announce due tasks, report outcomes, watch winners
    (the plug-ins' loops, e.g. task graphs', run on their own).

    Returns the number of nodes alive, which sets the next sweep's interval.
    """
    # Each phase on its own: a failing one (the bid board's Redis unreachable, say) must not
    # stop the others, or retries, deferrals and watchdogs would stop with it.
    for phase in (close_expired, announce_due, report_results):
        try:
            phase(ctx)
        except Exception:
            logger.exception("sweep: %s failed", phase.__name__)
    return check_winners(ctx)[1]


def sweep_interval(settings: Settings, alive: int) -> float:
    """This node's seconds between sweeps when ``alive`` nodes sweep too."""
    return settings.sweep_interval * max(1.0, alive / SWEEPS_PER_INTERVAL)


#: The phases of a sweep, by the name each is looked up under when it runs.
PHASES = ("close_expired", "announce_due", "report_results", "check_winners")


class Sweeper:
    """A node's sweeper: each phase on a restartable loop (thread) of its own, every
    ``sweep_interval`` (with jitter, so the nodes' sweeps spread out)."""

    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.app = app
        #: Nodes alive at the last watch (sets the interval).
        self.alive = 1
        self.loops = [Periodic(f"bidding-sweeper-{name}", self.interval,
                               functools.partial(self.run, name), jitter=0.25)
                      for name in PHASES]
        for plugin in plugins_of(Context(settings, app)):
            self.loops += [Periodic(loop.name, loop.interval, loop.run, jitter=0.25)
                           for loop in plugin.loops(self.interval)]
        retention = RetentionJob(settings, f"{socket.gethostname()}:{os.getpid()}")
        self.loops.append(Periodic("bidding-retention", retention.interval, retention.run,
                                   jitter=0.25))

    def interval(self) -> float:
        """Seconds until this node's next sweep of a phase."""
        return sweep_interval(self.settings, self.alive)

    def run(self, phase: str) -> None:
        """Run one phase once (looked up by name now, so a wrapper around it is honoured)."""
        result = globals()[phase](Context(self.settings, self.app))
        if phase == "check_winners":
            self.alive = result[1]

    def start(self) -> None:
        """Start every phase's loop."""
        for loop in self.loops:
            loop.start()

    def stop(self) -> None:
        """Stop every loop (each finishes the phase it is running)."""
        for loop in self.loops:
            loop.stop()
