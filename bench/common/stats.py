"""Percentiles and summaries of measurements."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0-100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def summary(values: Sequence[float]) -> dict[str, Any]:
    """p50, p99, mean, max and count of a list of milliseconds."""
    return {"n": len(values), "p50": percentile(values, 50), "p99": percentile(values, 99),
            "mean": statistics.fmean(values) if values else None,
            "max": max(values) if values else None}


def mean_sd(values: Sequence[float], fmt: str, scale: float = 1.0) -> str:
    """"mean ± sd" of ``values`` times ``scale`` in format ``fmt``; the mean alone for one value.

    NaN (a figure a run could not have, as a percentile of fewer than two values) is left out;
    "-" when no value is left."""
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    mean = statistics.fmean(values) * scale
    if len(values) < 2:
        return format(mean, fmt)
    return f"{format(mean, fmt)} ± {format(statistics.stdev(values) * scale, fmt)}"
