"""Node workers: their flags, their profile files, and the ``Federation`` that runs them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bidding.nodes.federation import Federation

#: Worker flags shared by the node workers and the plain worker (besides -P and -c). Gossip
#: would make every worker consume every other worker's events (quadratic in the node count).
WORKER_FLAGS = ["--without-gossip", "--without-mingle", "--without-heartbeat"]


def write_profiles(directory: Path, names: Iterable[str], *, skill: str,
                   capacity: int) -> list[Path]:
    """A profile file ``<name>.toml`` in ``directory`` per node: the one skill and capacity
    given, and the same price, latency and trust for all."""
    directory.mkdir(exist_ok=True)
    paths = []
    for name in names:
        path = directory / f"{name}.toml"
        path.write_text(f'name = "{name}"\ncapabilities = ["{skill}"]\ncapacity = {capacity}\n'
                        "price_per_unit = 0.01\nlatency_ms = 50\ntrust = 70\n")
        paths.append(path)
    return paths


def node_federation(app: str, env: Mapping[str, str], log_dir: Path, cwd: Path,
                    extra_args: Sequence[str]) -> Federation:
    """A ``Federation`` of ``bidding worker`` processes for ``app``: concurrency 1, log level
    WARNING, ``extra_args`` on each (``WORKER_FLAGS``, and the pool where one is chosen)."""
    # Imported here: bench/latency.py puts the benchmarked bidding on sys.path after start-up.
    from bidding.nodes.federation import Federation

    return Federation(app=app, env=env, log_dir=log_dir, concurrency=1, loglevel="WARNING",
                      cwd=cwd, extra_args=list(extra_args))
