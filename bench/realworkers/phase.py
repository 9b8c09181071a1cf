"""One policy's phase: ``--tasks`` tasks submitted at ``--rate`` per second, then their outcomes."""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

from bench.common.log import log


def task_types(args: argparse.Namespace) -> list[str]:
    """The type of each task: half a, half b; strictly alternating or in a seeded shuffle."""
    types = ["a" if i % 2 == 0 else "b" for i in range(args.tasks)]
    if args.order == "shuffled":
        random.Random(args.seed).shuffle(types)
    return types


def run_phase(task: Any, mode: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Submit ``args.tasks`` tasks at ``args.rate`` per second; return one record per task."""
    pending = []
    types = task_types(args)
    t0 = time.monotonic()
    for i in range(args.tasks):
        due = t0 + i / args.rate
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        task_type = types[i]
        # Ids from the seed: a node draws a task's outcome from random.Random(task id).
        task_id = f"fvb-{args.seed}-{mode}-{i:04d}"
        options: dict[str, Any] = {"task_id": task_id}
        if mode == "bidding":
            options["bidding"] = {"task_type": task_type}
        pending.append((i, task_type, task.apply_async((task_type, f"k{i}"), **options)))
    submitted = time.monotonic() - t0
    records = []
    for i, task_type, result in pending:
        try:
            value = result.get(timeout=args.timeout, propagate=False)
            state = result.state
            worker = result.worker
        except Exception as exc:  # a lost task counts as a failure, on no node
            log(f"{mode} task {result.id}: {type(exc).__name__}: {exc}")
            value, state, worker = None, "LOST", None
        node = str(worker).split("@")[0] if worker else None
        if node is None and isinstance(value, dict):
            node = value.get("node")
        records.append({"i": i, "type": task_type, "ok": state == "SUCCESS", "node": node,
                        "state": state})
    took = time.monotonic() - t0
    log(f"{mode}: {args.tasks} tasks submitted in {submitted:.1f} s, all done in {took:.1f} s")
    return records
