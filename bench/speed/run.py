"""One backend's whole run: set-up, quiet baseline, each node count, idle cost."""

from __future__ import annotations

import argparse
import contextlib
import time
import traceback
from typing import Any

from bench.common.log import log
from bench.speed.announcers import RegisteredNodes, measure_announcers
from bench.speed.backend import Backend
from bench.speed.measure import (
    idle_cost,
    log_plain,
    measure_auction_burst,
    measure_auctions,
    measure_plain,
)
from bench.speed.options import MODE_LABELS, bid_modes, int_list
from bench.speed.profiling import profile
from bench.speed.trace import control


def run_backend(args: argparse.Namespace, res: dict[str, Any]) -> None:
    """Measure ``args.backend`` into ``res``; every process it started is stopped at the end."""
    with contextlib.ExitStack() as stack:
        backend = Backend(args, res)
        backend.start(stack)
        res["plain_quiet"] = measure_plain(backend, burst=True)
        log_plain(res["plain_quiet"])
        if "mixed" in bid_modes(args.bid_modes):
            # Up for every step, so that each plain baseline has the same background.
            backend.start_asked_node()
        res["steps"] = []
        for n in sorted(set(int_list(args.nodes))):
            step = run_step(backend, n)
            res["steps"].append(step)
            if step.get("skipped"):
                break
        res["idle"] = idle_cost(backend)
        if args.registered:
            res["registered"] = measure_registered(backend, args.registered)


def measure_registered(backend: Backend, total: int) -> dict[str, Any]:
    """The first bid mode's sequential auctions again, with node rows registered (and
    heartbeating, with another skill) up to ``total`` nodes in all."""
    from bidding.nodes.registry import invalidate_cache

    running = len(backend.bench_nodes())
    extra = RegisteredNodes(backend.settings, max(0, total - running))
    log(f"registering {len(extra.names)} more nodes ({total} in all, {running} running)")
    extra.start()
    try:
        invalidate_cache()
        backend.set_bid_mode(bid_modes(backend.args.bid_modes)[0])
        plain = measure_plain(backend, burst=False)
        auction = measure_auctions(backend)
    finally:
        extra.stop()
    log(f"{total} registered: auction e2e p50 {auction['e2e']['p50']:.1f} ms; plain p50 "
        f"{plain['rtt']['p50']:.2f} ms")
    return {"total": total, "running": running, "plain": plain, "auction": auction,
            "mode": MODE_LABELS.get(bid_modes(backend.args.bid_modes)[0],
                                    bid_modes(backend.args.bid_modes)[0])}


def run_step(backend: Backend, n: int) -> dict[str, Any]:
    """At ``n`` nodes: the plain baseline, each bid mode's auctions (and burst), the profile."""
    from bidding.nodes.registry import invalidate_cache

    args = backend.args
    step: dict[str, Any] = {"nodes": n, **backend.add_nodes(n)}
    if step.get("skipped"):
        return step
    # The caller caches the live nodes; the ones just started must be seen at once.
    invalidate_cache()
    step["plain"] = measure_plain(backend, burst=n in int_list(args.burst_nodes))
    log_plain(step["plain"])
    step["modes"] = {}
    for mode in bid_modes(args.bid_modes):
        backend.set_bid_mode(mode)
        m: dict[str, Any] = {"auction": measure_auctions(backend)}
        step["modes"][mode] = m
        a = m["auction"]
        log(f"{n} nodes, {mode}: auction e2e p50 {a['e2e']['p50']:.1f} ms, p99 "
            f"{a['e2e']['p99']:.1f} ms; assignment p50 {a['assign']['p50']:.1f} ms; "
            f"{a['failures']} failed")
        if n in int_list(args.burst_nodes):
            log(f"{n} nodes, {mode}: burst of {args.burst} auctions")
            m["burst"] = b = measure_auction_burst(backend)
            log(f"{n} nodes, {mode}: {b['per_s']:.1f} auctions/s (submitted at "
                f"{b['submit_per_s']:.0f}/s); {b['failures']} failed; closed by "
                f"{b['closed_by']}")
            counts = int_list(args.announcers)
            if (counts != [1] and mode == bid_modes(args.bid_modes)[0]
                    and n == max(int_list(args.burst_nodes))):
                m["announcers"] = measure_announcers(counts, args.burst)
    if n in int_list(args.profile_nodes):
        step["profile_mode"] = MODE_LABELS.get(mode, mode)
        log(f"{n} nodes: profiling {args.profile_samples} auctions ({step['profile_mode']})")
        try:
            step["profile"] = profile(backend, n)
        except Exception as exc:  # a profiler problem must not lose the measurements
            traceback.print_exc()
            step["profile_error"] = f"{type(exc).__name__}: {exc}"
            with contextlib.suppress(Exception):
                from bench import phases

                phases.uninstall()
                control(backend.trace_dir, int(time.time()) % 10**9, "off")
    return step
