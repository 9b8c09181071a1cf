"""The report's targets table: the speed targets, per backend and bid mode.

Four are measured here: latency, CPU, throughput and a node worker's memory. The two others,
what idle nodes cost and the store connections they hold, are measured by ``bench/idle.py``
with the library's own pools (this benchmark runs solo pools).
"""

from __future__ import annotations

from typing import Any

from bench.common.markdown import row, rule
from bench.speed.report.modes import mode_steps

#: Results by node count: {nodes: the step's or the mode's dict}.
ByNodes = dict[int, dict[str, Any]]

LATENCY = "e2e p50 at 16 nodes <= 3x plain p50 (same run)"
CPU = "CPU per auction <= 2x a plain task's (caller, nodes, Redis; sequential)"
THROUGHPUT = (">= 300 auctions/s at 4 nodes, or >= half of plain Celery's tasks/s next to the "
              "same idle nodes")
MEMORY = "a node worker's main process <= 80 MB RSS"
GROWTH = "e2e p50 64 nodes / 16 nodes <= 1.5x"
#: The targets measured by bench/idle.py, named under the table.
ELSEWHERE = ("Idle CPU (16 idle nodes <= 5% of one core) and store connections (an idle node "
             "holds at most one) are measured by `bench/idle.py`.")


def _columns(results: dict[str, Any]) -> list[tuple[str, str, ByNodes, ByNodes, dict[str, Any]]]:
    """(backend, bid mode, that mode's results by nodes, the plain baseline by nodes, the
    backend's results)."""
    cols: list[tuple[str, str, ByNodes, ByNodes, dict[str, Any]]] = []
    for b, r in results["backends"].items():
        plain = {st["nodes"]: st["plain"] for st in r.get("steps", []) if "plain" in st}
        modes: dict[str, ByNodes] = {}
        for st in r.get("steps", []):
            for mode, m in mode_steps(st):
                modes.setdefault(mode, {})[st["nodes"]] = m
        cols += [(b, mode, steps, plain, r) for mode, steps in modes.items()]
    return cols


def _verdict(text: str, met: bool) -> str:
    return f"{text}: {'met' if met else '**not met**'}"


def _cpu(steps: ByNodes, backend: dict[str, Any]) -> str:
    """The auction's CPU against the quiet plain task's, at 16 nodes (else the most measured)."""
    plain = backend.get("plain_quiet", {}).get("cpu_ms")
    measured = [n for n in steps if "auction" in steps[n]]
    if not plain or not measured:
        return "not measured"
    nodes = 16 if 16 in measured else max(measured)
    ratio = sum(steps[nodes]["auction"]["cpu_ms"].values()) / sum(plain.values())
    # The PostgreSQL server's own CPU is not in these figures (bench/idle.py reads it).
    on_sqlite = "sqlite" in str(backend.get("store", "sqlite")).lower()
    server = "" if on_sqlite else ", server not counted"
    return _verdict(f"{ratio:.1f}x at {nodes} nodes{server}", ratio <= 2)


def _throughput(steps: ByNodes, plain: ByNodes) -> str:
    if 4 not in steps or "burst" not in steps[4]:
        return "not measured"
    rate = steps[4]["burst"]["per_s"]
    plain_rate = plain.get(4, {}).get("burst", {}).get("per_s")
    if plain_rate:
        share = rate / plain_rate
        return _verdict(f"{rate:.1f}/s, {share:.0%} of plain's {plain_rate:.0f}/s",
                        rate >= 300 or share >= 0.5)
    return _verdict(f"{rate:.1f}/s", rate >= 300)


def _memory(backend: dict[str, Any]) -> str:
    """The node workers' RSS (solo pools: each is its main process), at the last start."""
    sizes = [st["start"]["rss_mb_per_node"] for st in backend.get("steps", []) if st.get("start")]
    if not sizes:
        return "not measured"
    return _verdict(f"{sizes[-1]:.0f} MB", sizes[-1] <= 80)


def targets_section(results: dict[str, Any]) -> list[str]:
    """One row per target, one column per backend and bid mode ("not measured" where the
    node counts it needs were not run)."""
    cols = _columns(results)
    # The columns are joined into one cell, so that with no column (every backend skipped)
    # each row keeps the empty second cell this table has always had.
    out = ["", "### Targets", "",
           row(["target", " | ".join(f"{b} ({mode})" for b, mode, _, _, _ in cols)]),
           rule(len(cols) + 1)]
    rows: dict[str, list[str]] = {LATENCY: [], CPU: [], THROUGHPUT: [], MEMORY: [], GROWTH: []}
    for _, _, steps, plain, backend in cols:
        if 16 in steps and 16 in plain:
            ratio = steps[16]["auction"]["e2e"]["p50"] / plain[16]["rtt"]["p50"]
            rows[LATENCY].append(_verdict(f"{ratio:.1f}x", ratio <= 3))
        else:
            rows[LATENCY].append("not measured")
        rows[CPU].append(_cpu(steps, backend))
        rows[THROUGHPUT].append(_throughput(steps, plain))
        rows[MEMORY].append(_memory(backend))
        if 16 in steps and 64 in steps:
            growth = steps[64]["auction"]["e2e"]["p50"] / steps[16]["auction"]["e2e"]["p50"]
            rows[GROWTH].append(_verdict(f"{growth:.2f}x", growth <= 1.5))
        else:
            rows[GROWTH].append("not measured")
    out += [row([k, " | ".join(v)]) for k, v in rows.items()]
    out += ["", ELSEWHERE]
    return out
