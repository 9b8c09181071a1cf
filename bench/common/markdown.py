"""Markdown tables: rows, rules and number cells."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def row(cells: Sequence[str]) -> str:
    """One table row: ``| a | b |``."""
    return "| " + " | ".join(cells) + " |"


def rule(columns: int) -> str:
    """The line under a header of ``columns`` columns: ``|---|---|``."""
    return "|" + "---|" * columns


def padded_rule(header: Sequence[str]) -> str:
    """The line under a header whose cells are padded to their column's width."""
    return "|" + "|".join("-" * (len(cell) + 2) for cell in header) + "|"


def fmt(value: float | None, digits: int = 1) -> str:
    """A number with ``digits`` decimals, or "-" for none."""
    return "-" if value is None else f"{value:.{digits}f}"


def pair(summary: dict[str, Any] | None, digits: int = 1) -> str:
    """"p50 / p99" of a ``stats.summary``, or "-" for none."""
    if not summary:
        return "-"
    return f"{fmt(summary.get('p50'), digits)} / {fmt(summary.get('p99'), digits)}"
