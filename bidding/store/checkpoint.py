"""SQLite's WAL checkpoints, taken by the sweeping node instead of by the writes that wait on them.

In WAL mode every commit appends the pages it changed to the ``-wal`` file, and a checkpoint
copies them back into the database file (and syncs both). SQLite runs one, by default, in the
commit that takes the log past 1,000 pages: about one write in a hundred then waited 10-20 ms
for it, on the paths a caller waits on (an award in ``.delay()``, a node's start and end of an
attempt; bench/bookkeeping.py: a start's p99 14-16 ms with it, 1.2-1.4 ms without).

So the store's connections checkpoint only past ``engine.WAL_BACKSTOP_FRAMES``, and the
node that sweeps the federation checkpoints as a phase of its sweep (``checkpoint``): a
``PASSIVE`` checkpoint, which copies what no reader still needs and never waits for a lock or
holds up a writer. The backstop keeps the log bounded when no node sweeps (callers announcing
with every node down): the commit that finds it full checkpoints as before.
"""

from __future__ import annotations

import os

from bidding.store.engine import engines, sqlite_path
from bidding.store.forkguard import child_safe_lock, guard

#: Each store file's log as this process's last checkpoint found it (modification time, size).
_seen: dict[str, tuple[int, int]] = {}
_lock = child_safe_lock()


def _wal_stamp(path: str) -> tuple[int, int] | None:
    """The ``-wal`` file's modification time and size, or None when there is none."""
    try:
        stat = os.stat(f"{path}-wal")
    except OSError:
        return None
    return (stat.st_mtime_ns, stat.st_size)


def checkpoint(url: str) -> int:
    """Copy the SQLite store's logged pages into its database file (a ``PASSIVE``
    checkpoint); return how many pages the log held (those written since the last complete
    checkpoint: the log starts over after one): 0 when it has not changed since this
    process's last checkpoint (no statement is run then), or when ``url`` is not a SQLite
    file. A reader or another checkpoint in the way is not waited for: the next call copies
    what this one could not."""
    path = sqlite_path(url)
    if path is None:
        return 0
    key = str(path)
    stamp = _wal_stamp(key)
    if stamp is None or _seen.get(key) == stamp:
        return 0
    # The engines (and the clock's reading, which takes the clock's lock and then the guard)
    # before the guard, as a session takes them.
    engine = engines(url).engine
    with _lock, guard.inside():  # one checkpoint of a store at a time in this process
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            try:
                # Outside a transaction (the connection is in autocommit mode: the engine's
                # BEGIN is SQLAlchemy's, not the driver's): a checkpoint inside one fails.
                cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
                row = cursor.fetchone()
                busy, logged = (row[0], row[1]) if row is not None else (1, 0)
            finally:
                cursor.close()
        finally:
            raw.close()
    if not busy:
        # The stamp from before: a write during the checkpoint (whose pages it may not have
        # copied) changes the file, and the next call copies again.
        _seen[key] = stamp
    return max(int(logged), 0)
