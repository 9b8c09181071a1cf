"""Reading the results of each bid mode at one node count."""

from __future__ import annotations

from typing import Any

from bench.speed.options import MODE_LABELS


def mode_steps(step: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(bid mode, {"auction", "burst"}) of one node count, by the mode's label; a report from
    before the modes were measured side by side has one, "ask"."""
    if "modes" in step:
        return [(MODE_LABELS.get(mode, mode), m) for mode, m in step["modes"].items()]
    return [("ask", step)] if "auction" in step else []
