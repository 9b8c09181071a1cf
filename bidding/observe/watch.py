"""Seed 002's adaptive checking of delegated work, as pure rules (no store, no broker).

A delegated task (ASSIGNED or EXECUTING on a node) keeps a checking state: ``check_attempts``
(checks that found no news), ``next_check_time`` and ``since``, the latest news its schedule
counts from. ``decide(now, state, policy, news, node)`` says what a look at the task does:

- **events first**: news (the award, the node accepting the task, a progress report: their
  times are already on the task's row, so the hot path writes nothing more) newer than
  ``since`` clears the state, and the schedule starts again from it;
- a look before ``next_check_time`` does nothing;
- a due check that finds no news raises ``check_attempts`` and waits
  ``initial * factor ** attempts`` seconds, capped at the maximum (30, 60, 120 ... 1800 s);
- a due check after ``max_check_attempts`` checks found nothing escalates the task: a flag for
  a human (the task keeps running; its caller keeps waiting), with a reason saying how many
  checks and what the node said (``NodeReport``). An escalated task is looked at again every
  maximum wait, so that news clears the flag.
"""

from __future__ import annotations

import enum
import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel

from bidding.config import Settings
from bidding.nodes.periodic import idle_pause

#: A worker whose heartbeat is older than this many heartbeat intervals is silent (it missed
#: two beats); its death is the liveness watchdog's call (``bidding_heartbeat_ttl``), not ours.
SILENT_BEATS = 3.0
#: The keys of a policy: the global settings of these names, or a node profile's ``[checking]``.
POLICY_KEYS = ("initial_check_wait_time", "check_backoff_factor", "max_check_wait_time",
               "max_check_attempts")


@dataclass(frozen=True)
class CheckPolicy:
    """How often a delegated task is checked, and after how many checks it is escalated."""

    initial_check_wait_time: float = 30.0
    check_backoff_factor: float = 2.0
    max_check_wait_time: float = 1800.0
    max_check_attempts: int = 10

    def wait(self, attempts: int) -> float:
        """Seconds until the next check after ``attempts`` checks without news."""
        return backoff(self.initial_check_wait_time, self.check_backoff_factor,
                       self.max_check_wait_time, attempts)


def backoff(initial: float, factor: float, cap: float, attempts: int) -> float:
    """``min(initial * factor ** attempts, cap)``, saturating at ``cap`` instead of raising.

    The power alone overflows a float (``1e40 ** 8``, ``2.0 ** 1024``: an OverflowError) long
    after the product passed the cap. A policy's bounds are checked where it is configured,
    but one may come from elsewhere (a node's row, written by a version without them), and
    a check must never raise: so the power is taken only while it stays below the cap, as
    the logarithms tell (a factor of 1 or less never grows the wait).
    """
    if attempts <= 0 or not factor > 1.0 or not initial > 0.0:
        return min(initial, cap)
    if not initial < cap:
        return cap
    # log(initial * factor ** n) >= log(cap): the cap, computed without the power. (Bounded by
    # the largest float too, for a cap that is itself infinite.)
    room = min(math.log(cap) - math.log(initial), math.log(sys.float_info.max))
    if attempts * math.log(factor) >= room:
        return cap
    return min(initial * factor ** attempts, cap)


def policy_for(settings: Settings, overrides: Mapping[str, Any] | None = None) -> CheckPolicy:
    """The global policy (``bidding_*`` settings) with a node's ``[checking]`` overrides."""
    values = {key: getattr(settings, key) for key in POLICY_KEYS}
    values.update({k: v for k, v in (overrides or {}).items() if k in POLICY_KEYS
                   and v is not None})
    return CheckPolicy(float(values["initial_check_wait_time"]),
                       float(values["check_backoff_factor"]),
                       float(values["max_check_wait_time"]), int(values["max_check_attempts"]))


