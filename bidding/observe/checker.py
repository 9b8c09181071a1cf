"""The protocol checker (seed 002's independent verifier): does one task's message log keep the
protocol? A pure function over the task's messages in log order (``check_task``).

It replays the log through AITP's lifecycle (``lifecycle.states.ALLOWED``, narrowed to the
sources each writer's compare-and-set uses) and the auction's own rules, and reports every
message that breaks one, naming the rule (``RULES``) and the messages involved. The rules
are derived from what the code writes: a refused change is logged (ILLEGAL_TRANSITION,
STALE_UPDATE), never applied, so it breaks nothing; a run that lost its task may still speak
(its body runs on) without changing anything; a late answer is kept but cannot win.
docs/architecture.md ("The protocol checker") has the table of rules and why each holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

from pydantic import BaseModel

from bidding.lifecycle import journal, states

#: rule name -> what it says (docs/architecture.md says why each holds).
RULES: Final[Mapping[str, str]] = {
    "announced_first": "a task's log opens with ANNOUNCED, SCHEDULED or DEFERRED",
    "known_kind": "every message is of a kind the journal defines",
    "attempt_numbers": "a state change carries the task's current attempt; only RETRYING and "
                       "a silent round's DEFERRED open the next one; the first attempt is 1",
    "lifecycle": "a state change starts from a state its transition allows",
    "bids_while_open": "a BID or REFUSED not marked late arrives while its attempt's auction "
                       "is open",
    "candidates_only": "only the candidates its attempt's ANNOUNCED names answer, after it",
    "one_award": "at most one AWARDED or NO_AWARD per attempt",
    "award_to_bidder": "AWARDED (except a fallback) and REAWARDED go to a node that bid in "
                       "that attempt, not late",
    "holder_only": "a node's state change comes from the node holding the attempt; RESENT "
                   "names a node the attempt was awarded to",
    "run_order": "a run (node, attempt) reports in order: TASK_ACCEPTED, then "
                 "PROGRESS_UPDATEs, then TASK_COMPLETED and its verdict",
    "final_is_final": "after SUCCESS, FAILED or ESCALATED nothing changes the task",
}


class Violation(BaseModel):
    """One message (or more) of a task's log that breaks one rule."""

    task_id: str
    #: A name of ``RULES``.
    rule: str
    #: What is wrong, in words.
    problem: str
    #: The ids of the messages involved, the offending one first.
    message_ids: list[int]

    def line(self) -> str:
        """``TASK rule: problem [messages 3, 5]`` (plain text)."""
        ids = ", ".join(str(i) for i in self.message_ids)
        return f"{self.task_id} {self.rule}: {self.problem} [messages {ids}]"


class LogMessage(Protocol):
    """What the checker reads of a message (a store row, or any object with these)."""

    #: Its place in the log (the store's id: messages are read in id order).
    id: int
    kind: str
    node: str | None
    attempt: int
    detail: Any


@dataclass(frozen=True)
class _Move:
    """A kind of message that changes the task's state."""

    target: str
    #: The states it may start from: ``states.ALLOWED[target]`` narrowed as its writer does.
    sources: frozenset[str]
    #: The message's node, when it names one, must hold the attempt.
    by_holder: bool = True
    #: Sent by a run after its TASK_ACCEPTED.
    after_accepted: bool = False


