"""A task's attempts as explain and status show them, from its message log (pure)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bidding.observe.attempts import attempt_history


@dataclass
class M:
    kind: str
    attempt: int
    node: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def test_a_task_that_failed_once_then_succeeded_elsewhere() -> None:
    # given the log of a task whose first attempt raised on north and whose retry succeeded
    log = [M("ANNOUNCED", 1), M("AWARDED", 1, "north"), M("TASK_ACCEPTED", 1, "north"),
           M("RETRYING", 2, "north", {"error": "RuntimeError: boom", "delay_s": 1.0,
                                       "next_attempt": 2, "why": "retry 1 of 3"}),
           M("ANNOUNCED", 2), M("AWARDED", 2, "south"), M("TASK_ACCEPTED", 2, "south"),
           M("TASK_COMPLETED", 2, "south"), M("TASK_SUCCEEDED", 2, "south")]
    # then each attempt says where it ran and how it ended
    lines = [a.line() for a in attempt_history(log)]
    assert lines == ["#1 north: failed: RuntimeError: boom; retried in 1s",
                     "#2 south: succeeded"]


def test_a_winner_lost_mid_task_and_the_next_best_that_finished_it() -> None:
    # given an attempt re-awarded from a restarted worker's node to the next-best bidder
    log = [M("AWARDED", 1, "north"), M("TASK_ACCEPTED", 1, "north"),
           M("REAWARDED", 1, "south", {"from": "north", "to": "south",
                                       "reason": "worker north@h restarted"}),
           M("TASK_ACCEPTED", 1, "south"), M("TASK_SUCCEEDED", 1, "south")]
    # then one attempt shows both nodes and why the first lost it
    [attempt] = attempt_history(log)
    assert attempt.line() == ("#1 north -> south: succeeded "
                              "(lost: north: worker north@h restarted)")


def test_a_silent_round_and_a_final_failure_keep_their_reasons() -> None:
    # given an auction nobody answered, announced again, whose second round found no winner
    log = [M("ANNOUNCED", 1),
           M("DEFERRED", 2, None, {"reason": "none of 2 candidate(s) answered",
                                   "silent_rounds": 1}),
           M("ANNOUNCED", 2), M("NO_AWARD", 2, None, {"error": "No bids received: x"})]
    # then both attempts are shown, each with its own reason
    assert [a.line() for a in attempt_history(log)] == [
        "#1 -: no answer: none of 2 candidate(s) answered; announced again",
        "#2 -: no winner: No bids received: x"]
