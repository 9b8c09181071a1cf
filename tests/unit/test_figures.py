"""Unit tests of bidders' figures and AITP metadata: ``BidResponse``'s estimates and bounded
metadata, how a bidder's answer carries them onto its bid, the built-in bidder's estimates,
the winner's claims copied onto its episode, the pure calibration of claims against outcomes,
the documented cost-aware strategy on real bids, and tags and ``created_by`` stored, listed
(``GET /aitp/tasks?tag=``, ``bidding tasks --tag``) and pruned with their tasks."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from bidding import BidResponse
from bidding.api.app import create_app
from bidding.auction.bid import NodeHistory
from bidding.auction.board import bid_row
from bidding.auction.response import InvalidResponse, judged
from bidding.cli import main
from bidding.config import Settings
from bidding.errors import ConfigurationError
from bidding.execution import attempt as execution
from bidding.lifecycle import states
from bidding.lifecycle.retention import prune
from bidding.models import METADATA_LIMIT, Announcement, Bid
from bidding.observe.calibration import Calibration, Claimed, calibrate
from bidding.observe.listing import list_tasks
from bidding.observe.status import task_status
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow, Episode, LedgerEntry, Tag
from bidding.strategies import resolver
from bidding.strategies.protocol import capabilities_of, run_select
from bidding.strategies.resolver import resolve_strategy
from tests.stored import add_announcement
from tests.unit.test_api import SINGLE, bluefin_beats, make_app
from tests.unit.test_bid import bid_of, make_rfp

REPO = Path(__file__).resolve().parents[2]
NODE = "n1"
PRICE = 0.5


def answer(**fields: Any) -> dict[str, Any]:
    """A bidder's answer as a dict: a bid with ``fields`` added."""
    return {"will_bid": True, "confidence": 0.8, "proposal": "p", "reasoning": "r", **fields}


# BidResponse: the new optional fields, checked at the boundary -----------------------------

def test_a_bid_response_carries_estimates_and_metadata() -> None:
    response = BidResponse(will_bid=True, confidence=0.9, proposal="p", reasoning="r",
                           estimated_cost=1.5, estimated_duration_s=30,
                           metadata={"estimated_tokens": 400, "model": "small"})
    assert (response.estimated_cost, response.estimated_duration_s) == (1.5, 30.0)
    assert response.metadata == {"estimated_tokens": 400, "model": "small"}
    # and each is optional: seed 001's four fields are still a whole answer
    bare = BidResponse(will_bid=True, confidence=0.9, proposal="p", reasoning="r")
    assert (bare.estimated_cost, bare.estimated_duration_s, bare.metadata) == (None, None, {})


@pytest.mark.parametrize(("fields", "says"), [
    ({"estimated_cost": -1}, "estimated_cost"),
    ({"estimated_duration_s": -0.5}, "estimated_duration_s"),
    ({"estimated_cost": float("nan")}, "estimated_cost"),
    ({"estimated_duration_s": float("inf")}, "estimated_duration_s"),
    ({"metadata": {"blob": "x" * METADATA_LIMIT}}, "metadata"),
    ({"metadata": {"ratio": float("nan")}}, "NaN"),
    ({"metadata": {"when": object()}}, "metadata"),
    ({"metadata": ["not", "an", "object"]}, "metadata"),
])
def test_a_bidder_answer_with_a_bad_figure_is_refused_naming_the_field(
        fields: dict[str, Any], says: str) -> None:
    # when a bidder answers with a negative, non-finite or oversized figure, then its answer
    # is invalid (the node refuses, saying why), and the reason names the field
    with pytest.raises(InvalidResponse, match=re.escape(says)):
        judged(bid_of(make_rfp()), answer(**fields), "pkg:fn", 1.0)


def test_metadata_over_the_limit_says_its_size_and_the_limit() -> None:
    with pytest.raises(InvalidResponse) as refused:
        judged(bid_of(make_rfp()), answer(metadata={"blob": "x" * 5000}), "pkg:fn", 1.0)
    assert f"at most {METADATA_LIMIT} are kept with a bid" in str(refused.value)
    assert "metadata: is 5011 bytes" in str(refused.value)
    # and the refusal does not repeat the value itself
    assert "xxxx" not in str(refused.value)


