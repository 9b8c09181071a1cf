"""The cache of reads about named nodes (``store.covered``), which keeps an announcer's reads
of the nodes' records and loads: what a kept answer covers, how it grows, what a failed read
gives, and that forgetting the live nodes forgets every such cache."""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import SimpleNamespace

import pytest

from bidding.auction import loads
from bidding.config import Settings
from bidding.nodes import records, registry
from bidding.store import covered
from bidding.store.covered import CoveredCache


class Store:
    """A stand-in read that counts what it was asked, and fails when told to."""

    def __init__(self, values: Mapping[str, int]) -> None:
        self.values = dict(values)
        self.asked: list[list[str]] = []
        self.down = False

    def read(self, names: list[str]) -> dict[str, int]:
        self.asked.append(list(names))
        if self.down:
            raise ConnectionError("server closed the connection unexpectedly")
        return {n: self.values[n] for n in names if n in self.values}


def test_a_kept_answer_serves_the_names_it_covers_and_reads_only_the_others() -> None:
    # given a cache and a store where north has 3, south 1, and east nothing
    cache: CoveredCache[int] = CoveredCache("the loads")
    store = Store({"north": 3, "south": 1})
    # when north and east are asked for, then south and east, then all three
    first = cache.get("db", ["north", "east"], 60.0, store.read)
    second = cache.get("db", ["south", "east"], 60.0, store.read)
    third = cache.get("db", ["north", "south", "east"], 60.0, store.read)
    # then the store was read for north and east, then for south alone, then not at all; a
    # covered name without a value (east) is not read again
    assert store.asked == [["north", "east"], ["south"]]
    assert dict(first) == {"north": 3}
    assert dict(second) == dict(third) == {"north": 3, "south": 1}
    # and an answer cannot be changed by its reader
    with pytest.raises(TypeError):
        third["north"] = 0  # type: ignore[index]


def test_an_answer_older_than_its_age_is_read_again_and_a_grown_one_keeps_its_first_age(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # given an answer kept for 0.2 s, grown after 0.1 s by a name it did not cover
    clock = [1000.0]
    monkeypatch.setattr(covered, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    cache: CoveredCache[int] = CoveredCache("the loads")
    store = Store({"north": 3, "south": 1})
    cache.get("db", ["north"], 0.2, store.read)
    clock[0] += 0.1
    cache.get("db", ["south"], 0.2, store.read)
    # when both are asked for at 0.15 s, then at 0.25 s
    clock[0] += 0.05
    cache.get("db", ["north", "south"], 0.2, store.read)
    clock[0] += 0.1
    cache.get("db", ["north", "south"], 0.2, store.read)
    # then they are read afresh only the second time: growing the answer did not make it
    # younger
    assert store.asked == [["north"], ["south"], ["north", "south"]]


def test_a_read_keeps_what_was_changed_or_cleared_while_it_ran() -> None:
    # given a kept answer for north (3), and reads of south that, while they run, see this
    # process count an award on north, then clear every cache
    cache: CoveredCache[int] = CoveredCache("the loads")
    store = Store({"north": 3, "south": 1})
    cache.get("db", ["north"], 60.0, store.read)

    def read_while_awarding(names: list[str]) -> dict[str, int]:
        cache.change("db", "north", lambda count: (count or 0) + 1)
        return store.read(names)

    def read_while_clearing(names: list[str]) -> dict[str, int]:
        covered.clear_all()
        return store.read(names)

    # when south is read while north's award is counted
    answer = cache.get("db", ["north", "south"], 60.0, read_while_awarding)
    # then the award stays counted in what is given and kept
    assert dict(answer) == {"north": 4, "south": 1}
    assert dict(cache.get("db", ["north", "south"], 60.0, store.read)) == answer
    # and when east is read while every cache is cleared, the read's answer is given but not
    # kept: the next call reads afresh
    cache.get("db", ["north", "east"], 60.0, read_while_clearing)
    store.asked.clear()
    cache.get("db", ["north"], 60.0, store.read)
    assert store.asked == [["north"]]


def test_a_failed_read_gives_the_last_answer_or_none() -> None:
    # given a store that has gone down
    cache: CoveredCache[int] = CoveredCache("the loads")
    store = Store({"north": 3})
    store.down = True
    # when asked with nothing kept, then nothing is given and nothing raised
    assert dict(cache.get("db", ["north"], 60.0, store.read)) == {}
    # and when asked for a name a kept answer does not cover, the kept answer is given
    store.down = False
    cache.get("db", ["north"], 60.0, store.read)
    store.down = True
    assert dict(cache.get("db", ["north", "south"], 60.0, store.read)) == {"north": 3}


def test_a_change_is_seen_at_once_on_a_covered_name_only() -> None:
    # given an answer covering north (3) and east (nothing)
    cache: CoveredCache[int] = CoveredCache("the loads")
    store = Store({"north": 3})
    cache.get("db", ["north", "east"], 60.0, store.read)

    def one_more(count: int | None) -> int:
        return (count or 0) + 1

    # when this process awards one task to each of north, east and south
    for name in ("north", "east", "south"):
        cache.change("db", name, one_more)
    # then north and east count it without a read; south, never read, stays unknown
    assert dict(cache.get("db", ["north", "east"], 60.0, store.read)) == {"north": 4, "east": 1}
    assert len(store.asked) == 1


def test_many_keys_forget_the_oldest_half() -> None:
    # given a cache of at most four keys (task types) and five read in turn
    cache: CoveredCache[int] = CoveredCache("the records", most_keys=4)
    store = Store({"north": 3})
    for key in range(5):
        cache.get(key, ["north"], 60.0, store.read)
        time.sleep(0.001)  # each key read at a later time than the one before
    # when the first and the last are asked for again
    store.asked.clear()
    cache.get(0, ["north"], 60.0, store.read)
    cache.get(4, ["north"], 60.0, store.read)
    # then only the first, among the oldest, is read again
    assert store.asked == [["north"]]


def test_forgetting_the_live_nodes_forgets_the_records_and_loads_kept(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # given an announcer's kept records and loads (reads that count their calls)
    settings = Settings(database_url="sqlite:///unused.db", live_cache_seconds=60.0)
    reads: list[str] = []
    monkeypatch.setattr(records, "read_records",
                        lambda s, t, names: reads.append("records") or {})
    monkeypatch.setattr(loads, "in_flight_counts", lambda s, names: reads.append("loads") or {})
    records.records_of(settings, "extract", ["north"])
    loads.recent_loads(settings, ["north"])
    # when this process changes a node (``registry.invalidate_cache``, as a heartbeat does)
    registry.invalidate_cache()
    records.records_of(settings, "extract", ["north"])
    loads.recent_loads(settings, ["north"])
    # then both are read again
    assert reads == ["records", "loads", "records", "loads"]
