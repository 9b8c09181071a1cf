"""Retention through real node workers: ``bidding prune`` deletes what finished, keeps what
the nodes learned, and leaves the federation working."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

import bidding
from bidding.auction.history import gather_history
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow, Message
from tests.integration.app import failing, shared
from tests.integration.conftest import NODES, ROOT, Cluster, store_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def federation(redis_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with store_cluster("postgresql", tmp_path_factory.mktemp("retention")) as c:
        yield c


def count(cluster: Cluster, table: type) -> int:
    with read_session(cluster.settings.database_url) as session:
        return int(session.scalar(select(func.count()).select_from(table)) or 0)


def test_a_prune_keeps_what_the_nodes_learned_and_the_federation_works_on(
        federation: Cluster) -> None:
    # given tasks that ran on the nodes: a type every node failed twice (each sent to its
    # node: which node wins a failing type's next task follows the records, of its own and
    # of its kin), and one they did
    task_type = f"retention-{uuid.uuid4().hex[:6]}"
    for node in [*NODES, *NODES]:
        with pytest.raises(ValueError):
            failing.apply_async(("warm-up",), bidding={
                "preferred_node": node, "strategy": "preferred_only"}).get(timeout=30)
    done = [shared.apply_async((i,), bidding={"task_type": task_type}) for i in range(6)]
    assert [r.get(timeout=30)["value"] for r in done] == list(range(6))
    learned = {node: gather_history(federation.settings, node, "failing")
               for node in NODES}
    assert all(h.outcomes.count(False) == 2 for h in learned.values()), learned
    before = count(federation, AnnouncementRow)
    assert before >= 12
    # when everything finished is pruned from the command line
    run = subprocess.run(
        [sys.executable, "-m", "bidding.cli", "prune", "--older-than", "0s",
         "--database-url", federation.settings.database_url],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    # then it says what it deleted, and the store holds no task, bid or message any more
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"pruned {before} task(s)"), run.stdout
    assert count(federation, AnnouncementRow) == 0 and count(federation, Message) == 0
    # and every node still knows what it learned: the same history as before the prune
    assert {node: gather_history(federation.settings, node, "failing")
            for node in NODES} == learned
    # so a task of the type they keep failing still finds no confident bid
    result = failing.apply_async(("x",), bidding={"min_confidence": 0.9})
    with pytest.raises(bidding.NoBidsError, match="No bids met minimum confidence"):
        result.get(timeout=30)
    # and the federation works on: new tasks run and return their values
    again = [shared.apply_async((i,), bidding={"task_type": task_type}) for i in range(3)]
    assert [r.get(timeout=30)["value"] for r in again] == [0, 1, 2]


def test_a_dry_run_deletes_nothing(federation: Cluster, tmp_path: Path) -> None:
    # given a task that ran
    assert shared.delay("kept").get(timeout=30)["value"] == "kept"
    before = count(federation, AnnouncementRow)
    # when a dry run counts what a prune of everything finished would delete
    run = subprocess.run(
        [sys.executable, "-m", "bidding.cli", "prune", "--older-than", "0s", "--dry-run",
         "--database-url", federation.settings.database_url],
        capture_output=True, text=True, timeout=120, cwd=ROOT)
    # then it says so, and nothing went
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("would prune "), run.stdout
    assert count(federation, AnnouncementRow) == before
