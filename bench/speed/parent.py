"""The speed benchmark's parent process: one child per backend, their results collected."""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common.log import log
from bench.common.machine import machine_info
from bench.common.paths import ROOT


def child_command(args: argparse.Namespace, script: Path, backend: str, json_path: Path,
                  out_dir: Path, source: Path) -> list[str]:
    """``script --child`` for ``backend``, with every measurement option passed on."""
    cmd = [sys.executable, str(script), "--child",
           "--backend", backend, "--json", str(json_path), "--out-dir", str(out_dir),
           "--nodes", args.nodes, "--samples", str(args.samples),
           "--warmup", str(args.warmup), "--burst", str(args.burst),
           "--burst-nodes", args.burst_nodes, "--profile-nodes", args.profile_nodes,
           "--profile-samples", str(args.profile_samples),
           "--spy-rate", str(args.spy_rate), "--pool", args.pool,
           "--bid-modes", args.bid_modes, "--redis-url", args.redis_url,
           "--announcers", args.announcers, "--registered", str(args.registered),
           "--source", str(source)]
    for option, value in (("--sweep-interval", args.sweep_interval),
                          ("--heartbeat-interval", args.heartbeat_interval),
                          ("--candidate-cap", args.candidate_cap)):
        if value is not None:
            cmd += [option, str(value)]
    if args.store:
        cmd += ["--store", args.store]  # the child makes the scratch PostgreSQL store
    return cmd


def run_backends(args: argparse.Namespace, script: Path) -> tuple[dict[str, Any], int]:
    """Run each backend of ``args.backend`` in a child process, one after the other:
    (the results, with the machine and the arguments; the exit code)."""
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="bidding-bench-")).absolute()
    out_dir.mkdir(parents=True, exist_ok=True)
    source = Path(args.source).absolute()
    backends = ["redis", "embedded"] if args.backend == "both" else [args.backend]
    results: dict[str, Any] = {"machine": machine_info(source), "backends": {},
                               "args": vars(args)}
    child: subprocess.Popen[bytes] | None = None

    def forward(signum: int, _frame: Any) -> None:
        # The child stops its workers on SIGTERM; it must get the signal too.
        if child is not None and child.poll() is None:
            child.send_signal(signum)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, forward)
    code = 0
    try:
        for backend in backends:
            path = out_dir / f"{backend}.json"
            cmd = child_command(args, script, backend, path, out_dir, source)
            log(f"backend {backend} (logs and profiles in {out_dir})")
            child = subprocess.Popen(cmd, cwd=ROOT)
            code |= child.wait()
            child = None
            try:
                results["backends"][backend] = json.loads(path.read_text())
            except (OSError, ValueError) as exc:
                results["backends"][backend] = {"error": f"no results: {exc}"}
                code |= 1
    finally:
        if child is not None and child.poll() is None:
            child.send_signal(signal.SIGTERM)
            child.wait(timeout=60)
    return results, code
