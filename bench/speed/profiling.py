"""The profile passes at one node count: phase timers, SQL counters and py-spy; pyinstrument."""

from __future__ import annotations

import time
from typing import Any

from bench.common.stats import summary
from bench.speed.backend import Backend
from bench.speed.caller_profile import profile_caller
from bench.speed.measure import run_auctions
from bench.speed.pyspy import pyspy_summary, start_pyspy, stop_pyspy
from bench.speed.trace import control, node_snapshots, per_auction

#: Warm-up auctions with the timers on, before the snapshot that starts the counted pass.
WARM_AUCTIONS = 5


def profile(backend: Backend, n: int) -> dict[str, Any]:
    """Two passes of sequential auctions: (a) phase timers and SQL counters in every
    process plus py-spy on two nodes, (b) pyinstrument on the caller alone."""
    from bench import phases

    count = backend.args.profile_samples
    trace_dir, pids = backend.trace_dir, backend.node_pids()
    generation = int(time.time() * 1000) % 10**9
    control(trace_dir, generation, "on")
    node_snapshots(trace_dir, pids, generation)
    phases.install_now()
    run_auctions(backend, WARM_AUCTIONS)
    control(trace_dir, generation + 1, "on")
    nodes_before = node_snapshots(trace_dir, pids, generation + 1)
    caller_before = phases.snapshot()
    spies = start_pyspy(backend, n)
    traced, failures = run_auctions(backend, count)
    spy_files = stop_pyspy(spies)
    caller_after = phases.snapshot()
    phases.uninstall()
    control(trace_dir, generation + 2, "off")
    nodes_after = node_snapshots(trace_dir, pids, generation + 2)
    # The second pass, separately: pyinstrument's overhead must not land in the phase timers.
    profiled, more_failures, pyinstrument = profile_caller(backend, n, count)
    return {
        "auctions": len(traced), "failures": failures + more_failures,
        "e2e_traced": summary([r["e2e_ms"] for r in traced]),
        "e2e_pyinstrument": summary([r["e2e_ms"] for r in profiled]),
        "caller_phases": per_auction(caller_after, caller_before, len(traced)),
        "node_phases": per_auction(nodes_after, nodes_before, len(traced)),
        "pyinstrument": pyinstrument,
        "pyspy": pyspy_summary(spy_files, len(traced), backend.args.spy_rate),
    }
