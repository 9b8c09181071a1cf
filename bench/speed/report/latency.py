"""The report's latency table: plain ``delay().get()`` against the auction, same run."""

from __future__ import annotations

from typing import Any

from bench.common.markdown import fmt, pair, row, rule
from bench.speed.report.modes import mode_steps

COLUMNS = ("backend", "nodes", "bid mode", "asked", "plain p50 / p99", "auction e2e p50 / p99",
           "e2e p50 / plain p50", "assignment p50 / p99", "delay() p50", "failed")


def latency_section(results: dict[str, Any]) -> list[str]:
    """One row for the quiet baseline, then one per node count and bid mode."""
    lines = ["", "### Latency (ms): plain `delay().get()` vs auction, same run, same background",
             "", row(COLUMNS), rule(len(COLUMNS))]
    for b, r in results["backends"].items():
        if "plain_quiet" in r:
            lines.append(row([b, "0 (quiet)", "-", "-", pair(r["plain_quiet"]["rtt"], 2),
                              "-", "-", "-", "-", "-"]))
        for st in r.get("steps", []):
            if st.get("skipped"):
                # One cell spanning the row's remaining columns.
                lines.append(f"| {b} | {st['nodes']} | skipped: {st['skipped']} ||||||||")
                continue
            p = st.get("plain")
            for mode, m in mode_steps(st):
                a = m.get("auction")
                if not a or not p:
                    continue
                # Against the plain round trip measured at the same node count.
                ratio = a["e2e"]["p50"] / p["rtt"]["p50"]
                lines.append(row([b, str(st["nodes"]), mode, fmt(a["candidates"], 0),
                                  pair(p["rtt"], 2), pair(a["e2e"]), f"{ratio:.1f}x",
                                  pair(a["assign"]), fmt(a["delay"]["p50"]),
                                  str(a["failures"])]))
    return lines
