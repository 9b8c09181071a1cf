"""The speed benchmark's measurements: round trips, auctions, bursts, CPU and idle cost."""

from __future__ import annotations

import time
from typing import Any

from bench.common.log import log
from bench.common.procstat import cpu_seconds, rss_mb, self_cpu
from bench.common.stats import summary
from bench.speed.backend import Backend
from bench.speed.timeline import timeline

#: CPU seconds so far of (this process, the workers measured, the Redis server).
CpuMarks = tuple[float, float, float]


def cpu_marks(backend: Backend, worker_pids: list[int]) -> CpuMarks:
    """CPU used so far by the caller, by ``worker_pids`` and by Redis."""
    return self_cpu(), cpu_seconds(worker_pids), backend.redis_cpu()


def cpu_per(before: CpuMarks, after: CpuMarks, count: int) -> dict[str, float]:
    """CPU milliseconds per task of each process kind between two marks."""
    names = ("caller", "workers", "redis")
    return {name: (a - b) * 1000 / max(1, count)
            for name, b, a in zip(names, before, after, strict=True)}


def measure_plain(backend: Backend, burst: bool) -> dict[str, Any]:
    """Sequential ``noop.delay().get()`` round trips, and a burst of them if ``burst``."""
    args, noop = backend.args, backend.noop
    for i in range(args.warmup):
        noop.delay(i).get(timeout=30)
    marks = cpu_marks(backend, backend.plain_pids)
    rtt = []
    for i in range(args.samples):
        t0 = time.perf_counter()
        noop.delay(i).get(timeout=30)
        rtt.append((time.perf_counter() - t0) * 1000)
    out: dict[str, Any] = {"rtt": summary(rtt),
                           "cpu_ms": cpu_per(marks, cpu_marks(backend, backend.plain_pids),
                                             len(rtt))}
    if burst:
        t0 = time.perf_counter()
        pending = [noop.delay(i) for i in range(args.burst)]
        submitted = time.perf_counter()
        for r in pending:
            r.get(timeout=120)
        took = time.perf_counter() - t0
        out["burst"] = {"n": args.burst, "per_s": args.burst / took,
                        "submit_per_s": args.burst / (submitted - t0)}
    return out


def log_plain(plain: dict[str, Any]) -> None:
    """One progress line for ``measure_plain``'s result."""
    rtt = plain["rtt"]
    text = f"plain rtt p50 {rtt['p50']:.2f} ms, p99 {rtt['p99']:.2f} ms"
    if "burst" in plain:
        text += f"; burst {plain['burst']['per_s']:.0f} tasks/s"
    log(text)


def run_auctions(backend: Backend, count: int) -> tuple[list[dict[str, Any]], int]:
    """Sequential auctions: (records, failures)."""
    records, failures = [], 0
    for i in range(count):
        wall = time.time()
        t0 = time.perf_counter()
        r = backend.submit(i)
        t1 = time.perf_counter()
        try:
            r.get(timeout=30)
        except Exception as exc:
            failures += 1
            log(f"auction {r.id} failed: {type(exc).__name__}: {exc}")
            continue
        t2 = time.perf_counter()
        records.append({"id": r.id, "wall": wall, "delay_ms": (t1 - t0) * 1000,
                        "e2e_ms": (t2 - t0) * 1000})
    return records, failures


def measure_auctions(backend: Backend) -> dict[str, Any]:
    """Sequential auctions after a warm-up: end to end, delay(), CPU and the timeline."""
    args = backend.args
    run_auctions(backend, args.warmup)
    pids = backend.node_pids()
    marks = cpu_marks(backend, pids)
    records, failures = run_auctions(backend, args.samples)
    cpu = cpu_per(marks, cpu_marks(backend, pids), len(records))
    return {"e2e": summary([r["e2e_ms"] for r in records]),
            "delay": summary([r["delay_ms"] for r in records]),
            "failures": failures, "cpu_ms": cpu,
            **timeline(backend.settings.database_url, records)}


def measure_auction_burst(backend: Backend) -> dict[str, Any]:
    """``--burst`` auctions submitted at once, then every result: auctions/s and the rest."""
    n = backend.args.burst
    pids = backend.node_pids()
    marks = cpu_marks(backend, pids)
    t0 = time.perf_counter()
    pending = []
    for i in range(n):
        wall = time.time()
        pending.append((wall, backend.submit(i)))
    submitted = time.perf_counter()
    failures, records = 0, []
    for wall, r in pending:
        try:
            r.get(timeout=120)
        except Exception as exc:
            failures += 1
            if failures <= 3:
                log(f"burst auction {r.id} failed: {type(exc).__name__}: {exc}")
            continue
        records.append({"id": r.id, "wall": wall, "delay_ms": 0.0,
                        "e2e_ms": (time.perf_counter() - t0) * 1000})
    took = time.perf_counter() - t0
    tl = timeline(backend.settings.database_url, records)
    return {"n": n, "per_s": n / took, "ok_per_s": len(records) / took,
            "submit_per_s": n / (submitted - t0), "failures": failures,
            "assign": tl["assign"], "closed_by": tl["closed_by"], "winners": tl["winners"],
            "max_wins": tl["max_wins"],
            "cpu_ms": cpu_per(marks, cpu_marks(backend, pids), n)}


def idle_cost(backend: Backend) -> dict[str, Any]:
    """CPU and RSS of the node workers over 4 s with no work."""
    pids = backend.node_pids()
    if not pids:
        return {}
    time.sleep(1.0)
    c0, r0, t0 = cpu_seconds(pids), backend.redis_cpu(), time.monotonic()
    time.sleep(4.0)
    seconds = time.monotonic() - t0
    return {"nodes": len(pids), "cpu_pct": (cpu_seconds(pids) - c0) / seconds * 100,
            "redis_cpu_pct": (backend.redis_cpu() - r0) / seconds * 100,
            "rss_mb": rss_mb(pids)}
