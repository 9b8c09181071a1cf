"""The report's targets table: issue 4's three speed targets, per backend and bid mode."""

from __future__ import annotations

from typing import Any

from bench.common.markdown import row, rule
from bench.speed.report.modes import mode_steps

#: Results by node count: {nodes: the step's or the mode's dict}.
ByNodes = dict[int, dict[str, Any]]

LATENCY = "e2e p50 at 16 nodes <= 5x plain p50"
THROUGHPUT = ">= 150 auctions/s at 4 nodes"
GROWTH = "e2e p50 64 nodes / 16 nodes <= 1.5x"


def _columns(results: dict[str, Any]) -> list[tuple[str, str, ByNodes, ByNodes]]:
    """(backend, bid mode, that mode's results by nodes, the plain baseline by nodes)."""
    cols: list[tuple[str, str, ByNodes, ByNodes]] = []
    for b, r in results["backends"].items():
        plain = {st["nodes"]: st["plain"] for st in r.get("steps", []) if "plain" in st}
        modes: dict[str, ByNodes] = {}
        for st in r.get("steps", []):
            for mode, m in mode_steps(st):
                modes.setdefault(mode, {})[st["nodes"]] = m
        cols += [(b, mode, steps, plain) for mode, steps in modes.items()]
    return cols


def _verdict(text: str, met: bool) -> str:
    return f"{text}: {'met' if met else '**not met**'}"


def targets_section(results: dict[str, Any]) -> list[str]:
    """One row per target, one column per backend and bid mode ("not measured" where the
    node counts it needs were not run)."""
    cols = _columns(results)
    # The columns are joined into one cell, so that with no column (every backend skipped)
    # each row keeps the empty second cell this table has always had.
    out = ["", "### Targets (issue 4)", "",
           row(["target", " | ".join(f"{b} ({mode})" for b, mode, _, _ in cols)]),
           rule(len(cols) + 1)]
    rows: dict[str, list[str]] = {LATENCY: [], THROUGHPUT: [], GROWTH: []}
    for _, _, steps, plain in cols:
        if 16 in steps and 16 in plain:
            ratio = steps[16]["auction"]["e2e"]["p50"] / plain[16]["rtt"]["p50"]
            rows[LATENCY].append(_verdict(f"{ratio:.1f}x", ratio <= 5))
        else:
            rows[LATENCY].append("not measured")
        if 4 in steps and "burst" in steps[4]:
            rate = steps[4]["burst"]["per_s"]
            rows[THROUGHPUT].append(_verdict(f"{rate:.1f}/s", rate >= 150))
        else:
            rows[THROUGHPUT].append("not measured")
        if 16 in steps and 64 in steps:
            growth = steps[64]["auction"]["e2e"]["p50"] / steps[16]["auction"]["e2e"]["p50"]
            rows[GROWTH].append(_verdict(f"{growth:.2f}x", growth <= 1.5))
        else:
            rows[GROWTH].append("not measured")
    out += [row([k, " | ".join(v)]) for k, v in rows.items()]
    return out