def test_a_bidders_figures_go_onto_its_bid() -> None:
    # given a built-in draft (cost 0.02 for one unit at REDFIN's price)
    draft = bid_of(make_rfp())
    assert draft.estimated_cost == pytest.approx(0.02) and draft.estimated_duration_s is None
    # when the bidder answers with estimates and metadata
    bid = judged(draft, answer(estimated_cost=3.0, estimated_duration_s=12.5,
                               metadata={"estimated_tokens": 900,
                                         "content_confidence": 0.1}), "pkg:fn", 2.0)
    # then the bid carries them, the bidder's metadata over the draft's, the draft's
    # confidence kept
    assert isinstance(bid, Bid)
    assert (bid.estimated_cost, bid.estimated_duration_s) == (3.0, 12.5)
    assert bid.metadata == {"content_confidence": 0.1, "estimated_tokens": 900,
                            "draft_confidence": draft.confidence}


def test_a_bidder_that_gives_no_estimate_keeps_the_drafts() -> None:
    draft = bid_of(make_rfp(units=3), NodeHistory(outcomes=(True, True), durations=(2.0, 4.0)))
    bid = judged(draft, BidResponse(will_bid=True, confidence=0.6, proposal="p",
                                    reasoning="r"), "pkg:fn", 2.0)
    assert isinstance(bid, Bid)
    assert (bid.estimated_cost, bid.estimated_duration_s) == (pytest.approx(0.06), 3.0)


def test_the_built_in_bidder_estimates_from_its_price_and_its_recent_successes() -> None:
    # given REDFIN (0.02 a unit) whose latest successes of the type took 1 s and 3 s
    history = NodeHistory(outcomes=(True, False, True), durations=(1.0, 3.0))
    # when it bids on a task of 5 units
    bid = bid_of(make_rfp(units=5), history)
    # then it estimates its price for the units, and the mean of those durations
    assert bid.estimated_cost == pytest.approx(0.1) == pytest.approx(bid.cost)
    assert bid.estimated_duration_s == 2.0
    # and without a success to go by, it does not guess a duration
    assert bid_of(make_rfp(), NodeHistory(outcomes=(False,))).estimated_duration_s is None


# Tags and created_by as call options ---------------------------------------------------

def test_tags_are_stripped_and_deduplicated_and_bad_ones_refused() -> None:
    assert make_rfp(tags=[" nightly ", "eu", "nightly"]).tags == ["nightly", "eu"]
    for tags, says in (([""], "non-empty"), (["x" * 65], "at most 64 characters"),
                       ([f"t{i}" for i in range(33)], "at most 32 tags")):
        with pytest.raises(ValueError, match=says):
            make_rfp(tags=tags)


def test_a_call_may_pass_tags_and_created_by(store_url: str) -> None:
    app = make_app(store_url, bidding_bid_mode="ask")
    with pytest.raises(ConfigurationError, match="tags"):
        app.tasks["t.extract"].apply_async(("u",), bidding={"tags": ["ok", ""]})
    with pytest.raises(ConfigurationError, match="created_by"):
        app.tasks["t.extract"].apply_async(("u",), bidding={"created_by": "x" * 300})


# The winner's claims onto its episode ----------------------------------------------------

def assigned_with_bid(settings: Settings, **bid: Any) -> Announcement:
    """A task ASSIGNED to NODE, whose winning bid (stored as the award stores it) claims
    ``bid``'s fields."""
    announcement = Announcement(task_id=str(uuid.uuid4()), task_name="t.noop", task_type="noop")
    add_announcement(settings.database_url, announcement, states.ASSIGNED, [NODE],
                     due_at=announcement.announced_at + 30, assigned_node=NODE,
                     awarded_at=announcement.announced_at)
    won = Bid(task_id=announcement.task_id, node=NODE, capability=1, experience=1, load=0,
              confidence=0.9, **bid)
    lost = won.model_copy(update={"node": "other", "confidence": 0.1, "estimated_cost": 99.0})
    with write_session(settings.database_url) as session:
        session.add(bid_row(won))
        session.add(bid_row(lost))
    return announcement


def episode_of(settings: Settings, task_id: str) -> Episode:
    with read_session(settings.database_url) as session:
        return session.scalars(select(Episode).where(Episode.task_id == task_id)).one()


