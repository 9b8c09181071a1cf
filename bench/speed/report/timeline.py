"""The report's timeline table: where an auction's time goes, from the store's timestamps."""

from __future__ import annotations

from typing import Any

from bench.common.markdown import fmt, row, rule
from bench.speed.report.modes import mode_steps


def timeline_section(results: dict[str, Any]) -> list[str]:
    """Median of each phase, one column per backend, node count and bid mode; then what
    closed the auctions and how many distinct nodes won. Nothing if no phase was measured."""
    cols = [(f"{b} {st['nodes']}n {mode}", m["auction"])
            for b, r in results["backends"].items() for st in r.get("steps", [])
            for mode, m in mode_steps(st) if "auction" in m]
    names: list[str] = []
    for _, a in cols:
        names += [k for k in a.get("phases_p50", {}) if k not in names]
    if not names:
        return []
    out = ["", "### Where an auction's time goes (medians, ms; from the store's timestamps)", "",
           row(["phase", *(label for label, _ in cols)]), rule(len(cols) + 1)]
    for k in names:
        out.append(row([k, *(fmt(a["phases_p50"].get(k)) for _, a in cols)]))
    out.append(row(["closed by", *(", ".join(f"{k} {c}" for k, c in a["closed_by"].items())
                                   for _, a in cols)]))
    out.append(row(["distinct winners (max wins)",
                    *(f"{a['winners']} ({a['max_wins']})" for _, a in cols)]))
    return out
