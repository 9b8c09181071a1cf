"""py-spy on two node workers during a pass of auctions, summarised per auction and node."""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.common.log import log
from bench.common.processes import stop_process
from bench.speed.backend import Backend

#: Node-side functions whose inclusive py-spy samples are reported.
NODE_FUNCTIONS = [
    "answer", "place_bid", "gather_histories", "record_answer", "close_auction", "in_flight_counts",
    "bind", "send_execution", "begin", "finish", "model_validate", "connect",
    "_on_connect", "commit", "close_expired", "heartbeat", "on_message", "trace_task",
]
#: Node workers sampled by py-spy (the first ones started).
SAMPLED_NODES = 2
#: Leaf frames listed by samples.
TOP = 12

Spy = tuple[subprocess.Popen[bytes], Path]


def start_pyspy(backend: Backend, n: int) -> list[Spy]:
    """``py-spy record --gil`` on the first SAMPLED_NODES node workers; none if not installed."""
    exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(exe).exists():
        log("py-spy not installed: skipping node sampling (pip install py-spy)")
        return []
    spies = []
    for name, node in list(backend.federation.nodes.items())[:SAMPLED_NODES]:
        out = backend.out / f"pyspy-{backend.args.backend}-{n}nodes-{name}.txt"
        proc = subprocess.Popen(
            [exe, "record", "--pid", str(node.process.pid), "--rate", str(backend.args.spy_rate),
             "--format", "raw", "--output", str(out), "--nonblocking", "--gil",
             "--duration", "600"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        spies.append((proc, out))
    time.sleep(1.0)  # py-spy attaches
    return spies


def stop_pyspy(spies: list[Spy]) -> list[Path]:
    """Stop the samplers (SIGINT makes py-spy write its file); the files written."""
    files = []
    for proc, out in spies:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGINT)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            stop_process(proc)
            err = b""
        if out.exists():
            files.append(out)
        else:
            log(f"py-spy wrote nothing: {err.decode(errors='replace')[-300:]}")
    return files


def pyspy_summary(files: list[Path], auctions: int, rate: int) -> dict[str, Any]:
    """Ms per auction per node: samples in all, under each of NODE_FUNCTIONS (inclusive) and
    the leaf frames with the most samples."""
    if not files:
        return {}
    inclusive: dict[str, int] = defaultdict(int)
    self_samples: dict[str, int] = defaultdict(int)
    total = 0
    for path in files:
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count_text = line.rpartition(" ")
            if not stack or not count_text.isdigit():
                continue
            count = int(count_text)
            total += count
            frames = stack.split(";")[1:]  # the first entry names the thread
            names = {f.split(" (", 1)[0] for f in frames}
            for name in names:
                if name in NODE_FUNCTIONS:
                    inclusive[name] += count
            if frames:
                self_samples[frames[-1]] += count
    per = 1000 / rate / max(1, auctions) / len(files)

    def ms(samples: int) -> float:
        return samples * per

    return {
        "nodes_sampled": len(files), "rate_hz": rate, "files": [str(f) for f in files],
        "active_ms_per_auction_per_node": ms(total),
        "inclusive_ms_per_auction_per_node": {k: ms(v) for k, v in sorted(
            inclusive.items(), key=lambda kv: -kv[1])},
        "top_self_ms_per_auction_per_node": [(k, ms(v)) for k, v in sorted(
            self_samples.items(), key=lambda kv: -kv[1])[:TOP]],
    }