_S = states
MOVES: Final[Mapping[str, _Move]] = {
    journal.ANNOUNCED: _Move(_S.BIDDING, frozenset(_S.DUE_STATES), by_holder=False),
    journal.SCHEDULED: _Move(_S.PENDING, frozenset(), by_holder=False),
    journal.DEFERRED: _Move(_S.DEFERRED, _S.sources(_S.DEFERRED), by_holder=False),
    journal.AWARDED: _Move(_S.ASSIGNED, frozenset({_S.BIDDING}), by_holder=False),
    journal.NO_AWARD: _Move(_S.FAILED, frozenset({_S.BIDDING}), by_holder=False),
    journal.REAWARDED: _Move(_S.ASSIGNED, frozenset(_S.IN_FLIGHT_STATES), by_holder=False),
    journal.SEND_FAILED: _Move(_S.ASSIGNED, frozenset({_S.ASSIGNED})),
    journal.WORKER_LOST: _Move(_S.ASSIGNED, frozenset({_S.ASSIGNED})),
    journal.TASK_ACCEPTED: _Move(_S.EXECUTING, _S.sources(_S.EXECUTING)),
    journal.TASK_COMPLETED: _Move(_S.COMPLETED, _S.sources(_S.COMPLETED), after_accepted=True),
    journal.TASK_SUCCEEDED: _Move(_S.SUCCESS, _S.sources(_S.SUCCESS), after_accepted=True),
    journal.OUTPUT_INVALID: _Move(_S.FAILED, frozenset({_S.COMPLETED}), after_accepted=True),
    journal.COST_EXCEEDED: _Move(_S.FAILED, _S.sources(_S.FAILED), after_accepted=True),
    journal.TASK_FAILED: _Move(_S.FAILED, _S.sources(_S.FAILED)),
    # a sweeper ends a waiting task (or one awarded and still queued), or the node that
    # received it ends it unstarted
    journal.EXPIRED: _Move(_S.FAILED, _S.sources(_S.FAILED), by_holder=False),
    journal.RETRYING: _Move(_S.RETRYING, _S.sources(_S.RETRYING)),
    journal.ESCALATED: _Move(_S.ESCALATED, _S.sources(_S.ESCALATED)),
}
#: Kinds that may open a task's log.
OPENING: Final = frozenset({journal.ANNOUNCED, journal.SCHEDULED, journal.DEFERRED})
#: Kinds that record, and change nothing: allowed anywhere (a refused change is logged, never
#: applied; a reset clears the monitor's checking state only).
NEUTRAL: Final = frozenset({journal.ILLEGAL_TRANSITION, journal.STALE_UPDATE, journal.RESET})


def _detail(message: LogMessage) -> dict[str, Any]:
    detail = message.detail
    return dict(detail) if isinstance(detail, Mapping) else {}


def _silent_round(message: LogMessage) -> bool:
    """A DEFERRED that announces a silent auction again as the next attempt."""
    return message.kind == journal.DEFERRED and "silent_rounds" in _detail(message)


def _will_retry(message: LogMessage) -> bool:
    """A TASK_FAILED written just before its RETRYING (the run failed; the task goes on)."""
    return message.kind == journal.TASK_FAILED and bool(_detail(message).get("will_retry"))


def _redelivered(message: LogMessage) -> bool:
    """A TASK_ACCEPTED of a message the broker delivered again to the node running it."""
    return message.kind == journal.TASK_ACCEPTED and bool(_detail(message).get("redelivered"))


_Found = tuple[str, str, list[int]]


