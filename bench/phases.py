"""Phase timers and SQL counters for the benchmark's profile run (imported by bench/app.py).

Nothing in ``bidding`` is edited: the functions an auction goes through are wrapped by
replacing the module attributes they are looked up by, and SQL is counted with SQLAlchemy's
class-level events. A daemon thread watches ``<dir>/control`` ("<generation> on|off"): ``on``
installs the wrappers, ``off`` removes them, and on every new generation it writes this
process's cumulative counters to ``<dir>/<pid>.json``; the benchmark diffs two snapshots.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

_lock = threading.Lock()
#: phase -> [calls, seconds]
_phases: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
_installed = False
_local = threading.local()
#: (module, attribute, original function) of every installed wrapper.
_originals: list[tuple[Any, str, Any]] = []
#: (target, event name, listener) of every installed SQLAlchemy listener.
_listeners: list[tuple[Any, str, Any]] = []

#: (module, attribute, phase name): where the functions of one auction are looked up.
TARGETS = [
    ("bidding.task", "build_announcement", "caller.build_announcement"),
    ("bidding.task", "announce", "caller.announce (total)"),
    ("bidding.auction.announce", "live_nodes", "caller.live_nodes"),
    ("bidding.auction.announce", "select_candidates", "caller.select_candidates"),
    ("bidding.auction.routes", "request_bids", "caller.request_bids (publish)"),
    ("bidding.auction.consumer", "answer", "node.answer (bid request, total)"),
    ("bidding.auction.consumer", "place_bid", "node.place_bid (history read + bid)"),
    ("bidding.auction.consumer", "record_answer", "node.record_answer (post bid, total)"),
    # Awarded by the last bid (consumer) or at the deadline (close_expired, in close).
    ("bidding.auction.consumer", "close_auction", "node.close_auction (award, total)"),
    ("bidding.auction.close", "close_auction", "node.close_auction (award, total)"),
    ("bidding.auction.award", "in_flight_counts", "node.award.in_flight_counts"),
    ("bidding.auction.award", "bind", "node.award.bind (write)"),
    ("bidding.auction.award", "send_execution", "node.award.send_execution (publish)"),
    ("bidding.auction.sweeper", "close_expired", "node.sweeper.close_expired"),
    ("bidding.auction.sweeper", "announce_due", "node.sweeper.announce_due"),
    ("bidding.auction.sweeper", "check_winners", "node.sweeper.check_winners"),
    ("bidding.execution.attempt", "begin", "node.exec.begin (write)"),
    ("bidding.execution.attempt", "complete", "node.exec.complete (write)"),
    ("bidding.execution.attempt", "fail", "node.exec.fail (write)"),
    ("bidding.nodes.heartbeat", "heartbeat", "node.heartbeat (write)"),
]
"""Targets missing from the benchmarked version of ``bidding`` are skipped."""


def add(phase: str, seconds: float, calls: int = 1) -> None:
    """Add one observation to a phase."""
    with _lock:
        entry = _phases[phase]
        entry[0] += calls
        entry[1] += seconds


def _wrap(fn: Callable[..., Any], phase: str) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if phase.startswith("node.answer"):
            body: Any = args[3] if len(args) > 3 else kwargs.get("body")
            with contextlib.suppress(Exception):
                # Announced (caller's clock) to the moment the node starts answering.
                add("node.bid request delivery (announced -> answer starts)",
                    time.time() - float(body["announcement"]["announced_at"]))
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            add(phase, time.perf_counter() - start)

    timed.__bench_wrapped__ = True  # type: ignore[attr-defined]
    return timed


def _before(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
    _local.sql_start = time.perf_counter()


def _after(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
    took = time.perf_counter() - getattr(_local, "sql_start", time.perf_counter())
    words = statement.lstrip().split(None, 2)
    verb = " ".join(words[:2]) if words[:1] == ["BEGIN"] else (words[0] if words else "?")
    add(f"sql.{verb.upper()}", took)


def _commit(conn: Any) -> None:
    add("sql.COMMIT (transactions)", 0.0)


def _connect(dbapi_connection: Any, record: Any) -> None:
    add("sql.new DBAPI connections", 0.0)


def install_now() -> None:
    """Install the wrappers and SQL counters in this process (idempotent)."""
    global _installed
    if _installed:
        return
    import importlib

    from sqlalchemy import event
    from sqlalchemy.engine import Engine
    from sqlalchemy.pool import Pool

    for module_name, attr, phase in TARGETS:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        fn = getattr(module, attr, None)
        if fn is not None and not getattr(fn, "__bench_wrapped__", False):
            _originals.append((module, attr, fn))
            setattr(module, attr, _wrap(fn, phase))
    for target, name, fn in ((Engine, "before_cursor_execute", _before),
                             (Engine, "after_cursor_execute", _after),
                             (Engine, "commit", _commit), (Pool, "connect", _connect)):
        event.listen(target, name, fn)
        _listeners.append((target, name, fn))
    _installed = True


def uninstall() -> None:
    """Put the original functions back and remove the SQL listeners."""
    global _installed
    from sqlalchemy import event

    while _originals:
        module, attr, fn = _originals.pop()
        setattr(module, attr, fn)
    while _listeners:
        target, name, fn = _listeners.pop()
        with contextlib.suppress(Exception):
            event.remove(target, name, fn)
    _installed = False


def snapshot() -> dict[str, list[float]]:
    """A copy of this process's counters."""
    with _lock:
        return {k: list(v) for k, v in _phases.items()}


def _watch(directory: Path) -> None:
    control = directory / "control"
    seen = 0
    while True:
        time.sleep(0.2)
        try:
            generation_text, mode = control.read_text().split()
            generation = int(generation_text)
        except (OSError, ValueError):
            continue
        try:
            if mode == "on" and not _installed:
                install_now()
            elif mode == "off" and _installed:
                uninstall()
        except Exception as exc:  # keep answering; the benchmark shows what is missing
            add(f"trace error: {type(exc).__name__}: {exc}", 0.0)
        if generation != seen:
            seen = generation
            out = directory / f"{os.getpid()}.json"
            tmp = out.with_suffix(".tmp")
            tmp.write_text(json.dumps({"generation": generation, "phases": snapshot()}))
            tmp.replace(out)


def install(directory: str) -> None:
    """Start watching ``directory`` for the benchmark's requests (see the module docstring)."""
    path = Path(directory)
    threading.Thread(target=_watch, args=(path,), name="bench-trace", daemon=True).start()
