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


def test_a_retry_says_which_node_it_left_out_and_why() -> None:
    # given a task whose first attempt failed on north, its retry announced to leave north out
    log = [M("ANNOUNCED", 1, None, {"candidates": ["north", "south"]}),
           M("AWARDED", 1, "north"), M("TASK_ACCEPTED", 1, "north"),
           M("RETRYING", 2, "north", {"error": "RuntimeError: boom", "delay_s": 1.0,
                                       "next_attempt": 2, "why": "retry 1 of 3"}),
           M("ANNOUNCED", 2, None, {"candidates": ["south"], "exclude_nodes": ["north"]}),
           M("AWARDED", 2, "south"), M("TASK_SUCCEEDED", 2, "south")]
    # when its attempts are read
    first, second = attempt_history(log)
    # then the retry names the node it left out, with the failure that put it out
    assert first.excluded == {}
    assert second.excluded == {"north": "it failed attempt #1: RuntimeError: boom"}


def test_a_node_left_out_but_the_only_one_capable_is_said_to_be_asked_all_the_same() -> None:
    # given a retry that was to leave north out, but north was the only capable node
    log = [M("AWARDED", 1, "north"),
           M("RETRYING", 2, "north", {"error": "RuntimeError: boom", "next_attempt": 2}),
           M("ANNOUNCED", 2, None, {"candidates": ["north"], "exclude_nodes": ["north"]})]
    # then the exclusion says it was asked anyway, and why
    assert attempt_history(log)[1].excluded == {
        "north": "it failed attempt #1: RuntimeError: boom; asked all the same: no other live "
                 "node could do it"}


def test_explain_shows_the_node_a_retry_left_out_in_its_report_and_its_json() -> None:
    # given the explanation of a task retried on south after failing on north
    from bidding.observe.explain import Explanation

    log = [M("AWARDED", 1, "north"),
           M("RETRYING", 2, "north", {"error": "RuntimeError: boom", "next_attempt": 2}),
           M("ANNOUNCED", 2, None, {"candidates": ["south"], "exclude_nodes": ["north"]}),
           M("AWARDED", 2, "south"), M("TASK_SUCCEEDED", 2, "south")]
    shown = Explanation(
        task_id="t", task_name="demo.tasks.work", task_type="work", state="SUCCESS",
        strategy="weighted", required_skills=["x"], preferred_node=None, candidates=["south"],
        winner="south", winning_score=0.9, outcome="awarded", closed_by="all bids",
        error=None, announced_at=0.0, awarded_at=0.1, assignment_ms=100.0, bids=[],
        messages=[], attempts=attempt_history(log), attempt=2)
    # when it is printed, and dumped as JSON (explain --json)
    text, data = shown.render(), shown.model_dump(mode="json")
    # then the report says under the retry which node it left out and why, as does the JSON
    assert ("    #2 south: succeeded\n"
            "      left out north: it failed attempt #1: RuntimeError: boom\n") in text
    assert data["attempts"][1]["excluded"] == {"north": "it failed attempt #1: RuntimeError: boom"}
