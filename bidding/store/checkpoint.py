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

#: Each store file's log as this process's last checkpoint found it: the ``-wal`` file's
#: stamp before it ran, whether it copied the whole log, and the pages the log held.
_last: dict[str, tuple[tuple[int, int], bool, int]] = {}
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
    checkpoint); return how many pages were logged since this process's last checkpoint: 0
    when nothing was (the ``-wal`` file unchanged since a checkpoint that copied the whole
    log: no statement is run then), or when ``url`` is not a SQLite file. A reader that may
    still need some of the log, or another checkpoint, is not waited for: the next call
    copies what this one could not, whether or not anything was written since."""
    path = sqlite_path(url)
    if path is None:
        return 0
    # SQLite keeps the log beside the file it opened: through a link, beside its target.
    key = os.path.realpath(path)
    stamp = _wal_stamp(key)
    last = _last.get(key)
    if stamp is None or (last is not None and last[0] == stamp and last[1]):
        return 0
    # The engines (and the clock's reading, which takes the clock's lock and then the guard)
    # before the guard, as a session takes them.
    engine = engines(url).engine
    with _lock, guard.inside():  # one checkpoint of a store at a time in this process
        raw = engine.raw_connection()
        try:
            cursor = raw.cursor()
            try:
                # Outside a transaction (the pool hands out its connections with none open,
                # and the driver opens none of its own here): a checkpoint inside one fails.
                cursor.execute("PRAGMA wal_checkpoint(PASSIVE)")
                row = cursor.fetchone()
            finally:
                cursor.close()
        finally:
            raw.close()
    # (busy, pages in the log, pages of it in the database file); busy: another checkpoint
    # ran, and the two counts are -1. A reader in the way is not "busy": it shows as fewer
    # pages copied than logged.
    busy, logged, copied = (int(row[0]), int(row[1]), int(row[2])) if row else (1, -1, -1)
    whole = not busy and copied == logged
    # The stamp from before: a write during the checkpoint changes the file, and the next
    # call copies again.
    _last[key] = (stamp, whole, max(logged, 0))
    # The log starts over once a checkpoint has copied all of it: after an incomplete one,
    # the pages counted then are still in it.
    before = last[2] if last is not None and not last[1] else 0
    return max(logged - before if logged >= before else logged, 0)