@dataclass
class _Replay:
    """The task as its log so far says it is."""

    task_id: str
    state: str | None = None
    attempt: int = 0
    #: The node holding the current attempt (awarded or re-awarded to it), and by which message.
    holder: str | None = None
    holder_id: int | None = None
    #: The message that moved the task last, and the one that made it final.
    moved_by: int | None = None
    final_by: int | None = None
    #: attempt -> its candidates and the id of its ANNOUNCED.
    candidates: dict[int, tuple[frozenset[str], int]] = field(default_factory=dict)
    #: attempt -> node -> the id of its BID (in time).
    bidders: dict[int, dict[str, int]] = field(default_factory=dict)
    #: attempt -> the id of its AWARDED or NO_AWARD.
    decided: dict[int, int] = field(default_factory=dict)
    #: (node, attempt) -> the id of the message that awarded (or re-awarded) it.
    awarded: dict[tuple[str, int], int] = field(default_factory=dict)
    accepted: dict[tuple[str, int], int] = field(default_factory=dict)
    completed: dict[tuple[str, int], int] = field(default_factory=dict)
    violations: list[Violation] = field(default_factory=list)

    def report(self, found: _Found) -> None:
        rule, problem, ids = found
        self.violations.append(Violation(task_id=self.task_id, rule=rule, problem=problem,
                                         message_ids=[i for i in ids if i is not None]))

    # -- the rules, each returning what it found wrong (or None) -----------------------

    def _final(self, m: LogMessage) -> _Found | None:
        if self.state in states.FINAL_STATES:
            return ("final_is_final", f"{m.kind} after the task ended {self.state}",
                    [m.id, *([self.final_by] if self.final_by is not None else [])])
        return None

    def _attempt(self, m: LogMessage) -> _Found | None:
        if self.state is None:
            wanted = 1
        elif m.kind == journal.RETRYING or _silent_round(m):
            wanted = self.attempt + 1
            following = _detail(m).get("next_attempt", m.attempt)
            if following != m.attempt:
                return ("attempt_numbers", f"{m.kind} of attempt {m.attempt} names "
                        f"next_attempt {following}", [m.id])
        else:
            wanted = self.attempt
        if m.attempt != wanted:
            return ("attempt_numbers", f"{m.kind} carries attempt {m.attempt}; the task is at "
                    f"attempt {self.attempt or 'none'}, so it must carry {wanted}",
                    [m.id, *([self.moved_by] if self.moved_by is not None else [])])
        return None

    def _holder(self, m: LogMessage, node: str | None) -> _Found | None:
        if node is not None and node != self.holder:
            who = (f"the attempt is held by {self.holder}" if self.holder
                   else "no node holds the attempt")
            return ("holder_only", f"{m.kind} from {node}, but {who}",
                    [m.id, *([self.holder_id] if self.holder_id is not None else [])])
        return None

    def _bidder(self, m: LogMessage, node: str | None) -> _Found | None:
        bids = self.bidders.get(m.attempt, {})
        if node is None or node not in bids:
            announced = self.candidates.get(m.attempt, (frozenset(), None))[1]
            return ("award_to_bidder", f"{m.kind} to {node or 'no node'}, which did not bid "
                    f"in attempt {m.attempt} (bidders: {', '.join(sorted(bids)) or 'none'})",
                    [m.id, *([announced] if announced is not None else [])])
        return None

    def _once(self, m: LogMessage) -> _Found | None:
        earlier = self.decided.get(m.attempt)
        if earlier is not None:
            return ("one_award", f"a second award decision ({m.kind}) for attempt "
                    f"{m.attempt}", [m.id, earlier])
        return None

    def _run(self, m: LogMessage, *, open_run: bool = False) -> _Found | None:
        run = (m.node or "", m.attempt)
        if run not in self.accepted:
            return ("run_order", f"{m.kind} from {m.node or 'no node'} in attempt "
                    f"{m.attempt}, which it never accepted (no TASK_ACCEPTED before)", [m.id])
        if open_run and run in self.completed:
            return ("run_order", f"{m.kind} from {m.node} after its run completed "
                    f"(TASK_COMPLETED)", [m.id, self.completed[run]])
        return None

    def _lifecycle(self, m: LogMessage, move: _Move) -> _Found | None:
        if self.state is None and m.kind in OPENING:
            return None  # a new task: its row and first message are written together
        sources = move.sources
        if _silent_round(m):
            sources = frozenset({states.BIDDING})
        if self.state not in sources:
            allowed = ", ".join(sorted(sources)) or "nothing (it only opens a log)"
            return ("lifecycle", f"{m.kind} moves the task to {move.target} from "
                    f"{self.state}; allowed from {allowed}",
                    [m.id, *([self.moved_by] if self.moved_by is not None else [])])
        return None

    # -- the replay ---------------------------------------------------------------------

    def answer(self, m: LogMessage) -> None:
        """A BID or REFUSED: from a candidate; in time while the auction is open."""
        late = bool(_detail(m).get("late"))
        if not late and (found := self._final(m)):
            self.report(found)
            return
        listed, announced = self.candidates.get(m.attempt, (frozenset(), None))
        if m.node not in listed:
            self.report(("candidates_only", f"{m.kind} from {m.node}, not a candidate of "
                         f"attempt {m.attempt}" + ("" if announced is not None
                                                   else " (never announced)"),
                         [m.id, *([announced] if announced is not None else [])]))
            return
        if late:
            return
        if self.state != states.BIDDING or self.attempt != m.attempt:
            self.report(("bids_while_open", f"{m.kind} from {m.node} in time (not late) for "
                         f"attempt {m.attempt}, but the task is {self.state} at attempt "
                         f"{self.attempt}", [m.id, *([self.moved_by] if self.moved_by else [])]))
            return
        if m.kind == journal.BID and m.node is not None:
            self.bidders.setdefault(m.attempt, {})[m.node] = m.id

    def echo(self, m: LogMessage) -> None:
        """What a run reports without changing the task (it may have lost the task since)."""
        if m.kind == journal.RESENT:
            if (m.node or "", m.attempt) not in self.awarded:
                self.report(("holder_only", f"RESENT to {m.node}, which was never awarded "
                             f"attempt {m.attempt}", [m.id]))
            return
        found = self._run(m, open_run=m.kind == journal.PROGRESS_UPDATE)
        if found:
            self.report(found)

    def move(self, m: LogMessage, move: _Move) -> None:
        """A state change: check it, then apply it (so one bad message is reported once)."""
        if found := self._final(m):
            self.report(found)
            return
        detail = _detail(m)
        # The rules this kind must keep, in order: the first one broken is reported.
        checks: list[Callable[[], _Found | None]] = [lambda: self._attempt(m)]
        if m.kind == journal.REAWARDED:
            checks += [lambda: self._holder(m, detail.get("from")),
                       lambda: self._bidder(m, detail.get("to", m.node))]
        elif m.kind in (journal.AWARDED, journal.NO_AWARD):
            checks.append(lambda: self._once(m))
            if m.kind == journal.AWARDED and detail.get("outcome") != "fallback":
                checks.append(lambda: self._bidder(m, m.node))
        elif move.by_holder:
            checks.append(lambda: self._holder(m, m.node))
        if move.after_accepted:
            checks.append(lambda: self._run(m))
        checks.append(lambda: self._lifecycle(m, move))
        for check in checks:
            if found := check():
                self.report(found)
                break
        self._apply(m, move, detail)

    def _apply(self, m: LogMessage, move: _Move, detail: dict[str, Any]) -> None:
        run = (m.node or "", m.attempt)
        if m.kind == journal.ANNOUNCED:
            self.candidates[m.attempt] = (frozenset(detail.get("candidates") or ()), m.id)
        if m.kind in (journal.AWARDED, journal.NO_AWARD):
            self.decided.setdefault(m.attempt, m.id)
        if m.kind in (journal.AWARDED, journal.REAWARDED):
            self.holder = detail.get("to", m.node) if m.kind == journal.REAWARDED else m.node
            self.holder_id = m.id
            if self.holder is not None:
                self.awarded[(self.holder, m.attempt)] = m.id
        elif move.target in (states.BIDDING, states.RETRYING, states.DEFERRED, states.PENDING):
            self.holder = self.holder_id = None
        if m.kind == journal.TASK_ACCEPTED:
            self.accepted.setdefault(run, m.id)
        elif m.kind == journal.TASK_COMPLETED:
            self.completed.setdefault(run, m.id)
        self.state, self.attempt, self.moved_by = move.target, m.attempt, m.id
        if move.target in states.FINAL_STATES:
            self.final_by = m.id

    def read(self, m: LogMessage) -> bool:
        """Check one message; False when the rest of the log cannot be checked."""
        kind = m.kind
        if kind not in journal.KINDS:
            self.report(("known_kind", f"unknown kind {kind!r}", [m.id]))
            return True
        if kind in NEUTRAL:
            return True
        if self.state is None and kind not in OPENING:
            self.report(("announced_first", f"the log opens with {kind}, before any "
                         "ANNOUNCED, SCHEDULED or DEFERRED: nothing after it can be checked",
                         [m.id]))
            return False
        if kind in (journal.BID, journal.REFUSED):
            self.answer(m)
        elif kind in (journal.RESENT, journal.PROGRESS_UPDATE) or _will_retry(m) \
                or _redelivered(m):
            self.echo(m)
        elif kind == journal.WATCH_ESCALATED:
            if found := self._final(m):
                self.report(found)
        else:
            self.move(m, MOVES[kind])
        return True

    def end(self) -> None:
        """What the end of the log says: a completion is never without its verdict (both are
        written by one statement)."""
        if self.state == states.COMPLETED:
            self.report(("lifecycle", "TASK_COMPLETED without TASK_SUCCEEDED, OUTPUT_INVALID "
                         "or COST_EXCEEDED after it", [self.moved_by or 0]))


def check_task(task_id: str, messages: Iterable[LogMessage]) -> list[Violation]:
    """Every violation of the protocol in ``task_id``'s log (its messages in log order, i.e.
    by id); an empty list when it keeps the protocol. A log still in progress is fine: only
    what it holds so far is judged."""
    replay = _Replay(task_id)
    for message in messages:
        if not replay.read(message):
            return replay.violations
    replay.end()
    return replay.violations
