"""The protocol checker (pure): every legitimate path of a task's log passes, and each rule fails
on a log that breaks it, and on that rule alone."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from bidding.observe.checker import RULES, Violation, check_task

#: The checker's decision record, whose table lists every rule.
RULES_DOC = (Path(__file__).resolve().parents[2] / "docs" / "decisions"
             / "0016-protocol-checker.md")


@dataclass
class M:
    """One message as the store holds it (``id`` is given by ``log``)."""

    kind: str
    attempt: int = 1
    node: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    id: int = 0


def log(*messages: M) -> list[M]:
    """The messages in log order, numbered 1, 2, ... as the store's ids."""
    for i, m in enumerate(messages, start=1):
        m.id = i
    return list(messages)


def announced(attempt: int = 1, *candidates: str) -> M:
    return M("ANNOUNCED", attempt, detail={"candidates": list(candidates or ("north", "south"))})


def run(node: str, attempt: int = 1) -> list[M]:
    """A run that accepts, reports progress, completes and succeeds."""
    return [M("TASK_ACCEPTED", attempt, node), M("PROGRESS_UPDATE", attempt, node),
            M("TASK_COMPLETED", attempt, node), M("TASK_SUCCEEDED", attempt, node)]


def auction(winner: str = "north", attempt: int = 1, loser: str = "south") -> list[M]:
    """An auction on north and south: the winner bids, the loser refuses."""
    return [announced(attempt, winner, loser), M("BID", attempt, winner, {"late": False}),
            M("REFUSED", attempt, loser, {"late": False, "reason": "busy"}),
            M("AWARDED", attempt, winner, {"outcome": "awarded"})]


def happy() -> list[M]:
    return [*auction(), *run("north")]


def rules(violations: list[Violation]) -> list[str]:
    return [v.rule for v in violations]


# -- clean logs: every path the code takes ---------------------------------------------------