@dataclass(frozen=True)
class WatchState:
    """A delegated task's checking state, as stored with it."""

    check_attempts: int = 0
    next_check_time: float | None = None
    #: The latest news (or reset) the watch has seen: its schedule counts from here.
    since: float | None = None
    escalated_at: float | None = None
    #: Why it was escalated.
    escalation: str | None = None

    @property
    def escalated(self) -> bool:
        """True while the task is flagged for a human."""
        return self.escalated_at is not None


class Action(enum.Enum):
    """What a look at a task does."""

    #: Not due: nothing to write.
    WAIT = "wait"
    #: News (or a fresh delegation, or a reset): the schedule starts from it; nothing checked.
    SCHEDULE = "schedule"
    #: A due check found no news: one more attempt, a longer wait.
    CHECKED = "checked"
    #: A due check after ``max_check_attempts`` checks without news: escalated.
    ESCALATE = "escalate"
    #: An escalated task still without news: looked at again after the longest wait.
    REVIEWED = "reviewed"


@dataclass(frozen=True)
class Decision:
    """The action and the state it leaves (the state looked at, for WAIT)."""

    action: Action
    state: WatchState


class Liveness(enum.Enum):
    """What the node says about an attempt delegated to it."""

    #: Alive, and its heartbeat lists the task among those its pool runs.
    RUNNING = "running"
    #: Alive, but not running the task (queued, lost, or its heartbeat says nothing).
    UNAWARE = "unaware"
    #: The worker holding the attempt (or every worker of the node) stopped heartbeating.
    SILENT = "silent"


@dataclass(frozen=True)
class NodeReport:
    """A node's answer to a check, and how an escalation reason says it."""

    liveness: Liveness
    text: str


@dataclass(frozen=True)
class WorkerBeat:
    """One worker's latest heartbeat: when, and the ids of the tasks its pool ran then."""

    hostname: str
    node: str
    last_heartbeat: float
    running: frozenset[str] = frozenset()


def last_news(awarded_at: float | None, started_at: float | None,
              progress: Mapping[str, Any] | None, attempt: int) -> float:
    """When the task last had news: its award, its start on the node, or this attempt's latest
    progress report (a report of an earlier attempt is older than the award anyway)."""
    times = [t for t in (awarded_at, started_at) if t is not None]
    at = (progress or {}).get("at")
    if (progress or {}).get("attempt") == attempt and isinstance(at, (int, float)):
        times.append(float(at))
    return max(times, default=0.0)


def effective(state: WatchState, news: float) -> WatchState:
    """The state once the news written since the watch last looked counts: unchanged, or
    cleared (no checks, no escalation) with its schedule counting from the news."""
    if state.since is not None and news <= state.since:
        return state
    return WatchState(since=news)


def decide(now: float, state: WatchState, policy: CheckPolicy, news: float,
           node: NodeReport) -> Decision:
    """What looking at a delegated task at ``now`` does (see the module's docstring)."""
    current = effective(state, news)
    if current.next_check_time is None:
        since = current.since if current.since is not None else news
        current = replace(current, since=since,
                          next_check_time=since + policy.wait(0))
    if now < (current.next_check_time or 0.0):
        return Decision(Action.SCHEDULE if current != state else Action.WAIT, current)
    if current.escalated:
        return Decision(Action.REVIEWED,
                        replace(current, next_check_time=now + policy.max_check_wait_time))
    if current.check_attempts >= policy.max_check_attempts:
        return Decision(Action.ESCALATE, replace(
            current, escalated_at=now, escalation=escalation_reason(current.check_attempts, node),
            next_check_time=now + policy.max_check_wait_time))
    attempts = current.check_attempts + 1
    return Decision(Action.CHECKED, replace(current, check_attempts=attempts,
                                            next_check_time=now + policy.wait(attempts)))


def escalation_reason(attempts: int, node: NodeReport) -> str:
    """``silent after 10 checks (node x alive, not running it)``."""
    return f"silent after {attempts} check{'' if attempts == 1 else 's'} ({node.text})"


