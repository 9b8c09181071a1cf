"""A plain Celery worker: the speed benchmark's baseline, with the node workers' flags."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.common.nodes import WORKER_FLAGS


def start_plain_worker(app: str, queue: str, pool_args: Sequence[str], cwd: Path,
                       env: Mapping[str, str], log_path: Path
                       ) -> tuple[subprocess.Popen[bytes], list[str]]:
    """Start ``celery -A app worker`` on ``queue`` (concurrency 1, -E, prefetch 1) in a
    process group of its own; returns the process and its command line."""
    cmd = [sys.executable, "-m", "celery", "-A", app, "worker", *pool_args,
           "-c", "1", "-Q", queue, "-n", f"{queue}@%h", "-E", "--prefetch-multiplier=1",
           *WORKER_FLAGS, "-l", "WARNING"]
    log_file = log_path.open("ab")
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=dict(env), stdout=log_file,
                                stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log_file.close()  # the child has its own copy of the descriptor
    return proc, cmd
