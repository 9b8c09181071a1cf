"""Every run of a soak task's body, as the body itself records it: one line per start and one
per end, appended to a file of the run's folder (``O_APPEND`` writes of one short line do not
interleave). The soak reads it back to count how often each body ran and where."""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

#: Environment variable naming the folder whose ``runs.jsonl`` the bodies append to.
RUNS_ENV = "SOAK_RUNS_DIR"


def record(event: str, task_id: str, node: str) -> None:
    """Append one ``event`` ("start" or "end") of this process's run of ``task_id``."""
    folder = os.environ.get(RUNS_ENV)
    if not folder:
        return
    line = json.dumps({"event": event, "task": task_id, "node": node, "pid": os.getpid(),
                       "at": time.time()}) + "\n"
    fd = os.open(Path(folder) / "runs.jsonl", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@dataclass
class Run:
    """One run of a body: where, in which process, and whether it reached its end."""

    task: str
    node: str
    pid: int
    started: float
    ended: float | None = None


@dataclass
class Runs:
    """The runs of every task, read back from the file."""

    by_task: dict[str, list[Run]] = field(default_factory=lambda: defaultdict(list))

    def finished(self, task: str) -> list[Run]:
        """The runs of ``task`` that reached the body's end."""
        return [r for r in self.by_task.get(task, []) if r.ended is not None]

    def interrupted(self, task: str) -> list[Run]:
        """The runs of ``task`` that started and never ended (their process died)."""
        return [r for r in self.by_task.get(task, []) if r.ended is None]


def read_runs(folder: Path) -> Runs:
    """Parse ``runs.jsonl`` in ``folder``: pair each end with its run's start."""
    runs = Runs()
    path = folder / "runs.jsonl"
    if not path.exists():
        return runs
    open_runs: dict[tuple[str, int], Run] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        key = (item["task"], item["pid"])
        if item["event"] == "start":
            run = Run(item["task"], item["node"], item["pid"], item["at"])
            runs.by_task[item["task"]].append(run)
            open_runs[key] = run
        elif key in open_runs:
            open_runs.pop(key).ended = item["at"]
    return runs