CLEAN: dict[str, list[M]] = {
    "auction and run": happy(),
    "late answers kept after the end": [*happy(), M("BID", 1, "south", {"late": True})],
    "retry after a failed run": [
        *auction(), M("TASK_ACCEPTED", 1, "north"),
        M("TASK_FAILED", 1, "north", {"error": "boom", "will_retry": True}),
        M("RETRYING", 2, "north", {"next_attempt": 2, "delay_s": 1.0, "error": "boom"}),
        *auction("south", 2, "north"), *run("south", 2)],
    "self.retry()": [
        *auction(), M("TASK_ACCEPTED", 1, "north"),
        M("RETRYING", 2, "north", {"next_attempt": 2, "why": "the task called self.retry()"}),
        *auction("south", 2, "north"), *run("south", 2)],
    "lost winner re-awarded to the next-best bidder": [
        announced(1, "north", "south"), M("BID", 1, "north"), M("BID", 1, "south"),
        M("AWARDED", 1, "north"), M("TASK_ACCEPTED", 1, "north"),
        M("REAWARDED", 1, "south", {"from": "north", "to": "south", "reason": "node lost"}),
        M("PROGRESS_UPDATE", 1, "north"),  # the lost run's body goes on: it changes nothing
        *run("south"),
        M("TASK_FAILED", 1, "north", {"error": "late", "will_retry": True}),
        M("STALE_UPDATE", 1, "north", {"wanted": "RETRYING"})],
    "lost winner with nobody left: a new auction": [
        *auction(), M("TASK_ACCEPTED", 1, "north"),
        M("RETRYING", 2, "north", {"next_attempt": 2, "delay_s": 0, "why": "lost"}),
        *auction("south", 2, "north"), *run("south", 2)],
    "undelivered and resent": [
        *auction(), M("SEND_FAILED", 1, "north"), M("RESENT", 1, "north"),
        M("WORKER_LOST", 1, "north"), M("RESENT", 1, "north"),
        M("TASK_ACCEPTED", 1, "north"), M("TASK_ACCEPTED", 1, "north", {"redelivered": True}),
        M("TASK_COMPLETED", 1, "north"), M("TASK_SUCCEEDED", 1, "north"),
        M("RESENT", 1, "north")],  # logged after a send that the node ran at once
    "deferred at submit, announced when a node came": [
        M("DEFERRED", 1, detail={"reason": "no live node", "deferrals": 1}),
        M("DEFERRED", 1, detail={"reason": "no live node", "deferrals": 2}), *happy()],
    "deferred too often: escalated, then reset": [
        M("DEFERRED", 1), M("DEFERRED", 1), M("ESCALATED", 1, detail={"reason": "deferred"}),
        M("RESET", 1), M("ILLEGAL_TRANSITION", 1)],
    "a silent auction announced again": [
        announced(1, "north"),
        M("DEFERRED", 2, detail={"silent_rounds": 1, "reason": "nobody answered"}),
        M("REFUSED", 1, "north", {"late": True, "failed": True}),
        *auction("north", 2), *run("north", 2)],
    "scheduled start": [M("SCHEDULED", 1, detail={"delay_s": 5}), *happy()],
    "no bids": [announced(1, "north"), M("REFUSED", 1, "north", {"reason": "no skill"}),
                M("NO_AWARD", 1, detail={"error": "No valid bids"})],
    "no candidate, fallback assignment": [
        M("ANNOUNCED", 1, detail={"candidates": []}),
        M("AWARDED", 1, "east", {"outcome": "fallback"}), *run("east")],
    "graph step stopped when its graph failed": [
        *auction(), M("TASK_ACCEPTED", 1, "north"),
        M("TASK_FAILED", 1, "north", {"error": "revoked: terminated", "revoked": True}),
        M("PROGRESS_UPDATE", 1, "north")],
    "graph step revoked before it started": [
        *auction(), M("TASK_FAILED", 1, "north", {"error": "revoked", "revoked": True})],
    "output invalid": [*auction(), M("TASK_ACCEPTED", 1, "north"),
                       M("TASK_COMPLETED", 1, "north"), M("OUTPUT_INVALID", 1, "north")],
    "budget overrun": [*auction(), M("TASK_ACCEPTED", 1, "north"),
                       M("COST_EXCEEDED", 1, "north")],
    "retry due after the deadline": [
        *auction(), M("TASK_ACCEPTED", 1, "north"),
        M("RETRYING", 2, "north", {"next_attempt": 2}), M("TASK_FAILED", 2)],
    "retry due after the expiry: ended by a sweeper": [
        *auction(), M("TASK_ACCEPTED", 1, "north"),
        M("RETRYING", 2, "north", {"next_attempt": 2}),
        M("EXPIRED", 2, detail={"error": "expired: ...", "state": "RETRYING"})],
    "expired while queued on its winner, then its message dropped there": [
        *auction(), M("EXPIRED", 1, detail={"error": "expired: ...", "state": "ASSIGNED"}),
        M("ILLEGAL_TRANSITION", 1, "north", {"wanted": "TASK_ACCEPTED"})],
    "expired on its node before the body": [
        *auction(), M("TASK_ACCEPTED", 1, "north"),
        M("EXPIRED", 1, "north", {"error": "expired: ..."})],
    "expired at the call": [M("SCHEDULED", 1, detail={"delay_s": 0}),
                            M("EXPIRED", 1, detail={"error": "expired: ..."})],
    "expired while deferred": [M("DEFERRED", 1), M("EXPIRED", 1, detail={"error": "x"})],
    "bid requests not sent": [announced(), M("TASK_FAILED", 1, detail={"error": "broker"})],
    "flagged by the monitor, then completed": [
        *auction(), M("TASK_ACCEPTED", 1, "north"), M("WATCH_ESCALATED", 1),
        M("RESET", 1), M("TASK_COMPLETED", 1, "north"), M("TASK_SUCCEEDED", 1, "north")],
    "a refused change before the task existed": [M("ILLEGAL_TRANSITION", 1, "north")],
}


@pytest.mark.parametrize("path", sorted(CLEAN))
def test_a_legitimate_path_keeps_the_protocol(path: str) -> None:
    # given the log a legitimate path writes; when it is checked; then nothing is wrong
    assert check_task("t", log(*CLEAN[path])) == []


# -- each rule, broken on its own --------------------------------------------------------------

def _without(messages: list[M], kind: str) -> list[M]:
    return [m for m in messages if m.kind != kind]


def _insert(messages: list[M], after_kind: str, extra: M) -> list[M]:
    at = next(i for i, m in enumerate(messages) if m.kind == after_kind) + 1
    return [*messages[:at], extra, *messages[at:]]


def _edit(messages: list[M], of: str, **changes: Any) -> list[M]:
    target = next(m for m in messages if m.kind == of)
    for key, value in changes.items():
        setattr(target, key, value)
    return messages


