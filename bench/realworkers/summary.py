"""What one phase scored: success rates, the expected rate, tasks per node."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

#: Node -> task type -> true success probability (``bench.fifo_app.TRUE_P``).
TrueP = dict[str, dict[str, float]]


def summarize(records: list[dict[str, Any]], true_p: TrueP) -> dict[str, Any]:
    """Success rates (overall, halves, per type), expected rate and tasks per node."""
    half = len(records) // 2

    def rate(rs: list[dict[str, Any]]) -> float:
        return sum(r["ok"] for r in rs) / len(rs) if rs else float("nan")

    def expected(rs: list[dict[str, Any]]) -> float:
        # The chosen nodes' true probabilities: the rate without the outcomes' noise.
        ps = [true_p.get(r["node"] or "", {}).get(r["type"], 0.0) for r in rs]
        return statistics.fmean(ps) if ps else float("nan")

    per_node: dict[str, Counter[str]] = {}
    for r in records:
        c = per_node.setdefault(r["node"] or "(none)", Counter())
        c[r["type"]] += 1
        c["ok"] += r["ok"]
    return {
        "n": len(records), "ok": sum(r["ok"] for r in records), "rate": rate(records),
        "first": rate(records[:half]), "second": rate(records[half:]),
        "expected": expected(records), "expected_second": expected(records[half:]),
        "by_type": {t: rate([r for r in records if r["type"] == t]) for t in ("a", "b")},
        "per_node": per_node,
        "states": Counter(r["state"] for r in records),
    }


def oracle(true_p: TrueP) -> float:
    """Mean success probability if every task ran on its type's best node (a/b alternate)."""
    return statistics.fmean(max(p[t] for p in true_p.values()) for t in ("a", "b"))
