"""A node worker's pool process does not keep what its failed tasks left behind, and shares
two malloc arenas among its threads.

Celery keeps each failed task's exception info in a reference cycle; without a full
collection (which a long-lived pool process runs rarely) a process that fails tasks grows by
about half a megabyte per failure (bidding/nodes/garbage.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bidding.nodes.arenas import glibc
from tests.integration.app import arenas, census, doomed
from tests.integration.conftest import Cluster, store_cluster

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def lone(redis_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One node worker (two pool processes) that alone can do the doomed work."""
    with store_cluster("sqlite", tmp_path_factory.mktemp("memory"),
                       nodes={"lone": ["doomed"]}) as cluster:
        cluster.counters.delete("doomed:pids")
        yield cluster


def test_a_pool_process_holds_nothing_of_the_tasks_that_failed_in_it(lone: Cluster) -> None:
    # given 30 tasks that failed on the node, one after another, in its two pool processes
    for n in range(30):
        with pytest.raises(ValueError, match=f"doomed {n}"):
            doomed.delay(n).get(timeout=15)
    # when a task then counts, in the pool process it runs in, the exception infos Celery
    # made for failed tasks that are still in memory (collecting nothing itself)
    seen = census.delay().get(timeout=15)
    # then that process ran several of the failures, and holds none of them but the last
    pids = [int(pid) for pid in lone.counters.lrange("doomed:pids", 0, -1)]
    assert len(pids) == 30
    assert pids.count(seen["pid"]) >= 5, f"few of the failures ran in process {seen}: {pids}"
    # (at most the last failure's, which the pool's loop still holds until the next result)
    assert seen["exception_infos"] <= 1, seen


@pytest.mark.skipif(not glibc(), reason="malloc arenas are glibc's")
def test_a_node_workers_processes_share_two_malloc_arenas(lone: Cluster) -> None:
    # given a node worker started with the library's defaults (bidding_malloc_arenas = 2,
    # no MALLOC_ARENA_MAX), whose main process capped its arenas before forking its pool
    # when a task in a pool process starts eight threads that allocate at once
    found = arenas.delay().get(timeout=15)
    # then they share the two arenas (glibc's default would give each its own)
    assert 1 <= found <= 2, found
