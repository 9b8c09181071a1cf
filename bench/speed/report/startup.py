"""The report's start-up table and idle cost of the node workers."""

from __future__ import annotations

from typing import Any

from bench.common.markdown import row, rule

COLUMNS = ("backend", "nodes added", "wall s until all heartbeat", "CPU s per node",
           "RSS MB per node")


def startup_section(results: dict[str, Any]) -> list[str]:
    """The plain worker's and each batch of nodes' start-up; then each backend's idle cost."""
    out = ["", "### Node workers: start-up and idle cost", "", row(COLUMNS), rule(len(COLUMNS))]
    for b, r in results["backends"].items():
        if "plain_worker_start_s" in r:
            out.append(row([b, "plain worker", f"{r['plain_worker_start_s']:.1f}", "-", "-"]))
        for st in r.get("steps", []):
            s = st.get("start")
            if s:
                out.append(row([b, f"{s['added']} (to {st['nodes']})", f"{s['wall_s']:.1f}",
                                f"{s['cpu_s_per_node']:.2f}", f"{s['rss_mb_per_node']:.0f}"]))
    for b, r in results["backends"].items():
        idle = r.get("idle")
        if idle:
            out.append(f"\n{b}: {idle['nodes']} idle nodes use {idle['cpu_pct']:.0f}% of one "
                       f"core (Redis {idle['redis_cpu_pct']:.0f}%) and "
                       f"{idle['rss_mb'] / 1024:.1f} GB RSS.")
    return out
