"""Bidders' figures end to end: two nodes whose own bidders claim a confidence, a cost, a
duration and a token count (tests/integration/bidders.py: thrifty and lavish); the documented
cost-aware strategy (examples/strategies/cost_aware.py, registered as "cost_aware") reads
them; the store keeps them with the bids and the winners' episodes; and after the attempts
``bidding nodes`` shows each node's claims against what happened. Real worker processes on
Redis; the store on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from sqlalchemy import select

import bidding
from bidding.cli import main
from bidding.observe.status import task_status
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow, BidRow, Episode
from tests.integration.app import failing, shared
from tests.integration.bidders import LAVISH, THRIFTY
from tests.integration.conftest import Cluster, store_cluster

pytestmark = pytest.mark.integration

NODES = {"thrifty": ["estimates"], "lavish": ["estimates"]}
PROFILES = {name: f'bidder = "tests.integration.bidders:{name}"\nbidder_timeout_s = 2\n'
            for name in NODES}
#: Both nodes' price per unit (tests/integration/conftest.py's profiles): a task of one unit
#: costs this in the ledger.
PRICE = 0.01
ONLY_THEM = {"required_skills": ["estimates"]}


@pytest.fixture(scope="module")
def claimed(redis_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """thrifty and lavish, each with its own bidder, in the default bid mode ("auto"), on
    PostgreSQL (the claims' writes on both stores are tests/unit/test_figures.py's)."""
    with store_cluster("postgresql", tmp_path_factory.mktemp("figures"),
                       extra_env={"BIDDING_BID_MODE": "auto"}, nodes=NODES,
                       profiles=PROFILES) as c:
        yield c


def test_the_documented_cost_aware_strategy_reads_the_bidders_figures(
        claimed: Cluster) -> None:
    # given lavish, more confident (0.99) but wanting 5000 tokens, and thrifty (0.7, 300)
    # when two tasks are awarded by the documented strategy (a budget of 500 tokens)
    results = [shared.apply_async(("doc", 0.1), bidding={**ONLY_THEM, "strategy": "cost_aware"})
               for _ in range(2)]
    # then thrifty runs both: the strategy saw each bid's estimated tokens
    assert [r.get(timeout=20)["node"] for r in results] == ["thrifty", "thrifty"]
    # and explain shows each bid's estimates and metadata as its bidder gave them
    why = bidding.explain(results[0].id, app=claimed.app)
    bids = {b.node: b for b in why.bids}
    assert why.strategy == "cost_aware" and why.winner == "thrifty"
    assert (bids["lavish"].confidence, bids["lavish"].estimated_cost,
            bids["lavish"].estimated_duration_s) == (0.99, 0.001, 0.003)
    assert bids["lavish"].metadata["estimated_tokens"] == 5000
    assert bids["thrifty"].metadata["model"] == "small"
    assert "             estimates: cost 0.02, 0.5 s" in why.render()
    assert "  cost: estimated 0.0200 by the winning bid, actual 0.0100 (the ledger)" in \
        why.render()
    # and the store keeps them: on the bids, the task (the winner's estimate) and the episode
    with read_session(claimed.settings.database_url) as session:
        stored = {r.node: (r.estimated_cost, r.estimated_duration_s) for r in session.scalars(
            select(BidRow).where(BidRow.task_id == results[0].id))}
        task = session.get(AnnouncementRow, results[0].id)
        episode = session.scalars(select(Episode).where(Episode.task_id == results[0].id)).one()
    assert stored == {"thrifty": (0.02, 0.5), "lavish": (0.001, 0.003)}
    assert task is not None and task.estimated_cost == THRIFTY["estimated_cost"]
    assert (episode.node, episode.claimed_confidence, episode.estimated_cost,
            episode.estimated_duration_s) == ("thrifty", 0.7, 0.02, 0.5)
    # and status shows the estimated cost beside the actual one
    status = task_status(claimed.settings.database_url, results[0].id)
    assert (status.estimated_cost, status.actual_cost) == (0.02, pytest.approx(PRICE))


def test_bidding_nodes_shows_which_bidder_overstates(claimed: Cluster) -> None:
    # given thrifty's two successes above; when lavish, the most confident, wins three tasks
    # that fail and two that succeed
    confident = {**ONLY_THEM, "strategy": "highest_confidence",
                 "retry_policy": {"max_retries": 0}}
    for _ in range(3):
        with pytest.raises(ValueError):
            failing.apply_async(("boom",), bidding=confident).get(timeout=20)
    done = [shared.apply_async(("ok", 0.2), bidding=confident) for _ in range(2)]
    assert [r.get(timeout=20)["node"] for r in done] == ["lavish", "lavish"]
    # then `bidding nodes --json` compares each node's claims with its outcomes
    shown = CliRunner().invoke(main, ["nodes", "-A", "tests.integration.app", "--json"])
    assert shown.exit_code == 0, shown.output
    views = {n["name"]: n["calibration"] for n in json.loads(shown.output)}
    lavish, thrifty = views["lavish"], views["thrifty"]
    assert lavish["confidence_attempts"] == 5
    assert lavish["claimed_confidence"] == pytest.approx(LAVISH["confidence"])
    assert lavish["success_rate"] == pytest.approx(0.4)
    assert lavish["confidence_gap"] == pytest.approx(0.59)
    # (its cost: one unit at 0.01 each time, ten times its estimate)
    assert (lavish["cost_attempts"], lavish["actual_cost"]) == (5, pytest.approx(PRICE))
    assert lavish["cost_ratio"] == pytest.approx(PRICE / LAVISH["estimated_cost"])
    # (its durations: of the two successes only, each at least the 0.2 s the task slept)
    assert lavish["duration_attempts"] == 2 and lavish["actual_duration_s"] >= 0.2
    assert lavish["duration_ratio"] > 60
    assert thrifty["confidence_attempts"] == 2 and thrifty["success_rate"] == 1.0
    assert thrifty["confidence_gap"] == pytest.approx(-0.3)
    assert thrifty["cost_ratio"] == pytest.approx(0.5)
    # and the text table says the same, a line per node
    table = CliRunner().invoke(main, ["nodes", "-A", "tests.integration.app"])
    assert table.exit_code == 0, table.output
    assert "claims against outcomes" in table.output
    line = next(x for x in table.output.splitlines() if x.startswith("lavish ")
                and "+0.59" in x)
    assert "0.99" in line and "0.40" in line and "0.001" in line