def test_a_completed_attempt_keeps_its_bids_claims_on_its_episode(settings: Settings) -> None:
    # given a task whose winning bid claimed 0.9, a cost of 2 and 7 s
    announcement = assigned_with_bid(settings, estimated_cost=2.0, estimated_duration_s=7.0)
    # when its attempt runs and completes
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    execution.complete(settings, run, {"ok": 1})
    # then its episode keeps the winner's claims (not the other bid's) beside what happened
    ep = episode_of(settings, announcement.task_id)
    assert (ep.claimed_confidence, ep.estimated_cost, ep.estimated_duration_s) == (0.9, 2.0, 7.0)
    assert (ep.success, ep.cost) == (True, PRICE)


def test_a_failed_attempt_keeps_its_bids_claims_too(settings: Settings) -> None:
    announcement = assigned_with_bid(settings, estimated_cost=None, estimated_duration_s=3.0)
    run = execution.begin(settings, announcement.task_id, 1, NODE, PRICE)
    execution.fail(settings, run, ValueError("boom"))
    ep = episode_of(settings, announcement.task_id)
    assert (ep.success, ep.claimed_confidence, ep.estimated_cost,
            ep.estimated_duration_s) == (False, 0.9, None, 3.0)


# Calibration: claims against outcomes (pure) ---------------------------------------------

def test_calibration_of_no_claims_is_empty() -> None:
    assert calibrate([]) == Calibration()


def test_calibration_compares_each_claim_over_the_attempts_that_made_it() -> None:
    # given four attempts claiming 0.9 each, of which one succeeded; costs estimated on two
    attempts = [
        Claimed(success=True, cost=2.0, duration_s=10.0, claimed_confidence=0.9,
                estimated_cost=1.0, estimated_duration_s=5.0),
        Claimed(success=False, cost=2.0, duration_s=1.0, claimed_confidence=0.9,
                estimated_cost=1.0, estimated_duration_s=5.0),
        Claimed(success=False, cost=0.5, duration_s=1.0, claimed_confidence=0.9),
        Claimed(success=False, cost=0.5, duration_s=1.0, claimed_confidence=0.9),
    ]
    c = calibrate(attempts)
    # then it claimed 0.9 and delivered 0.25: it overstates by 0.65
    assert (c.confidence_attempts, c.claimed_confidence, c.success_rate) == (4, 0.9, 0.25)
    assert c.confidence_gap == pytest.approx(0.65)
    # and cost twice what it estimated, over the two attempts that estimated it
    assert (c.cost_attempts, c.estimated_cost, c.actual_cost, c.cost_ratio) == (2, 1.0, 2.0,
                                                                                 2.0)
    # and durations are compared on successes only (a failure says nothing of the work's)
    assert (c.duration_attempts, c.estimated_duration_s, c.actual_duration_s,
            c.duration_ratio) == (1, 5.0, 10.0, 2.0)


def test_calibration_has_no_ratio_against_a_zero_estimate() -> None:
    c = calibrate([Claimed(success=True, cost=1.0, duration_s=1.0, estimated_cost=0.0)])
    assert (c.cost_attempts, c.estimated_cost, c.cost_ratio) == (1, 0.0, None)
    assert c.confidence_attempts == 0 and c.confidence_gap is None


# The documented cost-aware strategy, run as its guide shows it (docs/guides/bidding.md) -----

def guide_block(after: str) -> str:
    """The first ```python block of the strategies' guide after the line ``after``."""
    text = (REPO / "docs" / "guides" / "bidding.md").read_text()
    start = text.index(after)
    return text[start:].split("```python\n", 1)[1].split("```", 1)[0]


def test_the_guides_cost_aware_strategy_is_the_example_file() -> None:
    shown = guide_block("**A strategy that reads the bidders' figures.**")
    assert shown == (REPO / "examples/strategies/cost_aware.py").read_text().split(
        '"""\n\n', 1)[1]


