"""The report's scale section: bursts from several announcing processes, and auctions with
many registered nodes."""

from __future__ import annotations

from typing import Any

from bench.common.markdown import row, rule
from bench.speed.report.modes import mode_steps


def scale_section(results: dict[str, Any]) -> list[str]:
    """Auctions/s by announcing processes; e2e with ``--registered`` nodes against the same
    run's largest node count."""
    lines: list[str] = []
    for b, r in results["backends"].items():
        for st in r.get("steps", []):
            for mode, m in mode_steps(st):
                runs = m.get("announcers")
                if not runs:
                    continue
                cols = ("backend", "nodes", "bid mode", "announcing processes", "auctions/s",
                        "vs 1 process", "failed")
                lines += ["", "### Bursts from several announcing processes", "",
                          row(cols), rule(len(cols))]
                one = runs[0]["per_s"]
                for a in runs:
                    lines.append(row([b, str(st["nodes"]), mode, str(a["processes"]),
                                      f"{a['per_s']:.1f}", f"{a['per_s'] / one:.2f}x",
                                      str(a["failures"])]))
        reg = r.get("registered")
        if reg:
            last = next((st for st in reversed(r.get("steps", [])) if st.get("modes")), None)
            base = None
            if last is not None:
                base = next((m["auction"] for mode, m in mode_steps(last)
                             if mode == reg["mode"]), None)
            cols = ("backend", "registered (running)", "bid mode", "plain p50 / p99",
                    "auction e2e p50 / p99", "e2e p50 vs plain", "vs running nodes only")
            a, p = reg["auction"]["e2e"], reg["plain"]["rtt"]
            vs = f"{a['p50'] / base['e2e']['p50']:.2f}x" if base else "-"
            lines += ["", "### Many registered nodes", "", row(cols), rule(len(cols)),
                      row([b, f"{reg['total']} ({reg['running']})", reg["mode"],
                           f"{p['p50']:.2f} / {p['p99']:.2f}",
                           f"{a['p50']:.1f} / {a['p99']:.1f}", f"{a['p50'] / p['p50']:.1f}x",
                           vs])]
    return lines
