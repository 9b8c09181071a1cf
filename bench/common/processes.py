"""Stopping a process group that a benchmark started (``bidding.nodes.federation``'s, which the
demo and the node federation use too)."""

from bidding.nodes.federation import stop_process

__all__ = ["stop_process"]
