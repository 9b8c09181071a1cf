"""Resources and warm models through real node workers: two GPU nodes of 16 GB and 48 GB of
GPU memory, four slots each. A node never holds more than it declares, a task no node could
hold fails at once naming the resource, and a node holding a task's model warm wins."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import bidding
from bidding.observe.nodes import node_views
from tests.integration.app import infer, load_big_model, warm_call
from tests.integration.conftest import Cluster, running_cluster, wait_for

pytestmark = pytest.mark.integration

GPUS = {"gpu16": 16, "gpu48": 48}


@pytest.fixture(scope="module")
def gpus(redis_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two nodes with the ``infer`` skill and four slots; gpu16 holds llama-3-8b warm."""
    directory: Path = tmp_path_factory.mktemp("resources")
    profiles = {name: f'warm = {json.dumps(["model:llama-3-8b"] if name == "gpu16" else [])}'
                      f"\n[resources]\ngpu_mem_gb = {gb}\ncpu = 4\n"
                for name, gb in GPUS.items()}
    with running_cluster(f"sqlite:///{directory}/store.db", directory, "redis",
                         nodes={name: ["infer"] for name in GPUS}, profiles=profiles,
                         capacity=4) as cluster:
        yield cluster


def spans(cluster: Cluster, key: str) -> list[tuple[str, float, float]]:
    """Where and when each recorded attempt ran."""
    return [tuple(json.loads(s)) for s in cluster.counters.lrange(f"spans:{key}", 0, -1)]


def most_at_once(runs: list[tuple[str, float, float]], node: str,
                 size: Callable[[float], float] = lambda _seconds: 1.0) -> float:
    """The most that the attempts on ``node`` held at the same time: attempts (by default),
    or what ``size`` says an attempt of so many seconds holds."""
    edges: list[tuple[float, float]] = []
    for n, began, ended in runs:
        if n == node:
            edges += [(began, size(ended - began)), (ended, -size(ended - began))]
    now = best = 0.0
    for _, step in sorted(edges):
        now += step
        best = max(best, now)
    return best


def test_a_task_no_node_could_hold_fails_at_once_naming_the_resource(gpus: Cluster) -> None:
    # given GPUs of 16 and 48 GB
    # when a task needing 64 GB is submitted
    result = infer.apply_async((uuid.uuid4().hex, 0.0),
                               bidding={"resources": {"gpu_mem_gb": 64}})
    # then it fails at once, saying what no node has
    with pytest.raises(Exception) as failed:
        result.get(timeout=20)
    assert "gpu_mem_gb 64" in str(failed.value)


def test_big_tasks_go_only_where_they_fit_and_no_node_ever_holds_more_than_it_has(
    gpus: Cluster,
) -> None:
    key = uuid.uuid4().hex
    # given four slots on each node
    # when six 20 GB tasks and six 10 GB tasks are submitted at once
    big = [infer.apply_async((key, 1.2), bidding={"resources": {"gpu_mem_gb": 20}})
           for _ in range(6)]
    small = [infer.apply_async((key, 0.8), bidding={"resources": {"gpu_mem_gb": 10}})
             for _ in range(6)]
    # then every one succeeds: the 20 GB ones all on the 48 GB node
    assert {r.get(timeout=60)["node"] for r in big} == {"gpu48"}
    assert {r.get(timeout=60)["node"] for r in small} <= set(GPUS)
    # and neither node ever ran more than its GPU memory holds: at most one 10 GB task at a
    # time on 16 GB, at most 48 GB of them at a time on 48 GB (two 20 GB, or 20+20+... )
    runs = spans(gpus, key)
    assert len(runs) == 12
    assert most_at_once(runs, "gpu16") <= 1
    assert most_at_once(runs, "gpu48") <= 4
    # (the 20 GB tasks run 1.2 s, the 10 GB ones 0.8 s: an attempt's length says its size)
    held = {node: most_at_once(runs, node, lambda seconds: 20.0 if seconds >= 1.0 else 10.0)
            for node in GPUS}
    assert held["gpu48"] <= 48 and held["gpu16"] <= 16, held


def test_a_node_holding_the_model_warm_wins_over_an_equal_cold_one(gpus: Cluster) -> None:
    key = uuid.uuid4().hex
    # given gpu16 holding llama-3-8b warm from its profile, gpu48 cold
    # when tasks asking for it warm are submitted one after another
    calls = [warm_call.apply_async((key,), bidding={"affinity": ["model:llama-3-8b"]})
             for _ in range(3)]
    nodes = [call.get(timeout=30)["node"] for call in calls]
    # then the warm node wins each, and explain says why
    assert nodes == ["gpu16"] * 3
    report = bidding.explain(calls[0].id, gpus.app).render()
    assert "warm wanted: model:llama-3-8b" in report and "x1.15 warm" in report, report
    assert "gpu16 now: cpu 4/4 free, gpu_mem_gb 16/16 free; warm: model:llama-3-8b" in report
    # and when a task body on gpu48 (the only node with 30 GB) marks another model warm
    loaded = load_big_model.delay(key, "model:mistral-7b").get(timeout=30)
    assert loaded["node"] == "gpu48" and "model:mistral-7b" in loaded["warm"]
    # then tasks asking for that model go to gpu48 from then on
    after = [warm_call.apply_async((key,), bidding={"affinity": ["model:mistral-7b"]})
             .get(timeout=30)["node"] for _ in range(3)]
    assert after == ["gpu48"] * 3
    # and the nodes' views show what each has, holds free and keeps warm
    views = {v.name: v for v in node_views(gpus.settings)}
    assert views["gpu48"].resources == {"gpu_mem_gb": 48, "cpu": 4}
    assert views["gpu48"].free == {"gpu_mem_gb": 48, "cpu": 4}
    assert "model:mistral-7b" in views["gpu48"].warm
    assert views["gpu16"].warm == ["model:llama-3-8b"]


def test_a_gpu_node_killed_mid_task_and_restarted_frees_what_its_attempts_held(
    gpus: Cluster,
) -> None:
    key = uuid.uuid4().hex
    # given two 20 GB tasks running on the 48 GB node (it holds 40 of its 48 GB)
    first = [infer.apply_async((key, 3.0), bidding={"resources": {"gpu_mem_gb": 20}})
             for _ in range(2)]
    assert wait_for(lambda: sum(v.reserved.get("gpu_mem_gb", 0) for v in node_views(
        gpus.settings) if v.name == "gpu48") == 40, timeout=20)
    # when its worker is SIGKILLed mid-task and started again a second later under its name
    started = gpus.federation.restart("gpu48", pause=1.0)
    gpus.federation.wait_registered(gpus.settings, "gpu48", started)
    # then the killed attempts hold nothing any more: both tasks run again and succeed, and
    # two more 20 GB tasks after them too, never more than 48 GB at once on the node
    more = [infer.apply_async((key, 0.5), bidding={"resources": {"gpu_mem_gb": 20}})
            for _ in range(2)]
    assert [r.get(timeout=90)["node"] for r in first + more] == ["gpu48"] * 4
    runs = [r for r in spans(gpus, key)]
    assert most_at_once(runs, "gpu48") <= 2, runs
    assert wait_for(lambda: all(not v.reserved.get("gpu_mem_gb") for v in node_views(
        gpus.settings)), timeout=20)
