"""pyinstrument on the caller during a pass of sequential auctions, summarised per auction."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from bench.common.log import log
from bench.speed.backend import Backend
from bench.speed.measure import run_auctions

#: Caller-side functions whose inclusive pyinstrument time is reported.
CALLER_FUNCTIONS = [
    "apply_async", "build_announcement", "announce", "live_nodes", "select_candidates",
    "write_session", "request_bids", "publish", "model_dump", "get",
]
#: Leaf frames listed by self time.
TOP = 12


def profile_caller(backend: Backend, n: int, count: int
                   ) -> tuple[list[dict[str, Any]], int, dict[str, Any]]:
    """Run ``count`` auctions under pyinstrument and write its tree next to the logs:
    (records, failures, summary)."""
    try:
        from pyinstrument import Profiler
    except ImportError:
        # The `bench` extra is optional: the phase timers and SQL counts still run.
        log("pyinstrument not installed: skipping the caller's profile "
            "(pip install -e '.[bench]')")
        records, failures = run_auctions(backend, count)
        return records, failures, {}

    profiler = Profiler(interval=0.001)
    profiler.start()
    records, failures = run_auctions(backend, count)
    profiler.stop()
    stem = backend.out / f"pyinstrument-{backend.args.backend}-{n}nodes"
    stem.with_suffix(".html").write_text(profiler.output_html())
    stem.with_suffix(".txt").write_text(profiler.output_text(unicode=False, color=False))
    return records, failures, {"files": f"{stem}.html/.txt",
                               **pyinstrument_summary(profiler, len(records))}


def pyinstrument_summary(profiler: Any, auctions: int) -> dict[str, Any]:
    """Wall ms per auction: the whole session, each of CALLER_FUNCTIONS (inclusive, counted
    once where it recurses) and the leaf frames with the most self time."""
    session = profiler.last_session
    root = session.root_frame()
    inclusive: dict[str, float] = defaultdict(float)

    def walk(frame: Any, open_names: frozenset[str]) -> None:
        name = frame.function
        if name in CALLER_FUNCTIONS and name not in open_names:
            inclusive[name] += frame.time
            open_names = open_names | {name}
        for child in frame.children:
            walk(child, open_names)

    if root is not None:
        walk(root, frozenset())
    self_time: dict[str, float] = defaultdict(float)

    def leaves(frame: Any) -> None:
        if frame.children:
            for child in frame.children:
                leaves(child)
        else:
            key = f"{frame.function} ({frame.file_path_short}:{frame.line_no})"
            self_time[key] += frame.time

    if root is not None:
        leaves(root)
    count = max(1, auctions)
    top_self = sorted(self_time.items(), key=lambda kv: -kv[1])[:TOP]
    return {
        "duration_ms_per_auction": session.duration * 1000 / count,
        "inclusive_ms_per_auction": {k: v * 1000 / count for k, v in inclusive.items()},
        "top_self_ms_per_auction": [(k, v * 1000 / count) for k, v in top_self],
    }
