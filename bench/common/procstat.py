"""CPU seconds and resident memory of process trees, and the machine's free memory, from /proc."""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterable
from pathlib import Path


def _children(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(c) for c in (task / "children").read_text().split()]
    return out


def process_tree(pids: Iterable[int]) -> list[int]:
    """The pids and all their descendants (prefork children)."""
    seen: list[int] = []
    stack = list(pids)
    while stack:
        pid = stack.pop()
        if pid not in seen:
            seen.append(pid)
            stack += _children(pid)
    return seen


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds of the processes (and their descendants) so far."""
    ticks = 0
    for pid in process_tree(pids):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def rss_mb(pids: Iterable[int]) -> float:
    """Resident memory of the processes and their descendants, MB."""
    total = 0
    for pid in process_tree(pids):
        with contextlib.suppress(OSError, IndexError, ValueError):
            text = Path(f"/proc/{pid}/status").read_text()
            total += int(text.split("VmRSS:")[1].split()[0])
    return total / 1024


def mem_available_mb() -> float:
    """MemAvailable of the machine, MB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return float("inf")


def self_cpu() -> float:
    """CPU seconds of this process (all threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime
