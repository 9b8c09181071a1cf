"""Reading the results of each bid mode at one node count."""

from __future__ import annotations

from typing import Any


def mode_steps(step: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(bid mode, {"auction", "burst"}) of one node count; a report from before the modes
    were measured side by side has one, "ask"."""
    if "modes" in step:
        return list(step["modes"].items())
    return [("ask", step)] if "auction" in step else []
