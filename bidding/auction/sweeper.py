"""What every node worker's sweeper does, every ``bidding_sweep_interval`` seconds.

0. ends the tasks not started by their start-by time, their expiry or deadline
   (``expiry.end_expired``): waiting ones are never announced again;
1. closes auctions past their window (``close.close_expired``, the deadline closer);
2. announces tasks whose scheduled start, retry backoff or deferral has come
   (``announce.announce_due``);
3. watches winners (``watchdog.check_winners``): lost or late winners are replaced, undelivered
   executions sent again;
4. reports outcomes (``report.report_results``): a final result or error the result backend
   may lack (its write failed while the broker restarted) is written from the store;
5. on SQLite, checkpoints the store's write-ahead log (``checkpoint_wal``), so that the
   writes a caller waits on do not.

Beside them run the loops of the plug-ins that are on (``lifecycle.plugins``: task graphs
advance those nobody moved for a while; the write-behind journal writes its awards to the
store), and the node's turn at the retention job: one node at a time prunes the tasks
finished more than ``bidding_retention_days`` ago (``lifecycle.retention``).

All of it is driven by the store, so a lost message or a broker restart cannot leave a task
without a final state. Every phase reads the whole federation's due work, so one node sweeps:
the holder of the sweeper lease (``lifecycle.lease``), renewed every heartbeat interval; the
others read it when it could have lapsed (at most every half TTL) and take it over when it has
(its holder killed, or without its broker). Two sweeping at once for a moment is harmless:
the transitions are compare-and-sets.
A phase that keeps finding nothing slows down to ``IDLE_INTERVAL``, or ``FALLBACK_IDLE_INTERVAL``
for those that are a fallback only (an idle federation costs a few statements a second, however many
nodes it has). Once idle, the four phases that look for rows whose time has come (0, 1, 2 and 4)
stop reading the store on their own: one look a second (``idle_look``) reads when each next has
work, and wakes the phase whose time has come, or times its next look for it. On the holder
each phase runs on a loop of its own, so one that blocks (a half-open connection until its
timeout, a store waiting for a lock) cannot stop the others.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
from collections.abc import Callable

from celery import Celery

from bidding import clock
from bidding.auction import idle_look
from bidding.auction.announce import announce_due
from bidding.auction.close import close_expired
from bidding.auction.expiry import end_expired
from bidding.auction.watchdog import check_winners
from bidding.config import Settings
from bidding.context import Context
from bidding.execution.report import report_results
from bidding.lifecycle import lease
from bidding.lifecycle.plugins import plugins_of
from bidding.lifecycle.retention import RetentionJob
from bidding.nodes.heartbeat import LeaseSeen
from bidding.nodes.periodic import IDLE_PASSES, Periodic, idle_pause
from bidding.store import checkpoint
from bidding.store.engine import is_sqlite
from bidding.store.turns import quiet_turn

logger = logging.getLogger(__name__)


#: After ``periodic.IDLE_PASSES`` passes of a phase that found nothing in a row, its interval
#: starts to double from ``bidding_sweep_interval``, up to ``IDLE_INTERVAL`` seconds; the first
#: pass that finds work brings it back. An idle federation's store then sees a few sweeps a second,
#: and work that arrives waits at most ``IDLE_INTERVAL`` for its first sweep (auctions close on
#: their last answer, tasks start on their award, and retries are announced by the process
#: that failed them, ``alarm``: a sweep is their fallback).
IDLE_INTERVAL = 1.0
#: The phases that are only a fallback for work done elsewhere slow down further while idle:
#: outcomes reported from the store when the result backend missed them, graphs nobody moved
#: advanced. Each wake of an idle phase costs its node CPU (bench/idle.py --threads). The
#: phases whose timing a caller sees keep ``IDLE_INTERVAL``: a task scheduled to start
#: (announce_due), an auction whose candidates stay silent (close_expired), a task's expiry
#: (end_expired), a winner that does not start the task within its schedule-to-start timeout
#: (check_winners). (The idle look watches report_results once a second, like the others: its
#: slower pace is then that of its own passes, which read the store only without a look.)
FALLBACK_IDLE_INTERVAL = 3.0
#: The sweep's phases that idle at ``FALLBACK_IDLE_INTERVAL`` (the others at
#: ``IDLE_INTERVAL``); a plug-in's loop does when it says it is ``fallback_only``.
FALLBACK_PHASES = frozenset({"report_results"})
#: The lease loop's jitter: a standby's look timed for a lapse may come this much early.
LEASE_JITTER = 0.1
#: Heartbeat intervals for which what a beat read of the lease stands in for a standby's own
#: reading: past them (the beats failing, or not reading the lease), it reads it itself again
#: at least every half TTL.
BEAT_SHOWS_LEASE = 3
#: The sweeping loops' jitter: a pass timed for a due task may come this much late.
PHASE_JITTER = 0.25
#: Seconds since the idle look last finished after which the idle phases it watches read the
#: store on their own again: a look stuck on a half-open connection (until the kernel gives up
#: on it, minutes) must not stop them all, as one stuck phase never stops the others.
LOOK_PATIENCE = 3 * IDLE_INTERVAL


def sweep(ctx: Context) -> int:
    """One sweep: close expired auctions, announce due tasks, report outcomes, watch winners
    (the plug-ins' loops, e.g. task graphs', run on their own).

    Returns the number of nodes alive.
    """
    # Each phase on its own: a failing one (the bid board's Redis unreachable, say) must not
    # stop the others, or retries, deferrals and watchdogs would stop with it.
    for phase in (end_expired, close_expired, announce_due, report_results):
        try:
            phase(ctx)
        except Exception:
            logger.exception("sweep: %s failed", phase.__name__)
    return check_winners(ctx)[1]


def checkpoint_wal(ctx: Context) -> int:
    """Copy a SQLite store's logged pages into its database file (``store.checkpoint``;
    nothing on PostgreSQL). Returns the pages logged since its last checkpoint when a
    burst's worth had piled up (``BUSY_LOG_PAGES``), else 0: an idle federation's heartbeats
    log a few pages a second, and its checkpoints slow down to one every ``IDLE_INTERVAL``
    like an idle phase."""
    logged = checkpoint.checkpoint(ctx.settings.database_url)
    return logged if logged >= BUSY_LOG_PAGES else 0


def idle_interval(base: float, empty_passes: int, longest: float = IDLE_INTERVAL) -> float:
    """A phase's seconds between passes after ``empty_passes`` that found nothing in a row:
    ``base`` until ``IDLE_PASSES``, then doubling up to ``longest`` (never below ``base``: a
    slower configured sweep stays as slow)."""
    return idle_pause(base, empty_passes, longest)


def found_work(result: object) -> bool:
    """Whether a phase's result says it did something (a count, or check_winners' pair)."""
    if isinstance(result, tuple):
        result = result[0]
    return isinstance(result, int) and result > 0


#: A checkpoint that found at least this many new pages in a SQLite store's log (SQLite's own
#: threshold for one) keeps the phase at ``bidding_sweep_interval``; one that found fewer
#: counts as a pass that found nothing. So the log between two checkpoints stays far below
#: the connections' own threshold (``store.engine.WAL_BACKSTOP_FRAMES``): up to a second of
#: writes below 1,000 pages a second, a fifth of a second's above.
BUSY_LOG_PAGES = 1000


#: The phases of a sweep, by the name each is looked up under when it runs.
PHASES = ("end_expired", "close_expired", "announce_due", "report_results", "check_winners",
          "checkpoint_wal")


class Sweeper:
    """A node's sweeper: the lease loop, always; while this node holds the federation's
    sweeper lease (``lifecycle.lease``), each phase on a restartable loop (thread) of its own.
    A node that stands by runs no phase thread at all: an idle standby wakes for its lease
    look, its heartbeat and its watch, nothing else."""

    def __init__(self, settings: Settings, app: Celery, holder: str | None = None) -> None:
        self.settings = settings
        self.app = app
        #: Who holds the lease, as the jobs table shows it (this worker, this process).
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        #: Whether this node sweeps the federation now (holds the lease).
        self.leading = False
        #: Until when the lease this node last saw runs (None: not seen, or nobody's).
        self.lease_until: float | None = None
        #: When (``time.monotonic``) this node's heartbeat last showed it the lease held by
        #: another (``saw_lease``); None: never, or not since this node last read it itself.
        self.beat_saw_lease_at: float | None = None
        #: When the next idle phase has work, as the last look read (None: none has, as far as
        #: it could tell).
        self.next_at: float | None = None
        #: This node's phases: the checkpoint's on SQLite alone (no thread waking for nothing).
        self.phases = tuple(name for name in PHASES if name != "checkpoint_wal"
                            or is_sqlite(settings.database_url))
        #: Passes in a row that found nothing, by phase.
        self.empty: dict[str, int] = {name: 0 for name in self.phases}
        #: The idle phases the look found work for, each until its loop has run it.
        self.wanted: set[str] = set()
        #: When (``time.monotonic``) the idle look last finished, or the sweeping began.
        self.looked_at = time.monotonic()
        #: Whether the last idle look failed (its first failure is logged as a warning).
        self.look_failed = False
        self._lease_loop = Periodic("bidding-sweeper-lease", self.lease_interval,
                                    self.hold_lease, jitter=LEASE_JITTER)
        #: The phases (and plug-in loops) that idle at ``FALLBACK_IDLE_INTERVAL``.
        self.fallbacks = set(FALLBACK_PHASES)
        #: The loops that run while this node sweeps the federation.
        self.sweeping = [Periodic(f"bidding-sweeper-{name}", functools.partial(self.interval, name),
                                  functools.partial(self.run, name), jitter=PHASE_JITTER)
                         for name in self.phases]
        self._phase_loops = dict(zip(self.phases, self.sweeping, strict=True))
        #: The idle phases' look (``idle_look``), one statement instead of one per phase.
        self.sweeping.append(Periodic("bidding-sweeper-idle", self.look_interval,
                                      self.look_for_work, jitter=PHASE_JITTER))
        #: The loops every node runs (its own work: a plug-in's writer, its retention look).
        self.own: list[Periodic] = []
        for plugin in plugins_of(Context(settings, app)):
            for loop in plugin.loops(lambda: self.settings.sweep_interval):
                if loop.federation_wide:
                    # A phase of the sweep like the others: run by the holder, slower idle.
                    self.empty[loop.name] = 0
                    if loop.fallback_only:
                        self.fallbacks.add(loop.name)
                    self.sweeping.append(Periodic(
                        loop.name, functools.partial(self.interval, loop.name),
                        functools.partial(self._pass, loop.name, loop.run), jitter=PHASE_JITTER))
                else:
                    self.own.append(Periodic(loop.name, loop.interval, loop.run, jitter=0.25))
        retention = RetentionJob(settings, self.holder)
        self.own.append(Periodic("bidding-retention", retention.interval, retention.run,
                                 jitter=0.25))
        self._started = False

    @property
    def loops(self) -> list[Periodic]:
        """Every loop this sweeper may run."""
        return [self._lease_loop, *self.sweeping, *self.own]

    def lease_interval(self) -> float:
        """Seconds until the next look at the lease: a heartbeat interval for its holder (the
        renewal) and for a node that knows of no lease; for a node standing by, just after
        the lease it saw could lapse (the loop's jitter may wake it early: the wait allows
        for it), and at most half a heartbeat TTL while its own beats do not show it the
        lease (``saw_lease``: a holder that stops cleanly gives it up early, and the beats
        tell of that). While they do, it wakes every ``BEAT_SHOWS_LEASE`` heartbeat intervals
        at least, reading nothing, to see whether they still do. Whoever sees it last before
        its holder dies takes it over as it lapses."""
        interval, ttl = self.settings.heartbeat_interval, self.settings.heartbeat_ttl
        if self.leading or self.lease_until is None:
            return interval
        wait = self.lease_until - clock.now()
        # Told by its own beats of each renewal and of a give-up, a standby needs to read it
        # only when the lease could lapse (its pass skips the read while a beat shows it
        # renewed); it wakes as often as beats that stopped would be noticed, so that it
        # reads every half TTL again soon after they stop.
        cadence = (BEAT_SHOWS_LEASE * interval if self.beats_show_lease()
                   else max(ttl / 2, interval))
        if wait > cadence:
            return cadence
        return max(wait, 0.0) / (1 - LEASE_JITTER) + 0.05

    def beats_show_lease(self) -> bool:
        """Whether this node's heartbeat has shown it the lease lately (within
        ``BEAT_SHOWS_LEASE`` heartbeat intervals): a standby then reads the lease only once a
        beat has seen it lapse, or none has seen it renewed by the time it could."""
        seen_at = self.beat_saw_lease_at
        return (seen_at is not None and time.monotonic() - seen_at
                <= BEAT_SHOWS_LEASE * self.settings.heartbeat_interval)

    def saw_lease(self, seen: LeaseSeen) -> None:
        """What this node's heartbeat read of the sweeper lease (in the beat's own statement):
        a standby keeps the holder's renewals without reading the lease itself, and a lease
        that has lapsed, been given up or was never taken wakes its lease loop at once (a
        holder's clean stop is then taken over within a heartbeat interval)."""
        if self.leading or not self._started:
            return
        if (seen.until is not None and seen.holder not in (None, self.holder)
                and seen.until > clock.now()):
            self.lease_until = seen.until
            self.beat_saw_lease_at = time.monotonic()
            return
        self.beat_saw_lease_at = None
        if not self._lease_loop.failures:  # one backing off after failures keeps its pace
            self._lease_loop.wake()

    def interval(self, phase: str) -> float:
        """Seconds until ``phase``'s next pass: the sweep interval, longer while it idles."""
        return idle_interval(self.settings.sweep_interval, self.empty.get(phase, 0),
                             FALLBACK_IDLE_INTERVAL if phase in self.fallbacks
                             else IDLE_INTERVAL)

    def idle(self, phase: str) -> bool:
        """Whether ``phase`` has found nothing for long enough to idle."""
        return self.empty.get(phase, 0) >= IDLE_PASSES

    def look_interval(self) -> float:
        """Seconds until the idle phases' next look: the idle interval, or sooner when the last
        look saw an idle phase's work come before that (early rather than late despite the
        loop's jitter: an early look finds nothing due and sleeps the rest)."""
        pause = max(self.settings.sweep_interval, IDLE_INTERVAL)
        if self.next_at is not None:
            until = (self.next_at - clock.now()) / (1 + PHASE_JITTER)
            pause = min(pause, max(until, self.settings.sweep_interval / 4))
        return pause

    def look_for_work(self) -> None:
        """The idle phases' look: read when each next has work (one statement), wake those whose
        time has come, and remember when the next one's comes. A look that fails wakes every
        idle phase, which then reads the store as it would alone."""
        idle = tuple(name for name in idle_look.LOOKED if self.idle(name))
        if not self.leading or not idle:
            self.next_at, self.looked_at = None, time.monotonic()
            return
        try:
            with quiet_turn():
                seen: idle_look.Look | None = idle_look.look(Context(self.settings, self.app))
        except Exception as exc:
            (logger.debug if self.look_failed else logger.warning)(
                "the idle sweeper's look failed (%s): its phases read the store on their own "
                "meanwhile", exc)
            seen = None
        else:
            if self.look_failed:
                logger.info("the idle sweeper's look works again")
        self.look_failed = seen is None
        now = clock.now()
        due = idle if seen is None else [name for name in seen.due(now) if name in idle]
        for name in due:
            self.wanted.add(name)
            loop = self._phase_loops[name]
            if not loop.failures:  # one backing off after failures runs at its backoff's pace
                loop.wake()
        self.next_at = None if seen is None else seen.next_at(now, among=idle)
        self.looked_at = time.monotonic()

    def hold_lease(self) -> bool:
        """Take or renew the sweeper lease for a heartbeat TTL (a standby only reads it until
        it lapses); start or stop the sweeping loops when that changes, and say so."""
        if (not self.leading and self.beats_show_lease() and self.lease_until is not None
                and self.lease_until > clock.now()):
            return False  # a beat has seen it renewed since this loop was timed: no read
        try:
            with quiet_turn():  # a statement every few seconds: beside the idle passes
                if self.leading:  # the renewal: a write, no read first
                    ttl = self.settings.heartbeat_ttl
                    held = lease.hold(self.settings.database_url, self.holder, ttl)
                    seen = lease.Look(held, clock.now() + ttl if held else None)
                else:
                    seen = lease.look(self.settings.database_url, self.holder,
                                      self.settings.heartbeat_ttl)
        except Exception:
            self.lease_until = None
            self._lead(False)  # the store unreachable: another node may sweep meanwhile
            raise
        self.lease_until = seen.until
        self.beat_saw_lease_at = None  # its own reading is newer than any beat's
        self._lead(seen.held)
        return seen.held

    def _lead(self, held: bool) -> None:
        if held == self.leading:
            return
        logger.info("%s: %s", self.holder, "sweeps the federation (holds the sweeper lease)"
                    if held else "stands by (another node sweeps the federation)")
        self.leading = held
        if not self._started:
            return
        if held:
            self.empty = dict.fromkeys(self.empty, 0)
            self.looked_at = time.monotonic()
            for loop in self.sweeping:
                loop.start()
        else:
            for loop in self.sweeping:
                loop.stop()

    def run(self, phase: str) -> None:
        """Run one phase once while this node sweeps (looked up by name now, so a wrapper
        around it is honoured)."""
        self._pass(phase, lambda: globals()[phase](Context(self.settings, self.app)))

    def _pass(self, name: str, run: Callable[[], object]) -> None:
        """One pass of a sweeping loop while this node sweeps, counting the empty ones. An idle
        phase that the look watches runs only when the look found it work (``wanted``), or
        when no look has finished for ``LOOK_PATIENCE`` seconds."""
        if not self.leading:
            return
        idle = self.idle(name)
        if (idle and name in idle_look.LOOKED and name not in self.wanted
                and time.monotonic() - self.looked_at < LOOK_PATIENCE):
            self.empty[name] += 1
            return
        self.wanted.discard(name)  # before the run: work the look finds meanwhile wakes it again
        # An idle pass: on the process's turn, so that the idle loops share a connection.
        with quiet_turn(idle=idle):
            self.empty[name] = 0 if found_work(run()) else self.empty.get(name, 0) + 1

    def start(self) -> None:
        """Look at the lease once now (a federation's first node sweeps from its start, not
        a heartbeat interval later), then start the lease loop, this node's own loops, and the
        sweeping ones if it holds the lease."""
        self._started = True
        try:
            self.hold_lease()
        except Exception as exc:  # the lease loop tries again, with backoff
            logger.warning("%s: the sweeper lease could not be read yet (%s)", self.holder, exc)
        for loop in (self._lease_loop, *self.own, *(self.sweeping if self.leading else ())):
            loop.start()

    def stop(self) -> None:
        """Stop every loop (each finishes the phase it is running), and give the lease up so
        that another node sweeps at its next look."""
        self._started = False
        for loop in self.loops:
            loop.stop()
        if self.leading:
            self.leading = False
            try:
                lease.give_up(self.settings.database_url, self.holder)
            except Exception as exc:  # it lapses in a heartbeat TTL anyway
                logger.warning("%s: giving up the sweeper lease failed (%s)", self.holder, exc)
