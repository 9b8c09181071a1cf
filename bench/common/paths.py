"""Where the bench/ folder and the repository root are."""

from __future__ import annotations

from pathlib import Path

#: The bench/ folder (the plots of bench/quality.py are written here).
BENCH_DIR = Path(__file__).absolute().parent.parent
#: The repository root: the default ``bidding`` to benchmark, and the workers' import root.
ROOT = BENCH_DIR.parent