BROKEN: list[tuple[str, list[M]]] = [
    ("announced_first", _without(happy(), "ANNOUNCED")),
    ("known_kind", _insert(happy(), "AWARDED", M("HEARTBEAT", 1, "north"))),
    ("attempt_numbers", _edit(happy(), "TASK_SUCCEEDED", attempt=2)),
    ("attempt_numbers", [*auction(), M("TASK_ACCEPTED", 1, "north"),
                         M("RETRYING", 3, "north", {"next_attempt": 3})]),
    ("lifecycle", _without(happy(), "TASK_COMPLETED")),
    ("lifecycle", [*auction(), M("TASK_ACCEPTED", 1, "north"), M("TASK_COMPLETED", 1, "north")]),
    ("lifecycle", [*auction(), M("ANNOUNCED", 1, detail={"candidates": ["north"]})]),
    ("bids_while_open", [*auction(), M("BID", 1, "south", {"late": False}),
                         *run("north")]),
    ("candidates_only", _insert(happy(), "ANNOUNCED", M("BID", 1, "intruder"))),
    ("candidates_only", [announced(1), M("BID", 2, "north", {"late": True})]),
    ("one_award", _insert(happy(), "AWARDED", M("AWARDED", 1, "north"))),
    ("award_to_bidder", _edit(happy(), "BID", kind="REFUSED")),
    ("award_to_bidder", [announced(1, "north", "south"), M("BID", 1, "north"),
                         M("AWARDED", 1, "north"), M("TASK_ACCEPTED", 1, "north"),
                         M("REAWARDED", 1, "south", {"from": "north", "to": "south"})]),
    ("holder_only", _edit(happy(), "TASK_COMPLETED", node="south")),
    ("holder_only", _insert(happy(), "AWARDED", M("RESENT", 1, "south"))),
    ("holder_only", [announced(1, "north", "south"), M("BID", 1, "north"),
                     M("BID", 1, "south"), M("AWARDED", 1, "north"),
                     M("REAWARDED", 1, "south", {"from": "east", "to": "south"})]),
    ("run_order", _insert(happy(), "AWARDED", M("PROGRESS_UPDATE", 1, "north"))),
    ("run_order", [*happy(), M("PROGRESS_UPDATE", 1, "north")]),
    ("final_is_final", [*happy(), M("TASK_ACCEPTED", 1, "north")]),
    ("final_is_final", [*happy(), M("WATCH_ESCALATED", 1)]),
    ("final_is_final", [announced(1, "north"), M("NO_AWARD", 1),
                        M("BID", 1, "north", {"late": False})]),
]


@pytest.mark.parametrize(("rule", "messages"), BROKEN,
                         ids=[f"{rule}-{i}" for i, (rule, _) in enumerate(BROKEN)])
def test_each_rule_fails_on_its_own_bad_log(rule: str, messages: list[M]) -> None:
    # given a log that breaks one rule; when it is checked
    found = check_task("t", log(*messages))
    # then that rule, and only it, is reported, naming the task and the offending message
    assert rules(found) == [rule], [v.line() for v in found]
    assert found[0].task_id == "t"
    assert found[0].message_ids and all(1 <= i <= len(messages) for i in found[0].message_ids)


def test_every_rule_has_a_log_that_breaks_it() -> None:
    assert {rule for rule, _ in BROKEN} == set(RULES)


def test_a_violation_names_the_messages_involved() -> None:
    # given a second award in one attempt
    messages = log(*_insert(happy(), "AWARDED", M("AWARDED", 1, "north")))
    # then the report points at the second award and the first
    [violation] = check_task("t", messages)
    first = next(m.id for m in messages if m.kind == "AWARDED")
    assert violation.message_ids == [first + 1, first]
    assert violation.line() == (f"t one_award: a second award decision (AWARDED) for attempt 1 "
                                f"[messages {first + 1}, {first}]")


def test_a_log_without_an_opening_is_reported_once() -> None:
    # given a log whose announcement (and bids) are missing
    found = check_task("t", log(*[m for m in happy() if m.kind not in ("ANNOUNCED", "BID")]))
    # then one violation says so: the rest cannot be judged
    assert rules(found) == ["announced_first"]


def test_the_checkers_decision_record_lists_every_rule() -> None:
    text = RULES_DOC.read_text()
    listed = set(re.findall(r"^\| `([a-z_]+)` \|", text, flags=re.MULTILINE))
    assert set(RULES) <= listed
