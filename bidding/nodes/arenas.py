"""How many malloc arenas a node worker's process uses (glibc only).

glibc gives each thread that allocates outside Python's own small-object allocator an arena of
its own, up to eight per core, and keeps what is freed in an arena for that arena's later use.
A node worker's main process runs a dozen threads when it holds the sweeper lease (its phases,
the heartbeat, the lease, the monitor, the retention look), and each kept a little of its own:
the sweeping node's main process was 1.5-2.5 MB larger than a standby's (81-82 MB against
79 MB, bench/RESULTS.md). Python's threads take turns under its global lock, so they gain
little from arenas of their own; capped at two (``bidding_malloc_arenas``) the sweeping node
measured 80 MB. ``MALLOC_ARENA_MAX`` and ``GLIBC_TUNABLES=glibc.malloc.arena_max=N`` in the
environment are glibc's own knobs for the same limit: when either is set, it is left as it
is. The pool processes forked after the cap inherit it.
"""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)

#: ``mallopt``'s parameter for the most arenas (glibc's malloc.h: ``M_ARENA_MAX``).
M_ARENA_MAX = -8


def glibc() -> bool:
    """Whether this process's C library is glibc (``mallopt`` elsewhere differs or is a stub)."""
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):  # no confstr (Windows), or no such name
        return False


def set_by_environment() -> bool:
    """Whether the environment sets glibc's arena limit itself."""
    return bool(os.environ.get("MALLOC_ARENA_MAX")
                or "malloc.arena_max" in os.environ.get("GLIBC_TUNABLES", ""))


def limit_arenas(arenas: int) -> bool:
    """Cap this process's malloc arenas at ``arenas`` (0: leave glibc's default). Call it
    before the threads it is for start: a thread keeps the arena it was given. True when the
    cap was set; False where it does not apply (0, not glibc, the environment's own limit)."""
    if arenas <= 0 or set_by_environment() or not glibc():
        return False
    import ctypes  # here: a process that caps nothing does not pay for the module

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(M_ARENA_MAX, arenas))
    if not done:
        logger.debug("mallopt(M_ARENA_MAX, %d) was refused", arenas)
    return done
