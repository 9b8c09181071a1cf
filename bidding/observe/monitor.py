"""The watch's loop: a pass of due checks (``checking.check_due``) up to every second while
there is work, spaced out to a quarter of the shortest first wait while there is none.

Every node worker runs one (as it runs the sweepers), so no extra process is needed;
``bidding monitor`` runs the same loop in the foreground, for a store whose tasks no node
worker watches (or to see escalations as they happen). Passes of several monitors at once are
harmless: each check is claimed by a compare-and-set.
"""

from __future__ import annotations

from celery import Celery

from bidding.config import Settings
from bidding.nodes.periodic import IDLE_PASSES, Periodic
from bidding.observe.checking import Pass, check_due
from bidding.observe.watch import idle_pass_interval
from bidding.store.turns import quiet_turn


class Monitor:
    """A restartable loop of watch passes; its interval follows the shortest first wait of
    any policy and the number of nodes whose monitors share the work, and grows while its
    passes find nothing to write (``idle_pass_interval``)."""

    def __init__(self, settings: Settings, name: str = "bidding-monitor",
                 app: Celery | None = None) -> None:
        self.settings = settings
        #: Where escalations are sent as Flower events (when its events are on).
        self.app = app
        self.last = Pass(shortest_wait=settings.initial_check_wait_time)
        #: Passes in a row that wrote no check and escalated nothing.
        self.empty_passes = 0
        self._loop = Periodic(name, self.interval, self.run_once, jitter=0.25)

    def interval(self) -> float:
        """Seconds until the next pass."""
        return idle_pass_interval(self.last.shortest_wait, self.last.alive, self.empty_passes)

    def run_once(self) -> Pass:
        """One pass now."""
        # An idle pass: on the process's turn, beside the node's other idle loops.
        with quiet_turn(idle=self.empty_passes >= IDLE_PASSES):
            self.last = check_due(self.settings, app=self.app)
        busy = self.last.written or self.last.escalated
        self.empty_passes = 0 if busy else self.empty_passes + 1
        return self.last

    @property
    def running(self) -> bool:
        """True while the loop runs."""
        return self._loop.running

    def start(self) -> None:
        """Start the loop (its first pass after one interval)."""
        self._loop.start()

    def stop(self) -> None:
        """Stop the loop (the pass under way finishes)."""
        self._loop.stop()
