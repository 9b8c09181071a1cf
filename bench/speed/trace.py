"""Switching bench/phases.py's timers in the workers on and off, and reading their counters.

The workers watch ``<trace dir>/control`` ("<generation> on|off") and, on every new generation,
write their cumulative counters to ``<trace dir>/<pid>.json`` (see bench/phases.py).
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def control(trace_dir: Path, generation: int, mode: str) -> None:
    """Ask every worker for ``mode`` ("on" or "off") and a snapshot tagged ``generation``."""
    tmp = trace_dir / "control.tmp"
    tmp.write_text(f"{generation} {mode}")
    # A rename, so that a worker never reads half a line.
    tmp.replace(trace_dir / "control")


def node_snapshots(trace_dir: Path, pids: Sequence[int], generation: int,
                   timeout: float = 10.0) -> dict[str, list[float]]:
    """Sum of every node's counters once all of them have dumped ``generation``."""
    deadline = time.monotonic() + timeout
    while True:
        found: dict[int, dict[str, Any]] = {}
        for pid in pids:
            with contextlib.suppress(OSError, ValueError):
                data = json.loads((trace_dir / f"{pid}.json").read_text())
                if data["generation"] == generation:
                    found[pid] = data["phases"]
        if len(found) == len(pids) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    total: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for phases in found.values():
        for key, (calls, seconds) in phases.items():
            total[key][0] += calls
            total[key][1] += seconds
    return dict(total)


def per_auction(after: dict[str, list[float]], before: dict[str, list[float]],
                auctions: int) -> dict[str, dict[str, float]]:
    """Calls and milliseconds per auction of each phase between two snapshots."""
    out = {}
    for key, (calls, seconds) in after.items():
        c0, s0 = before.get(key, [0, 0.0])
        if calls - c0:
            out[key] = {"per_auction": (calls - c0) / max(1, auctions),
                        "ms_per_auction": (seconds - s0) * 1000 / max(1, auctions)}
    return out
