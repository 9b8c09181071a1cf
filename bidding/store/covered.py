"""A short-lived cache of reads about named nodes, kept per key (a store, a task type).

An announcer ranks the nodes it asks by facts read from the store in one statement for many
nodes at once (their records on a task type, their tasks in flight), and keeps each answer for
``bidding_live_cache_seconds``, as it keeps the live nodes. The sets of nodes asked about differ
from one auction to the next (the eligible nodes depend on the skills and resources a task
needs), so an answer remembers the names it covered: a later call for names it did not cover
reads only those and adds them to it, and the answer keeps its first age. A read that fails
(the store busy, a dropped connection) gives the last answer, or none: these facts only rank
the nodes, and ranking them less well is better than failing the announcement.

Every cache made here is listed, so that ``clear_all`` forgets them all: a process that changed
a node (its heartbeat, its status) and the tests clear every cache of this kind at once, in
whatever layer it lives.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from bidding.store.forkguard import child_safe_lock

logger = logging.getLogger(__name__)

V = TypeVar("V")

#: Every cache of this kind in the process (weakly: a test's own cache may go), and the lock
#: that keeps a cache made in one thread from changing the set another is clearing.
_every: weakref.WeakSet[CoveredCache[Any]] = weakref.WeakSet()
_every_lock = child_safe_lock()


class CoveredCache(Generic[V]):
    """Per key: when read (monotonic), the names the reads covered, the answer (name to value;
    a name covered but without a value is missing from it)."""

    def __init__(self, what: str, *, most_keys: int = 1024) -> None:
        if most_keys < 2:
            raise ValueError(f"most_keys: {most_keys}, at least 2 (half are forgotten at once)")
        self.what = what  # for the log line of a failed read: "the nodes' records on a type"
        self.most_keys = most_keys
        self._entries: dict[Hashable, tuple[float, frozenset[str], Mapping[str, V]]] = {}
        # Counts the clears: a read that ran across one gives its answer but does not keep it.
        self._generation = 0
        # A pool process may take it (as the records' and loads' caches are module-level, it
        # lives as long as the process; a test's own cache leaves it behind, a few bytes).
        self._lock = child_safe_lock()
        with _every_lock:
            _every.add(self)

    def get(self, key: Hashable, names: Sequence[str], max_age: float,
            read: Callable[[list[str]], Mapping[str, V]]) -> Mapping[str, V]:
        """``names``' values under ``key``, at most ``max_age`` seconds old: the names a fresh
        answer does not cover are read (``read(missing)``) and added to it."""
        now = time.monotonic()
        with self._lock:
            cached = self._entries.get(key)
            generation = self._generation
        if cached is not None and now - cached[0] >= max_age:
            cached = None
        if cached is not None and cached[1].issuperset(names):
            return cached[2]
        missing = [n for n in names if cached is None or n not in cached[1]]
        try:  # outside the lock: other threads keep reading what is kept meanwhile
            found = read(missing)
        except Exception as exc:
            logger.debug("could not read %s (ranking by the last answer, or without): %s",
                         self.what, exc)
            return MappingProxyType({}) if cached is None else cached[2]
        with self._lock:
            if self._generation != generation:  # cleared while reading: give, do not keep
                return MappingProxyType({**(cached[2] if cached is not None else {}),
                                         **found})
            # Added to what is kept now, not to the copy taken before the read: a change
            # made meanwhile (an award counted) stays; the answer keeps its first age.
            current = self._entries.get(key)
            if current is not None and time.monotonic() - current[0] < max_age:
                entry = (current[0], current[1] | frozenset(missing),
                         MappingProxyType({**current[2], **found}))
                answer = entry[2]
            else:  # none kept, or it aged (or went) while this read ran: keep what was read
                entry = (now, frozenset(missing), MappingProxyType(dict(found)))
                answer = entry[2] if cached is None else MappingProxyType({**cached[2],
                                                                           **found})
            self._entries[key] = entry
            if len(self._entries) > self.most_keys:  # many keys (task types): forget the oldest
                for old in sorted(self._entries, key=lambda k: self._entries[k][0])[
                        :self.most_keys // 2]:
                    del self._entries[old]
        return answer

    def change(self, key: Hashable, name: str, update: Callable[[V | None], V]) -> None:
        """Replace ``name``'s value under ``key`` by ``update(value)``, if a kept answer covers
        it (what this process just did, seen at once rather than at the next read)."""
        with self._lock:
            cached = self._entries.get(key)
            if cached is None or name not in cached[1]:
                return
            values = dict(cached[2])
            values[name] = update(values.get(name))
            self._entries[key] = (cached[0], cached[1], MappingProxyType(values))

    def clear(self) -> None:
        """Forget every kept answer (and any being read now)."""
        with self._lock:
            self._entries.clear()
            self._generation += 1


def clear_all() -> None:
    """Forget the answers of every cache of this kind in the process."""
    with _every_lock:
        caches = list(_every)
    for cache in caches:
        cache.clear()
