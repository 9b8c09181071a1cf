"""The report's CPU table: CPU per task or auction, per process kind."""

from __future__ import annotations

from typing import Any

from bench.common.markdown import row, rule
from bench.speed.report.modes import mode_steps

COLUMNS = ("backend", "what", "nodes", "caller", "workers", "redis", "total")


def cpu_section(results: dict[str, Any]) -> list[str]:
    """CPU ms of the caller, the workers (plain worker or all nodes) and Redis per task."""
    out = ["", "### CPU per task or auction (ms; sequential runs; workers = plain worker or all "
           "nodes)", "", row(COLUMNS), rule(len(COLUMNS))]
    for b, r in results["backends"].items():
        rows = []
        if "plain_quiet" in r:
            rows.append(("plain task", "0", r["plain_quiet"]["cpu_ms"]))
        for st in r.get("steps", []):
            for mode, m in mode_steps(st):
                if "auction" in m:
                    rows.append((f"auction ({mode})", str(st["nodes"]), m["auction"]["cpu_ms"]))
                if "burst" in m:
                    rows.append((f"auction ({mode}, burst)", str(st["nodes"]),
                                 m["burst"]["cpu_ms"]))
        for what, n, c in rows:
            out.append(row([b, what, n, f"{c['caller']:.1f}", f"{c['workers']:.1f}",
                            f"{c['redis']:.1f}", f"{sum(c.values()):.1f}"]))
    return out