def test_the_cost_aware_strategy_picks_the_most_confident_affordable_bid(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # given the guide's code, run as it is (it registers "cost_aware", here in a private
    # copy of the registry: no other test sees the name)
    monkeypatch.setattr(resolver, "STRATEGIES", dict(resolver.STRATEGIES))
    exec(compile(guide_block("**A strategy that reads the bidders' figures.**"), "guide",
                 "exec"), {"__name__": "readme_example"})
    strategy = resolve_strategy("cost_aware")
    # and real bids: built-in drafts judged by bidders that report their tokens
    rfp = make_rfp()
    greedy = judged(bid_of(rfp), answer(confidence=0.99, metadata={"estimated_tokens": 5000}),
                    "pkg:greedy", 1.0)
    modest = judged(bid_of(rfp).model_copy(update={"node": "modest"}),
                    answer(confidence=0.7, metadata={"estimated_tokens": 300}), "pkg:modest",
                    1.0)
    silent = bid_of(rfp).model_copy(update={"node": "silent", "confidence": 0.6})
    bids = [b for b in (greedy, modest, silent) if isinstance(b, Bid)]
    # when it selects, then the most confident bid within 500 tokens wins (a bid without an
    # estimate counts as 0 tokens)
    won = run_select(strategy, bids, rfp, capabilities_of(bids))
    assert won is not None and won.node == "modest"
    # and when none is affordable, the most confident of all
    only = [greedy] if isinstance(greedy, Bid) else []
    assert asyncio.run(strategy.select(only, rfp, {})) is greedy  # type: ignore[misc]


# Tags stored, listed, pruned; created_by and the costs shown -----------------------------

@pytest.fixture
def tagging(store_url: str) -> Celery:
    bluefin_beats(store_url)
    return make_app(store_url, bidding_bid_mode="ask")


def test_tasks_are_listed_by_tag_with_who_created_them(tagging: Celery, store_url: str
                                                      ) -> None:
    # given three calls, two tagged "nightly", one created by "ops"
    extract = tagging.tasks["t.extract"]
    a = extract.apply_async(("a",), bidding={"tags": ["nightly", "eu"], "created_by": "ops"})
    b = extract.apply_async(("b",), bidding={"tags": ["nightly"]})
    c = extract.apply_async(("c",), bidding={"tags": ["adhoc"]})
    # when the tasks tagged "nightly" are listed, then they are those two, newest first
    found = list_tasks(store_url, tag="nightly")
    assert [t.task_id for t in found] == [b.id, a.id]
    assert (found[1].tags, found[1].created_by) == (["eu", "nightly"], "ops")
    assert [t.task_id for t in list_tasks(store_url)] == [c.id, b.id, a.id]
    assert list_tasks(store_url, tag="none") == []
    # and `bidding status` shows a task's tags and creator
    status = task_status(store_url, a.id)
    assert (status.tags, status.created_by) == (["eu", "nightly"], "ops")
    assert "  tags: eu, nightly  created by: ops" in status.render()
    # and `bidding tasks --tag` lists them
    shown = CliRunner().invoke(main, ["tasks", "--database-url", store_url, "--tag", "nightly",
                                      "--json"])
    assert shown.exit_code == 0, shown.output
    assert [t["task_id"] for t in json.loads(shown.output)] == [b.id, a.id]
    text = CliRunner().invoke(main, ["tasks", "--database-url", store_url, "--tag", "adhoc"])
    assert c.id in text.output and a.id not in text.output


def test_the_api_lists_tasks_by_tag(tagging: Celery) -> None:
    client = TestClient(create_app(tagging))
    # given a definition tagged "paper" by "alice", and a plain call tagged otherwise
    created = client.post("/aitp/tasks", json={
        **SINGLE, "created_by": "alice", "metadata": {"tags": ["paper", "q3"]}})
    assert created.status_code == 201, created.text
    graph_id = created.json()["task_id"]
    tagging.tasks["t.extract"].apply_async(("x",), bidding={"tags": ["other"]})
    # when GET /aitp/tasks?tag=paper, then only the definition's subtask, naming its graph
    listed = client.get("/aitp/tasks", params={"tag": "paper"})
    assert listed.status_code == 200, listed.text
    [task] = listed.json()
    assert (task["graph_id"], task["tags"], task["created_by"]) == (graph_id, ["paper", "q3"],
                                                                    "alice")
    assert len(client.get("/aitp/tasks").json()) == 2
    assert client.get("/aitp/tasks", params={"tag": "nope"}).json() == []
    # and the graph's own view shows its tags and creator
    shown = client.get(f"/aitp/tasks/{graph_id}").json()
    assert (shown["tags"], shown["created_by"]) == (["paper", "q3"], "alice")
    # and a bad filter is a 422 naming it
    bad = client.get("/aitp/tasks", params={"limit": 0})
    assert bad.status_code == 422 and "limit" in bad.text


def test_a_task_shows_its_estimated_and_actual_cost(tagging: Celery, store_url: str) -> None:
    # given a task awarded on a bid that estimated 0.3, charged 0.25 and 0.125 since
    task_id = tagging.tasks["t.extract"].apply_async(("a",)).id
    with write_session(store_url) as session:
        session.execute(update(AnnouncementRow).where(AnnouncementRow.task_id == task_id)
                        .values(estimated_cost=0.3))
        for attempt, total in ((1, 0.25), (2, 0.125)):
            session.add(LedgerEntry(task_id=task_id, attempt=attempt, node="bluefin", units=1,
                                    price_per_unit=total, total=total, at=1.0))
    # when it is read, then both costs are there
    client = TestClient(create_app(tagging))
    shown = client.get(f"/aitp/tasks/{task_id}").json()
    assert (shown["estimated_cost"], shown["actual_cost"]) == (0.3, 0.375)
    assert [e["total"] for e in shown["ledger"]] == [0.25, 0.125]
    assert "cost so far: 0.3750 of budget - (estimated 0.3000 by the winning bid)" in \
        task_status(store_url, task_id).render()
    assert list_tasks(store_url)[0].actual_cost == 0.375


def test_a_prune_deletes_a_tasks_tags_with_it(settings: Settings) -> None:
    # given a finished task with two tags
    announcement = Announcement(task_id=str(uuid.uuid4()), task_name="t.noop", task_type="noop",
                                tags=["a", "b"])
    add_announcement(settings.database_url, announcement, states.SUCCESS, [],
                     finished_at=1.0)
    with write_session(settings.database_url) as session:
        session.add_all([Tag(task_id=announcement.task_id, tag=t) for t in announcement.tags])
    # when the store is pruned of what finished before now
    dry = prune(settings, 0.0, dry_run=True)
    pruned = prune(settings, 0.0)
    # then the task went with its tags, counted
    assert (dry.tags, pruned.tasks, pruned.tags) == (2, 1, 2)
    assert "1 task(s) (0 bid(s), 2 tag(s)" in pruned.line()
    with read_session(settings.database_url) as session:
        assert session.scalar(select(func.count()).select_from(Tag)) == 0


def test_a_task_graphs_ledger_lists_its_subtasks_entries_with_the_budget_left(
        tagging: Celery, store_url: str) -> None:
    client = TestClient(create_app(tagging))
    # given a one-step definition with a cost limit of 1, whose subtask was charged twice
    created = client.post("/aitp/tasks", json={**SINGLE, "metadata": {"cost_limit": 1.0}})
    assert created.status_code == 201, created.text
    graph_id = created.json()["task_id"]
    [step] = list_tasks(store_url)
    with write_session(store_url) as session:
        session.execute(update(AnnouncementRow).where(AnnouncementRow.task_id == step.task_id)
                        .values(estimated_cost=0.2))
        for attempt, total, at in ((1, 0.25, 1.0), (2, 0.5, 2.0)):
            session.add(LedgerEntry(task_id=step.task_id, attempt=attempt, node="bluefin",
                                    units=1, price_per_unit=total, total=total, at=at))
    # when the task is read, then its ledger lists both entries, each with the budget left
    shown = client.get(f"/aitp/tasks/{graph_id}").json()
    assert [(e["step_id"], e["attempt"], e["total"], e["remaining_budget"])
            for e in shown["ledger"]] == [("task", 1, 0.25, 0.75), ("task", 2, 0.5, 0.25)]
    assert (shown["remaining_budget"], shown["actual_cost"], shown["estimated_cost"]) == (
        0.25, 0.75, 0.2)
    # and `bidding status` on the graph shows the same
    text = CliRunner().invoke(main, ["status", graph_id, "--database-url", store_url]).output
    assert "cost: 0.7500 of limit 1 (0.2500 left)  estimated: 0.2000" in text
    assert "    task           attempt 2 on bluefin: 1 units x 0.5 = 0.5000  (0.2500 of the " \
           "budget left)" in text
