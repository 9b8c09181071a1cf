"""A SQLite store's database file read alone, its write-ahead log left out: what a checkpoint
has copied there (the checkpoint tests, unit and integration)."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bidding.store.engine import sqlite_path


@contextmanager
def database_file_alone(database_url: str, scratch: Path) -> Iterator[sqlite3.Connection]:
    """A connection to a copy, in ``scratch``, of the store's database file without its log;
    the copy is removed afterwards."""
    path = sqlite_path(database_url)
    assert path is not None, f"{database_url} is no SQLite store"
    alone = scratch / "alone.db"
    shutil.copyfile(path, alone)
    conn = sqlite3.connect(alone)
    try:
        yield conn
    finally:
        conn.close()
        for leftover in scratch.glob("alone.db*"):
            leftover.unlink()
