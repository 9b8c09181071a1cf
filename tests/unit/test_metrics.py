"""The federation's metrics are read from the store: counters from the message log (free-text
reasons become a few fixed labels) that retention never makes go down, gauges as the tasks
and nodes stand, in Prometheus' text format."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from bidding.config import Settings
from bidding.lifecycle import journal, reasons, retention, tallies
from bidding.lifecycle import states as lifecycle
from bidding.models import Announcement
from bidding.observe.metrics import registry
from bidding.store import read_session, write_session
from bidding.store.schema import Message
from tests.conftest import bury, ghost
from tests.stored import add_announcement


@pytest.mark.parametrize(("text", "label"), [
    ("No bidders registered for skills ['gpu']", "no_bidders"),
    ("No bids met minimum confidence (0.9)", "no_confident_bids"),
    ("Something nobody foresaw", "no_award"),
])
def test_a_no_award_error_becomes_one_of_a_few_outcomes(text: str, label: str) -> None:
    assert reasons.classify(text, reasons.NO_AWARD_RULES, reasons.NO_AWARD_OTHER) == label


@pytest.mark.parametrize(("text", "label"), [
    ("ValueError: doomed 17", "task_error"),
    ("deadline passed before the task could start", "deadline"),
    ("node north stopped heartbeating", "node_lost"),
    ("TimeLimitExceeded: hard time limit (5.0) exceeded", "timeout"),
    ("revoked: terminated (signal 15)", "revoked"),
    (None, "task_error"),
])
def test_a_failure_reason_becomes_one_of_a_few_labels(text: str | None, label: str) -> None:
    assert reasons.classify(text, reasons.FAILURE_RULES, reasons.FAILURE_OTHER) == label


def _task(settings: Settings, state: str, task_type: str, finished: float | None,
          log: list[tuple[str, str | None, dict[str, Any]]]) -> str:
    """A task in ``state`` with its message log (kind, node, detail)."""
    task_id = str(uuid.uuid4())
    add_announcement(settings.database_url,
                     Announcement(task_id=task_id, task_name="t.work", task_type=task_type,
                                  announced_at=1000.0),
                     state, [], finished_at=finished)
    with write_session(settings.database_url) as session:
        for kind, node, detail in log:
            session.add(Message(task_id=task_id, kind=kind, node=node, attempt=1,
                                detail=detail, at=1000.0))
    return task_id


def _samples(settings: Settings) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry(settings)).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_the_counters_say_what_the_log_holds_and_survive_its_pruning(settings: Settings) -> None:
    # given tasks that finished long ago: two awarded to north (one in 3 ms, one in 2.2 s),
    # one that no node could bid for, one re-awarded from a silent node to south and failed
    # there by its own error, one whose bid north refused for a skill
    old = time.time() - 10 * 86400
    awarded = {"outcome": "awarded", "latency_ms": 3.0}
    _task(settings, lifecycle.SUCCESS, "extract", old,
          [(journal.AWARDED, "north", awarded), (journal.TASK_SUCCEEDED, "north", {})])
    _task(settings, lifecycle.SUCCESS, "extract", old,
          [(journal.AWARDED, "north", {**awarded, "latency_ms": 2200.0}),
           (journal.RETRYING, "north", {"delay_s": 1}),
           (journal.TASK_SUCCEEDED, "north", {})])
    _task(settings, lifecycle.FAILED, "render", old,
          [(journal.NO_AWARD, None, {"error": "No bidders registered for skills ['gpu']"})])
    _task(settings, lifecycle.FAILED, "extract", old,
          [(journal.REFUSED, "north", {"reason": "no matching capability: task needs x"}),
           (journal.AWARDED, "east", awarded),
           (journal.REAWARDED, "south", {"reason": "node east stopped heartbeating"}),
           (journal.TASK_FAILED, "south", {"error": "ValueError: doomed 3"})])
    # and one running now, announced 30 s ago and not started
    running = _task(settings, lifecycle.ASSIGNED, "extract", None,
                    [(journal.AWARDED, "north", awarded)])
    with write_session(settings.database_url) as session:
        session.execute(Message.__table__.update().where(Message.task_id == running)
                        .values(at=time.time() - 30))
    from bidding.store.schema import AnnouncementRow
    with write_session(settings.database_url) as session:
        session.get(AnnouncementRow, running).announced_at = time.time() - 30
        session.get(AnnouncementRow, running).assigned_node = "north"
    # when Prometheus scrapes
    before = _samples(settings)
    # then the counters say so, each reason as its label
    # (the task running now was awarded too)
    awarded_extract = ("bidding_auctions_total", (("outcome", "awarded"), ("task_type", "extract")))
    assert before[awarded_extract] == 4
    assert before[("bidding_auctions_total", (("outcome", "no_bidders"),
                                              ("task_type", "render")))] == 1
    assert before[("bidding_awards_total", (("node", "north"),))] == 3
    assert before[("bidding_awards_total", (("node", "south"),))] == 1
    assert before[("bidding_reawards_total", (("reason", "node_offline"),))] == 1
    assert before[("bidding_retries_total", ())] == 1
    assert before[("bidding_task_failures_total", (("reason", "no_bidders"),))] == 1
    assert before[("bidding_task_failures_total", (("reason", "task_error"),))] == 1
    assert before[("bidding_task_failures_total", (("reason", "timeout"),))] == 0
    assert before[("bidding_bid_refusals_total", (("reason", "no_capability"),))] == 1
    # and the histogram counts every award, each in its bucket
    assert before[("bidding_assignment_seconds_count", ())] == 4
    assert before[("bidding_assignment_seconds_bucket", (("le", "0.005"),))] == 3
    assert before[("bidding_assignment_seconds_bucket", (("le", "2.5"),))] == 4
    assert before[("bidding_assignment_seconds_sum", ())] == pytest.approx(2.209)
    # and the gauges say what stands now
    assert before[("bidding_tasks_in_flight", (("node", "north"),))] == 1
    assert 29 < before[("bidding_oldest_unassigned_seconds", ())] < 60
    # when retention prunes the four finished tasks
    pruned = retention.prune(settings, older_than=86400)
    assert pruned.tasks == 4
    with read_session(settings.database_url) as session:
        assert session.query(Message).count() == 1
    # then every counter says the same (none goes down)
    after = _samples(settings)
    for key, value in before.items():
        if key[0].endswith(("_total", "_count", "_sum", "_bucket")):
            assert after[key] == pytest.approx(value), key
    # and pruning again adds nothing twice
    retention.prune(settings, older_than=86400)
    again = _samples(settings)
    assert {k: v for k, v in again.items() if "oldest" not in k[0]} == {
        k: v for k, v in after.items() if "oldest" not in k[0]}


def test_the_live_nodes_gauge_counts_heartbeating_nodes(settings: Settings) -> None:
    # given two live nodes
    ghost(settings, ["x"], "alpha")
    ghost(settings, ["x"], "beta")
    try:
        samples = _samples(settings)
        # then two are live, each with nothing in flight
        assert samples[("bidding_nodes_live", ())] == 2
        assert samples[("bidding_tasks_in_flight", (("node", "alpha"),))] == 0
        assert samples[("bidding_oldest_unassigned_seconds", ())] == 0
    finally:
        bury(settings, "alpha")
        bury(settings, "beta")


def test_the_tallies_of_an_empty_store_are_zero(settings: Settings) -> None:
    with read_session(settings.database_url) as session:
        counted = tallies.counters(session)
    assert counted[(f"{tallies.ASSIGNMENT}_count", ())] == 0
