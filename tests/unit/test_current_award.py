"""``bidding.current_award()``: the award a body runs under, read by the attempt's begin with
the task's row (no round trip of its own), set for the body only."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest

import bidding
from bidding.auction.bind import scored_values
from bidding.config import Settings
from bidding.execution import attempt as execution
from bidding.execution.current import running_under
from bidding.lifecycle import states as lifecycle
from bidding.models import Announcement, Bid, Score
from bidding.store import write_session
from bidding.store.schema import AnnouncementRow, BidRow
from tests.stored import add_announcement

NODE = "n1"


def _bid(task_id: str, node: str, proposal: str, attempt: int = 1) -> Bid:
    return Bid(task_id=task_id, node=node, attempt=attempt, capability=1, experience=0.5,
               load=0, confidence=0.9, proposal=proposal)


def awarded(settings: Settings, *, bids: dict[str, tuple[str, float]], winner: str,
            attempt: int = 1, **fields: Any) -> Announcement:
    """An announcement ASSIGNED to ``winner`` after an auction whose scored bids ``bids`` (node:
    (proposal, score)) are stored as the award stores them."""
    announcement = Announcement(task_id=str(uuid.uuid4()), task_name="t.noop", task_type="noop",
                                attempt=attempt, **fields)
    add_announcement(settings.database_url, announcement, lifecycle.ASSIGNED, list(bids),
                     attempt=attempt, assigned_node=winner,
                     awarded_at=announcement.announced_at,
                     winning_score=bids[winner][1] if winner in bids else None)
    scores = {node: Score(node=node, total=score) for node, (_, score) in bids.items()}
    with write_session(settings.database_url) as session:
        for node, (proposal, _) in bids.items():
            values = scored_values(_bid(announcement.task_id, node, proposal, attempt),
                                   scores, winner)
            session.add(BidRow(**values))
    return announcement


def test_begin_reads_the_winning_bids_proposal_and_score_with_the_tasks_row(
    settings: Settings,
) -> None:
    # given an auction that n1 won with its proposal, against another bid
    announcement = awarded(settings, bids={NODE: ("split by paragraphs", 0.8),
                                           "n2": ("split by sentences", 0.6)},
                           winner=NODE, budget=2.0, spent=0.5)
    # when n1 begins the attempt
    run = execution.begin(settings, announcement.task_id, 1, NODE)
    # then the award it runs under is its own bid's
    assert run.start is execution.Start.FIRST
    with running_under(run):
        award = bidding.current_award()
    assert award is not None
    assert (award.task_id, award.node, award.proposal, award.score, award.attempt,
            award.budget_left) == (announcement.task_id, NODE, "split by paragraphs", 0.8, 1, 1.5)


def test_a_redelivered_begin_reads_the_award_too(settings: Settings) -> None:
    # given an attempt that began on n1 and whose message came again after its worker died
    announcement = awarded(settings, bids={NODE: ("my way", 0.7)}, winner=NODE)
    execution.begin(settings, announcement.task_id, 1, NODE)
    # when it begins again
    run = execution.begin(settings, announcement.task_id, 1, NODE, redelivered=True)
    # then it runs under the same award
    assert run.start is execution.Start.REDELIVERED
    assert (run.proposal, run.score) == ("my way", 0.7)


def test_a_task_moved_to_the_next_best_bidder_runs_under_that_bidders_bid(
    settings: Settings,
) -> None:
    # given an auction n2 won, then moved to n1 (the next best) when n2 went offline
    announcement = awarded(settings, bids={"n2": ("fast", 0.9), NODE: ("careful", 0.6)},
                           winner="n2")
    with write_session(settings.database_url) as session:
        row = session.get(AnnouncementRow, announcement.task_id)
        assert row is not None
        row.assigned_node = NODE
    # when n1 begins it
    run = execution.begin(settings, announcement.task_id, 1, NODE)
    # then the award is n1's own bid, not the first winner's
    assert (run.proposal, run.score) == ("careful", 0.6)


def test_an_award_that_was_no_bids_has_no_proposal_or_score(settings: Settings) -> None:
    # given a task assigned with no bid of its node (a fallback award), and no budget
    announcement = awarded(settings, bids={}, winner=NODE)
    # when its node begins it
    run = execution.begin(settings, announcement.task_id, 1, NODE)
    # then its award says so
    with running_under(run):
        award = bidding.current_award()
    assert award is not None
    assert (award.proposal, award.score, award.budget_left) == ("", None, None)


def test_a_retry_sees_its_attempt_and_its_bid_and_the_budget_left_never_below_zero(
    settings: Settings,
) -> None:
    # given a second attempt whose first spent more than the budget
    announcement = awarded(settings, bids={NODE: ("second try", 0.5)}, winner=NODE,
                           attempt=2, budget=1.0, spent=1.25)
    # when it begins
    run = execution.begin(settings, announcement.task_id, 2, NODE)
    with running_under(run):
        award = bidding.current_award()
    # then
    assert award is not None
    assert (award.attempt, award.proposal, award.budget_left) == (2, "second try", 0.0)


def test_the_award_is_none_outside_the_body_and_after_it_even_when_it_raised(
    settings: Settings,
) -> None:
    announcement = awarded(settings, bids={NODE: ("p", 0.5)}, winner=NODE)
    run = execution.begin(settings, announcement.task_id, 1, NODE)
    assert bidding.current_award() is None
    with pytest.raises(RuntimeError), running_under(run):
        assert bidding.current_award() is not None
        raise RuntimeError("the body failed")
    assert bidding.current_award() is None


def test_the_award_is_immutable_and_other_threads_do_not_see_it(settings: Settings) -> None:
    announcement = awarded(settings, bids={NODE: ("p", 0.5)}, winner=NODE)
    run = execution.begin(settings, announcement.task_id, 1, NODE)
    seen: list[object] = []
    with running_under(run) as award:
        other = threading.Thread(target=lambda: seen.append(bidding.current_award()))
        other.start()
        other.join()
        with pytest.raises(AttributeError):
            award.proposal = "changed"  # type: ignore[misc]
    # a thread of a thread pool runs another task's body: it must not see this one's award
    assert seen == [None]


def test_on_postgresql_the_award_comes_in_the_begins_one_statement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sqlalchemy import event

    from bidding.store.engine import get_engine
    from tests.unit.conftest import postgres_database, psycopg_commands

    with postgres_database() as url:
        settings = Settings(database_url=url, auto_migrate=False)
        announcement = awarded(settings, bids={NODE: ("one trip", 0.75)}, winner=NODE)
        statements: list[str] = []
        event.listen(
            get_engine(url), "before_cursor_execute", lambda *args: statements.append(args[2])
        )
        sent = psycopg_commands(monkeypatch)
        # when the node begins the attempt
        run = execution.begin(settings, announcement.task_id, 1, NODE)
        # then one statement brought the task's row and its award
        assert len(statements) == 1 and sent == [], (statements, sent)
        assert (run.start, run.proposal, run.score) == (execution.Start.FIRST, "one trip", 0.75)


def _explained(state: str, result: dict[str, Any] | None, proposal: str | None) -> str:
    from bidding.observe.explain import Explanation

    return Explanation(
        task_id="t", task_name="t.noop", task_type="noop", state=state, strategy="weighted",
        required_skills=[], preferred_node=None, candidates=[NODE], winner=NODE,
        winning_score=0.8, outcome="awarded", closed_by="all bids in", error=None,
        announced_at=0.0, awarded_at=0.01, assignment_ms=10.0, bids=[], messages=[],
        proposal=proposal, result=result,
    ).render()


def test_explain_shows_the_proposal_next_to_what_the_body_did() -> None:
    returned = _explained("SUCCESS", {"value": {"parts": 3}}, "split by paragraphs")
    assert "  proposal: split by paragraphs\n  result: returned {'parts': 3}" in returned
    raised = _explained("FAILED", {"exception": {"exc_type": "ValueError",
                                                 "exc_module": "builtins",
                                                 "exc_message": ["no text"]}}, "my way")
    assert "  proposal: my way\n  result: raised ValueError: no text" in raised
    running = _explained("EXECUTING", None, "")
    assert "  proposal: (none)\n  result: (the body is running)" in running
    # a long result is cut in the text (whole in --json)
    long = _explained("SUCCESS", {"value": "x" * 500}, "p")
    assert f"  result: returned '{'x' * 199}... (502 characters)" in long
    # no winning bid (a task that failed before its award): no such lines
    assert "proposal:" not in _explained("FAILED", None, None)
