"""Hosts whose clocks disagree: a node worker whose clock runs 30 s ahead and one 30 s behind
(their wall clocks shifted by ``shifted_clock/sitecustomize.py``) beside honest ones, under load,
with the library's default timings. Every process keeps the store's time (``bidding.clock``),
so none sees a live node as dead or a running task as lost: nothing is re-awarded, nothing
runs twice, every node stays a candidate.

On PostgreSQL only: a SQLite store is one host's file, whose clock every process shares.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from bidding.nodes.registry import query_live_nodes
from bidding.store import read_session
from bidding.store.schema import Message
from tests.integration.app import shared
from tests.integration.conftest import ROOT, Cluster, store_cluster

pytestmark = pytest.mark.integration

SHIFTED_CLOCK = Path(__file__).with_name("shifted_clock")
NODES = {"north": ["shared"], "south": ["shared"], "ahead": ["shared"], "behind": ["shared"]}


def clock_off_by(seconds: int) -> list[str]:
    """The command prefix that runs a Python program with its wall clock ``seconds`` off."""
    return ["env", f"PYTHONPATH={SHIFTED_CLOCK}:{ROOT}", f"BIDDING_TEST_CLOCK_SHIFT={seconds}"]


@pytest.fixture(scope="module")
def skewed(redis_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("clocks")
    # The library's default heartbeat (2 s), not the faster one the other clusters use: the
    # comparisons under test are the ones users' nodes make.
    with store_cluster("postgresql", directory, nodes=NODES,
                       extra_env={"BIDDING_HEARTBEAT_INTERVAL": "2", "BIDDING_BID_MODE": "auto"},
                       prefix={"ahead": clock_off_by(30), "behind": clock_off_by(-30)}) as c:
        yield c


def test_nodes_whose_clocks_are_30s_off_work_beside_honest_ones(skewed: Cluster) -> None:
    # given four nodes, one whose clock is 30 s ahead and one 30 s behind, all live
    assert {n.name for n in query_live_nodes(skewed.settings)} == set(NODES)
    seen_live: list[set[str]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.wait(0.5):
            seen_live.append({n.name for n in query_live_nodes(skewed.settings)})

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    task_type = f"clocks-{uuid.uuid4().hex[:6]}"
    # when 60 tasks of half a second to a second arrive over about ten seconds, while every
    # node's sweepers judge heartbeats, closing times and start deadlines
    try:
        results = []
        for i in range(60):
            results.append(shared.apply_async((i, 0.5 + (i % 6) / 10),
                                              bidding={"task_type": task_type}))
            time.sleep(0.15)
        values = [r.get(timeout=90) for r in results]
        time.sleep(3)  # a few more sweeps over the finished tasks
    finally:
        stop.set()
        watcher.join()
    # then every task returned its own value, and ran exactly once
    assert [v["value"] for v in values] == list(range(60))
    assert [skewed.executions(r.id) for r in results] == [1] * 60
    # and the nodes with the wrong clocks won work too
    ran_on = Counter(v["node"] for v in values)
    assert {"ahead", "behind"} <= set(ran_on), ran_on
    # and no node ever looked dead to this (honest) caller
    assert seen_live and all(live == set(NODES) for live in seen_live), seen_live
    # and no task was taken from its winner, sent again or lost with a worker
    unwanted = {"REAWARDED", "RESENT", "WORKER_LOST", "DEFERRED", "ESCALATED"}
    with read_session(skewed.settings.database_url) as session:
        kinds = Counter(session.scalars(select(Message.kind).where(
            Message.task_id.in_([r.id for r in results]))))
        # (what each unwanted message says, and when, so that a failure names its path)
        said = [(m.task_id[:8], m.kind, m.node, m.attempt, round(m.at, 2), m.detail)
                for m in session.scalars(select(Message).where(
                    Message.task_id.in_([r.id for r in results]),
                    Message.kind.in_([*unwanted, "STALE_UPDATE"])).order_by(Message.id))]
    assert not unwanted & set(kinds), (kinds, said)
