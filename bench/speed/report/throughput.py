"""The report's throughput table: bursts of plain tasks and of auctions."""

from __future__ import annotations

from typing import Any

from bench.common.markdown import pair, row, rule
from bench.speed.report.modes import mode_steps

COLUMNS = ("backend", "what", "nodes", "per second", "submitted per second",
           "assignment p50 / p99 ms", "closed by", "failed")


def throughput_section(results: dict[str, Any]) -> list[str]:
    """Plain bursts (quiet, and next to idle nodes), then each bid mode's auction burst."""
    lines = ["", "### Throughput (bursts: all submitted, then all `.get()`)", "",
             row(COLUMNS), rule(len(COLUMNS))]
    for b, r in results["backends"].items():
        pq = r.get("plain_quiet", {}).get("burst")
        if pq:
            lines.append(row([b, "plain tasks", "0 (quiet)", f"{pq['per_s']:.0f}",
                              f"{pq['submit_per_s']:.0f}", "-", "-", "-"]))
        for st in r.get("steps", []):
            pb = st.get("plain", {}).get("burst")
            if pb:
                lines.append(row([b, "plain tasks", f"{st['nodes']} idle", f"{pb['per_s']:.0f}",
                                  f"{pb['submit_per_s']:.0f}", "-", "-", "-"]))
            for mode, m in mode_steps(st):
                ab = m.get("burst")
                if ab:
                    closed = ", ".join(f"{k} {c}" for k, c in ab["closed_by"].items())
                    lines.append(row([b, f"**auctions ({mode})**", str(st["nodes"]),
                                      f"**{ab['per_s']:.1f}**", f"{ab['submit_per_s']:.0f}",
                                      pair(ab["assign"]), closed, str(ab["failures"])]))
    return lines
