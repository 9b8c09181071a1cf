"""The markdown report of ``bench/fifo_vs_bidding.py``: only what that run measured."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from bench.common.markdown import row, rule
from bench.realworkers.summary import TrueP, oracle

COLUMNS = ("policy", "success", "first half", "second half", "expected (mean true p)",
           "expected, second half", "type a", "type b")
NODE_COLUMNS = ("node", "true p (a / b)", "FIFO tasks a / b (ok)", "bidding tasks a / b (ok)",
                "bidding second half a / b")


def pct(value: float) -> str:
    """A share as a percentage with one decimal."""
    return f"{value:.1%}"


def render(res: dict[str, Any], args: argparse.Namespace, command: str, true_p: TrueP,
           runtime: float) -> str:
    """The report: the run's settings, each policy's rates, tasks per node, the ranking."""
    fifo, bid = res["fifo"], res["bidding"]
    lines = [
        "## FIFO vs bidding, real workers (bench/fifo_vs_bidding.py)", "",
        f"Command: `{command}`; seed {args.seed}; {args.tasks} tasks per policy, types a/b "
        f"({args.order}, same sequence for both), submitted at {args.rate:g}/s; "
        "4 node workers (prefork -c 1, capacity 1), "
        f"embedded Redis + SQLite; strategy {res['strategy']}; runtime {runtime:.0f} s.", "",
        row(COLUMNS), rule(len(COLUMNS)),
    ]
    for name, s in (("FIFO", fifo), ("bidding", bid)):
        lines.append(row([name, f"{pct(s['rate'])} ({s['ok']}/{s['n']})", pct(s["first"]),
                          pct(s["second"]), pct(s["expected"]), pct(s["expected_second"]),
                          pct(s["by_type"]["a"]), pct(s["by_type"]["b"])]))
    lines += ["", f"Oracle (each type on its best node): {pct(oracle(true_p))}.", "",
              row(NODE_COLUMNS), rule(len(NODE_COLUMNS))]
    second = res["bidding_second_per_node"]
    nodes = [*true_p, *sorted({*fifo["per_node"], *bid["per_node"]} - set(true_p))]
    for node in nodes:
        p = true_p.get(node, {})
        f, b, s2 = (fifo["per_node"].get(node, Counter()), bid["per_node"].get(node, Counter()),
                    second.get(node, Counter()))
        lines.append(row([node, f"{p.get('a', 0):.2f} / {p.get('b', 0):.2f}",
                          f"{f['a']} / {f['b']} ({f['ok']})", f"{b['a']} / {b['b']} ({b['ok']})",
                          f"{s2['a']} / {s2['b']}"]))
    verdict = ("bidding above FIFO" if bid["rate"] > fifo["rate"] else
               "bidding NOT above FIFO")
    lines += ["", f"Ranking: {verdict} ({pct(bid['rate'])} vs {pct(fifo['rate'])}; "
              f"bidding's second half {pct(bid['second'])}). States: FIFO "
              f"{dict(fifo['states'])}, bidding {dict(bid['states'])}."]
    return "\n".join(lines)