def report(task_id: str, node: str, worker: str | None, beats: Iterable[WorkerBeat],
           now: float, silent_after: float, node_beat: float | None = None) -> NodeReport:
    """What ``node`` says about ``task_id``, from its workers' heartbeats (``worker``: the one
    that began the attempt, when it began). ``node_beat`` is the node's own heartbeat, used
    when none of its workers has a row."""
    mine = [b for b in beats if b.node == node]
    fresh = [b for b in mine if now - b.last_heartbeat <= silent_after]
    holder = next((b for b in mine if b.hostname == worker), None) if worker else None
    if holder is not None and holder not in fresh:
        age = now - holder.last_heartbeat
        if fresh:
            return NodeReport(Liveness.SILENT, f"worker {holder.hostname} silent for "
                                               f"{age:.1f}s, node {node} alive")
        return NodeReport(Liveness.SILENT, f"node {node} silent for {age:.1f}s")
    if any(task_id in b.running for b in fresh):
        return NodeReport(Liveness.RUNNING, f"node {node} alive and running it")
    if fresh:
        return NodeReport(Liveness.UNAWARE, f"node {node} alive, not running it")
    last = max((b.last_heartbeat for b in mine), default=node_beat)
    if last is None:
        return NodeReport(Liveness.SILENT, f"node {node} never heartbeated")
    if not mine and now - last <= silent_after:
        return NodeReport(Liveness.UNAWARE, f"node {node} alive, its workers say nothing")
    return NodeReport(Liveness.SILENT, f"node {node} silent for {now - last:.1f}s")


def pass_interval(shortest_wait: float, alive: int) -> float:
    """Seconds between a monitor's passes: a quarter of the shortest first wait (so a check is
    at most that late), between 50 ms and 1 s, longer as more nodes' monitors share the work
    (as the sweepers' interval grows: 64 nodes cost what 4 do)."""
    return min(1.0, max(0.05, shortest_wait / 4.0)) * max(1.0, alive / 4.0)


def idle_pass_interval(shortest_wait: float, alive: int, empty_passes: int) -> float:
    """Seconds between a monitor's passes after ``empty_passes`` that wrote nothing in a row:
    ``pass_interval`` until ``periodic.IDLE_PASSES``, then doubling up to a quarter of the
    shortest first wait (times the nodes' share, as ``pass_interval``), never below
    ``pass_interval`` (as the sweeper's idle phases slow down); the first pass that writes a
    check brings it back.

    Why the quarter: that is how late a check may be (``pass_interval``'s rule); the 1 s
    ceiling of a busy monitor is tighter than the rule asks, and cost each idle node a pass a
    second: a fifth of a percent of a core each, more than its heartbeat and its lease
    together (bench/idle.py, per thread)."""
    longest = max(0.05, shortest_wait / 4.0) * max(1.0, alive / 4.0)
    return idle_pause(pass_interval(shortest_wait, alive), empty_passes, longest)


class WatchView(BaseModel):
    """A delegated task's watch, as ``bidding status``, ``explain`` and the API show it."""

    #: Checks since the latest news that found none.
    check_attempts: int
    #: When the next check is due (Unix time); None until the watch schedules it.
    next_check_time: float | None
    escalated: bool
    escalated_at: float | None = None
    #: Why it was escalated: ``silent after 10 checks (node x alive, not running it)``.
    reason: str | None = None

    def line(self, now: float) -> str:
        """``escalated: <reason>``, or the checks so far and when the next one is due."""
        if self.escalated:
            return f"escalated: {self.reason}"
        checks = f"{self.check_attempts} check{'' if self.check_attempts == 1 else 's'}"
        due = ("" if self.next_check_time is None
               else f", next in {max(0.0, self.next_check_time - now):.1f}s")
        return f"{checks} without news{due}"


def view(state: WatchState, news: float) -> WatchView:
    """The watch as it stands with the news written since the watch last looked."""
    current = effective(state, news)
    return WatchView(check_attempts=current.check_attempts,
                     next_check_time=current.next_check_time, escalated=current.escalated,
                     escalated_at=current.escalated_at, reason=current.escalation)
