"""Each node's record on a task type (``nodes.records``): kept with its episodes on both
stores (lost attempts left out, a redelivered one counted once), filled from the episodes
already stored when a store is upgraded, and used to rank the nodes an auction asks when
there are more than its cap."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest
from sqlalchemy import select, text

from bidding.auction.candidates import prior_score, select_candidates
from bidding.config import Settings
from bidding.execution.episodes import record_attempt, record_episode
from bidding.models import Announcement
from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.kin import KinRecord
from bidding.nodes.profile import NodeProfile
from bidding.nodes.records import read_records
from bidding.nodes.registry import LiveNode
from bidding.store import upgrade, write_session
from bidding.store.schema import Node


def episode(task_id: str, node: str, task_type: str, success: bool,
            **extra: Any) -> dict[str, Any]:
    return {"task_id": task_id, "attempt": 1, "node": node, "task_type": task_type,
            "skills": ["x"], "success": success, "duration_s": 1.0, "cost": 0.0,
            "finished_at": 1000.0, **extra}


def test_a_nodes_record_on_each_task_type_is_kept_with_its_episodes(settings: Settings) -> None:
    # given two registered nodes
    for name in ("north", "south"):
        heartbeat(settings, NodeProfile(name=name, capabilities=["x"]))
    # when north finishes three extract attempts (two succeed) and one summary, one of them
    # is stored again (a redelivery), south loses one extract attempt with its worker
    with write_session(settings.database_url) as session:
        for task_id, task_type, ok in (("t1", "extract", True), ("t2", "extract", False),
                                       ("t3", "extract", True), ("t4", "summary", True)):
            record_attempt(session, None, episode(task_id, "north", task_type, ok))
        record_attempt(session, None, episode("t1", "north", "extract", True))
        record_episode(session, episode("t5", "south", "extract", False, lost=True))
    # then north's record on each type counts each attempt once
    assert read_records(settings, "extract", ["north", "south"]) == {"north": (3, 2)}
    assert read_records(settings, "summary", ["north", "south"]) == {"north": (1, 1)}
    assert read_records(settings, "extract", []) == {}
    # and the lost attempt counts in south's record (its trust) but not on the type
    with write_session(settings.database_url) as session:
        totals = {name: n for name, n in session.execute(select(Node.name, Node.attempts))}
    assert totals == {"north": 4, "south": 1}


def test_an_upgraded_store_fills_the_records_from_its_episodes(tmp_path: Any) -> None:
    # given a store at the revision before the records, with episodes stored
    url = f"sqlite:///{tmp_path}/old.db"
    upgrade(url, "0011")
    with write_session(url) as session:
        for task_id, node, ok, lost in (("t1", "north", True, False), ("t2", "north", False,
                                        False), ("t3", "north", False, True),
                                        ("t4", "south", True, False)):
            session.execute(text(
                "INSERT INTO bidding_episodes (task_id, attempt, node, task_type, skills, "
                "success, duration_s, cost, finished_at, lost) VALUES (:t, 1, :n, 'extract', "
                "'[]', :ok, 1.0, 0.0, 1000.0, :lost)"), {"t": task_id, "n": node, "ok": ok,
                                                          "lost": lost})
    # when it is upgraded
    upgrade(url)
    # then each node's record on the type counts its episodes but the lost one
    assert read_records(Settings(database_url=url), "extract", ["north", "south"]) == {
        "north": (2, 1), "south": (1, 1)}


def live(name: str, attempts: int = 50, successes: int = 45) -> LiveNode:
    return LiveNode(name=name, capabilities=("x",), capacity=4, price_per_unit=0.01,
                    latency_ms=50, trust=70, last_heartbeat=0.0, attempts=attempts,
                    successes=successes)


def test_the_best_half_of_a_large_federation_is_the_best_at_the_task_type() -> None:
    # given 32 equally skilled nodes with the same node-wide record (12 asked: 6 best, 6 drawn)
    announcement = Announcement(task_id="t", task_name="w", task_type="extract",
                                required_skills=["x"])
    nodes = [live(f"n{i:02d}") for i in range(32)]
    # and six of them with a strong record on this type, the others a poor one
    good = {f"n{i:02d}" for i in (3, 9, 14, 20, 27, 31)}
    typed = {n.name: (40, 39) if n.name in good else (40, 20) for n in nodes}
    asked_for: list[list[str]] = []

    def records(names: Any) -> dict[str, tuple[int, int]]:
        asked_for.append(list(names))
        return {n: typed[n] for n in names}

    for seed in range(20):
        # when the candidates are drawn
        chosen = select_candidates(announcement, nodes, random.Random(seed), records=records)
        # then the best half is the six that do this type well, every time
        assert set(chosen[:6]) == good and len(chosen) == 12
    # and the records were read for the eligible nodes
    assert asked_for[0] == [n.name for n in nodes]
    # and the type's record moves the node-wide one: good 0.7 + 0.3 * 0.9, poor 0.7 + 0.3 * 0.6
    assert prior_score(announcement, nodes[3], typed["n03"]) > prior_score(announcement, nodes[0])
    assert prior_score(announcement, nodes[0], typed["n00"]) < prior_score(announcement, nodes[0])


def test_a_replica_new_to_a_task_type_is_ranked_by_its_kins_record_there() -> None:
    # given 48 equally skilled nodes of two profiles (alike but the price; 14 asked, 7 by
    # rank): on this type, 12 veterans of the steady profile succeeded 36 of 40 times, 12 of
    # the flaky one 20 of 40, and 12 newcomers of each have no record of the type yet; the
    # steady veterans' four slots are all busy
    announcement = Announcement(task_id="t", task_name="w", task_type="extract",
                                required_skills=["x"])
    steady = [dataclasses.replace(live(f"steady-{i:02d}"), price_per_unit=0.02)
              for i in range(24)]
    flaky = [dataclasses.replace(live(f"flaky-{i:02d}"), price_per_unit=0.03)
             for i in range(24)]
    nodes = sorted(steady + flaky, key=lambda n: n.name)
    typed = {**{n.name: (40, 36) for n in steady[:12]}, **{n.name: (40, 20) for n in flaky[:12]}}
    busy = {n.name: n.capacity for n in steady[:12]}

    def records(names: Any) -> dict[str, tuple[int, int]]:
        return {n: typed[n] for n in names if n in typed}

    def loads(names: Any) -> dict[str, int]:
        return {n: busy[n] for n in names if n in busy}

    newcomers = {n.name for n in steady[12:]}
    for seed in range(20):
        # when the candidates are drawn
        chosen = select_candidates(announcement, nodes, random.Random(seed), records=records,
                                   loads=loads)
        # then every node asked by rank is a free newcomer of the steady profile: it is ranked
        # by its kin's record (about 0.9), a flaky newcomer by theirs (about 0.5), not both as
        # unknowns, and a busy steady veteran by its record times its slot share (4 / 5)
        assert len(chosen) == 14
        assert set(chosen[:7]) <= newcomers, chosen
    # and a steady newcomer ranks as its kin's rate on the type says
    kin = KinRecord(on_type=(12 * 40, 12 * 36), overall=(23 * 50, 23 * 45))
    assert prior_score(announcement, steady[20], None, kin) == pytest.approx(0.7 + 0.3 * 0.9)


def test_a_retry_ranks_the_replicas_of_the_nodes_it_left_out_by_their_record_there() -> None:
    # given two veterans of the steady profile that succeeded 190 of 200 times on this type
    # and the task failed on both (its retry leaves them out), 14 replicas of theirs new to
    # the type, and 16 nodes of another profile that succeeded 36 of 40 times each (30
    # eligible: 11 asked, 6 by rank)
    announcement = Announcement(task_id="t", task_name="w", task_type="extract",
                                required_skills=["x"], exclude_nodes=["steady-00", "steady-01"])
    steady = [dataclasses.replace(live(f"steady-{i:02d}"), price_per_unit=0.02)
              for i in range(16)]
    middling = [dataclasses.replace(live(f"middling-{i:02d}"), price_per_unit=0.03)
                for i in range(16)]
    typed = {**{n.name: (200, 190) for n in steady[:2]}, **{n.name: (40, 36) for n in middling}}
    asked_for: list[str] = []

    def records(names: Any) -> dict[str, tuple[int, int]]:
        asked_for.extend(names)
        return {n: typed[n] for n in names if n in typed}

    newcomers = {n.name for n in steady[2:]}
    for seed in range(20):
        # when the retry's candidates are drawn
        chosen = select_candidates(announcement, steady + middling, random.Random(seed),
                                   records=records)
        # then the veterans are not asked, and every node asked by rank is one of their
        # replicas, ranked by the veterans' record on the type (about 0.95), above the other
        # profile (0.90), not as unknowns by their node-wide record (0.87)
        assert len(chosen) == 11
        assert not {"steady-00", "steady-01"} & set(chosen)
        assert set(chosen[:6]) <= newcomers, chosen
    # and the veterans' records were read with the eligible nodes'
    assert {"steady-00", "steady-01"} <= set(asked_for)


def test_a_small_federation_never_reads_the_records() -> None:
    # given eight eligible nodes (the "auto" cap asks all of them)
    announcement = Announcement(task_id="t", task_name="w", task_type="extract",
                                required_skills=["x"])
    nodes = [live(f"n{i}") for i in range(8)]

    def records(names: Any) -> dict[str, tuple[int, int]]:
        raise AssertionError("read although every node is asked")

    # when the candidates are drawn, then every node is asked without a read (of the records,
    # or of the tasks in flight)
    assert select_candidates(announcement, nodes, random.Random(0), records=records,
                             loads=records) == [n.name for n in nodes]


def test_the_records_are_read_once_per_type_while_fresh_and_a_failed_read_ranks_without_them(
    monkeypatch: Any,
) -> None:
    # given an announcer's cache of the records, and a store that counts the reads
    from bidding.nodes import records

    records.invalidate_cache()
    reads: list[list[str]] = []

    def read(settings: Settings, task_type: str, nodes: Any) -> dict[str, tuple[int, int]]:
        reads.append(list(nodes))
        return {n: (10, 9) for n in nodes}

    monkeypatch.setattr(records, "read_records", read)
    settings = Settings(database_url="sqlite://", live_cache_seconds=60)
    # when auctions of one type ask for the records of some nodes, then of more
    assert records.records_of(settings, "extract", ["a", "b"]) == {"a": (10, 9), "b": (10, 9)}
    assert records.records_of(settings, "extract", ["b", "a"]) == {"a": (10, 9), "b": (10, 9)}
    assert set(records.records_of(settings, "extract", ["a", "c"])) == {"a", "b", "c"}
    # then the store was read for the first ones, then only for the node not yet read
    assert reads == [["a", "b"], ["c"]]

    # and when a read fails (the store unreachable), the nodes are ranked without records
    def failing(*_args: Any) -> dict[str, tuple[int, int]]:
        raise OSError("connection refused")

    monkeypatch.setattr(records, "read_records", failing)
    assert records.records_of(settings, "summary", ["a"]) == {}
    records.invalidate_cache()
