"""What a failed task leaves behind in a worker process is collected before the next task.

Celery keeps a failed (or retried) task's exception in a reference cycle with its tracer's
frame (the exception's traceback holds the frame; the frame holds the exception's info), and
billiard's copy of that traceback holds every frame's code positions: about half a megabyte
per failure in the chaos soak's pool processes. Python's cyclic collector frees such a cycle
only at a full collection, which a long-lived process runs once its long-lived objects grew by
a quarter: a node worker's pool process (about 170,000 objects after start-up) went through a
30-minute soak without one, growing by that half megabyte at every failed task.

So a worker process freezes what its start-up made (``gc.freeze``: never scanned again, as
Python's documentation advises for processes that fork), and once a task failed or was
retried there, a collection runs before the next task starts. With start-up frozen it scans
only what the tasks made since (well under a millisecond; a full collection of the unfrozen
process took about 50 ms). A task's own garbage in between is not touched: only failures
call for it.
"""

from __future__ import annotations

import gc
import threading

_failed = threading.Event()


def freeze_start_up() -> None:
    """Collect what start-up left, then keep every object alive now out of later collections
    (and run one over what is left, so that the collector counts from there)."""
    gc.collect()
    gc.freeze()
    gc.collect()


def task_failed() -> None:
    """A task failed or was retried in this process: collect before the next one starts."""
    _failed.set()


def before_task() -> bool:
    """Collect what the last failure left, if one happened since; True when it did."""
    if not _failed.is_set():
        return False
    _failed.clear()
    gc.collect()
    return True
