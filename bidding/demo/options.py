"""The demo's options, shared by ``python -m bidding.demo`` and ``bidding demo``: their
defaults and help in one place, so the two entry points cannot differ. A module of its own so
that the ``bidding`` command (which every node worker runs) does not import the demo to list
its options."""

from __future__ import annotations

#: The demo's options: (default, help).
OPTIONS: dict[str, tuple[int | float, str]] = {
    "tasks": (40, "tasks in the stream"),
    "seed": (7, "seed of the stream's order and arguments"),
    "concurrency": (0, "worker processes per node; 0: each node's capacity, as its profile says"),
    "interval": (0.05, "seconds between submits"),
}


#: The help of ``--keep``, shared by ``python -m bidding.demo`` and ``bidding demo``.
KEEP_HELP = ("after the summary, keep the dashboard, Flower, the nodes and the broker up "
             "until Ctrl-C")
