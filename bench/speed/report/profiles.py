"""The report's profile sections: phase timers, pyinstrument and py-spy per profiled step."""

from __future__ import annotations

from typing import Any

from bench.common.markdown import fmt, row, rule

COLUMNS = ("where: phase (all processes of that side)", "calls per auction", "ms per auction",
           "ms per call")
#: Entries of the top-self-time lists shown (the JSON keeps more).
SHOWN = 8


def _phase_rows(p: dict[str, Any]) -> list[str]:
    out = []
    for side in ("caller_phases", "node_phases"):
        # Within a side: the phases first, then the SQL counters, each by name.
        for k, val in sorted(p[side].items(), key=lambda kv: (kv[0].startswith("sql"), kv[0])):
            per_call = (val["ms_per_auction"] / val["per_auction"]
                        if val["per_auction"] else 0.0)
            # Labelled by the side that ran it: in proxy mode the caller awards.
            where = "caller" if side == "caller_phases" else "nodes"
            name = k.split(".", 1)[1] if k.startswith(("caller.", "node.")) else k
            out.append(row([f"{where}: {name}", f"{val['per_auction']:.2f}",
                            f"{val['ms_per_auction']:.2f}", f"{per_call:.2f}"]))
    return out


def _pyinstrument(pi: dict[str, Any]) -> list[str]:
    inc = ", ".join(f"{k} {v:.2f}" for k, v in sorted(
        pi["inclusive_ms_per_auction"].items(), key=lambda kv: -kv[1]))
    top = "; ".join(f"{k} {v:.2f}" for k, v in pi["top_self_ms_per_auction"][:SHOWN])
    return ["", f"pyinstrument, caller (ms per auction, wall): {inc}.",
            f"Top self time: {top}. Full tree: {pi['files']}"]


def _pyspy(ps: dict[str, Any]) -> list[str]:
    # Shares, not milliseconds: --gil samples include waiting for a core (bench/README.md).
    total = ps["active_ms_per_auction_per_node"] or 1.0
    inc = ", ".join(f"{k} {v / total:.0%}" for k, v in
                    ps["inclusive_ms_per_auction_per_node"].items())
    top = "; ".join(f"{k} {v / total:.0%}" for k, v in
                    ps["top_self_ms_per_auction_per_node"][:SHOWN])
    return ["", f"py-spy --gil, {ps['nodes_sampled']} node worker(s) at "
            f"{ps['rate_hz']} Hz: {total:.1f} ms holding the GIL per auction per node "
            "(includes time a GIL holder waits for a CPU). Share of those samples "
            f"under (inclusive): {inc}.", f"Top self: {top}."]


def profiles_section(results: dict[str, Any]) -> list[str]:
    """One section per profiled backend and node count."""
    out: list[str] = []
    for b, r in results["backends"].items():
        for st in r.get("steps", []):
            p = st.get("profile")
            if not p:
                continue
            out += ["", f"### Profile: {b}, {st['nodes']} nodes, bid mode "
                    f"{st.get('profile_mode', 'ask')} ({p['auctions']} sequential "
                    f"auctions per pass; e2e p50 {fmt(p['e2e_traced']['p50'])} ms with the "
                    f"phase timers and py-spy, {fmt(p['e2e_pyinstrument']['p50'])} ms under "
                    "pyinstrument)", "", row(COLUMNS), rule(len(COLUMNS))]
            out += _phase_rows(p)
            if p.get("pyinstrument", {}):
                out += _pyinstrument(p["pyinstrument"])
            if p.get("pyspy", {}):
                out += _pyspy(p["pyspy"])
    return out
