"""``GET /metrics`` after real tasks through real node workers agrees with the store."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select

from bidding.api.app import create_app
from bidding.nodes.registry import query_live_nodes
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow
from tests.integration.app import broken, echo
from tests.integration.conftest import NODES, Cluster, store_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def nodes(redis_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The three test nodes on Redis, the store on SQLite."""
    with store_cluster("sqlite", tmp_path_factory.mktemp("metrics")) as cluster:
        yield cluster


def _scrape(client: TestClient) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    response = client.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    found: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = \
                sample.value
    return found


def test_the_metrics_after_real_tasks_agree_with_the_store(nodes: Cluster) -> None:
    # given twelve tasks that succeeded, three that failed by their own error and one that no
    # node could bid for, run by the node workers
    for n in range(12):
        echo.delay(n).get(timeout=30)
    for n in range(3):
        with pytest.raises(Exception, match=f"broken {n}"):
            broken.delay(f"broken {n}").get(timeout=30)
    with pytest.raises(Exception, match="No bidders registered"):
        echo.apply_async((0,), bidding={"required_skills": ["nobody_has_it"]}).get(timeout=30)
    # when Prometheus scrapes the API
    metrics = _scrape(TestClient(create_app(nodes.app)))
    # then the awards per node sum to the tasks the store says were awarded, node by node
    with read_session(nodes.settings.database_url) as session:
        by_node = dict(session.execute(
            select(AnnouncementRow.assigned_node, func.count())
            .where(AnnouncementRow.assigned_node.is_not(None))
            .group_by(AnnouncementRow.assigned_node)).all())
    awards = {dict(labels)["node"]: value
              for labels, value in metrics["bidding_awards_total"].items() if value}
    assert awards == by_node
    assert sum(awards.values()) == 15
    # and every award is in the histogram, and every auction is counted by outcome
    assert metrics["bidding_assignment_seconds_count"][()] == 15
    auctions = metrics["bidding_auctions_total"]
    assert sum(v for k, v in auctions.items() if dict(k)["outcome"] == "awarded") == 15
    assert sum(v for k, v in auctions.items() if dict(k)["outcome"] == "no_bidders") == 1
    failures = metrics["bidding_task_failures_total"]
    assert failures[(("reason", "task_error"),)] == 3
    assert failures[(("reason", "no_bidders"),)] == 1
    # and the live nodes are the registry's, with nothing left in flight
    assert metrics["bidding_nodes_live"][()] == len(query_live_nodes(nodes.settings)) == len(NODES)
    assert set(metrics["bidding_tasks_in_flight"].values()) == {0.0}
    assert metrics["bidding_oldest_unassigned_seconds"][()] == 0.0
