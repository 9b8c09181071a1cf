"""Celery's canvas with bidding tasks, on real node workers: ``link``, ``link_error``, chains
and chords work as with plain tasks, and every task in them is auctioned (Redis broker; the
store on SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid

import pytest
from celery import chain, chord
from celery.result import AsyncResult
from sqlalchemy import select

import bidding
from bidding.errors import NoBidsError
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow
from tests.integration.app import failing, remember, shared, total
from tests.integration.conftest import NODES, Cluster, wait_for

pytestmark = pytest.mark.integration


def spec(cluster: Cluster, task_id: str) -> dict:
    with read_session(cluster.settings.database_url) as s:
        return s.scalars(select(AnnouncementRow.spec)
                         .where(AnnouncementRow.task_id == task_id)).one()


def test_a_chain_of_bidding_tasks_auctions_each_link(cluster: Cluster) -> None:
    # given a chain of two bidding tasks, the second taking the first's result
    # when the caller applies it and waits on the last
    result = chain(shared.s(3), shared.s()).apply_async()
    value = result.get(timeout=20)
    # then the second ran with the first's result, each on a node that won its auction
    first = result.parent.get(timeout=5)
    assert value["value"] == first and first["value"] == 3
    assert value["node"] in NODES and first["node"] in NODES
    for task_id in (result.id, result.parent.id):
        why = bidding.explain(task_id, app=cluster.app)
        assert why.state == "SUCCESS" and why.winner in NODES and why.bids
    # and the second knows the first as its parent and root (Flower's task tree)
    assert spec(cluster, result.id)["canvas"]["parent_id"] == result.parent.id
    assert spec(cluster, result.id)["canvas"]["root_id"] == result.parent.id


def test_link_runs_the_callback_with_the_result(cluster: Cluster) -> None:
    # given a callback signature with a known id
    callback = shared.s()
    callback.freeze()
    # when a bidding task is applied with link= and succeeds
    result = shared.apply_async((5,), link=callback)
    assert result.get(timeout=15)["value"] == 5
    # then the callback is auctioned and runs with that result
    done = AsyncResult(callback.id, app=cluster.app).get(timeout=15)
    assert done["value"] == {"node": result.get()["node"], "value": 5}
    assert cluster.executions(callback.id) == 1


def test_link_error_runs_when_the_task_fails_for_good(cluster: Cluster) -> None:
    # given an errback that records the id of the task that failed
    key = f"failed:{uuid.uuid4()}"
    # when a bidding task fails on its node (no retry policy)
    result = failing.apply_async(("boom",), link_error=remember.s(key))
    with pytest.raises(ValueError, match="boom"):
        result.get(timeout=15)
    # then the errback ran once, with its id
    assert wait_for(lambda: cluster.counters.lrange(key, 0, -1) == [result.id.encode()],
                    timeout=15), cluster.counters.lrange(key, 0, -1)


def test_link_error_runs_when_no_node_can_take_the_task(cluster: Cluster) -> None:
    # given an errback, and a task that needs a skill no live node offers
    key = f"failed:{uuid.uuid4()}"
    result = shared.apply_async((1,), bidding={"required_skills": ["quantum"]},
                                link_error=remember.s(key))
    # when the caller waits, then it gets the auction's error
    with pytest.raises(NoBidsError, match="quantum"):
        result.get(timeout=15)
    # and the errback ran, though no attempt did
    assert wait_for(lambda: cluster.counters.lrange(key, 0, -1) == [result.id.encode()],
                    timeout=15), cluster.counters.lrange(key, 0, -1)
    assert cluster.executions(result.id) == 0


def test_a_chord_of_bidding_tasks_runs_its_body_on_the_header_results(
    cluster: Cluster,
) -> None:
    # given a chord whose header and body are bidding tasks
    # when the caller applies it and waits on the body
    result = chord([shared.s(i) for i in range(4)])(total.s())
    value = result.get(timeout=30)
    # then the body summed the four header results, and ran once
    assert value["value"] == 0 + 1 + 2 + 3 and value["node"] in NODES
    assert cluster.executions(result.id) == 1
