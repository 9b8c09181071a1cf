"""Submit one task of each kind, wait for the results and say which node won each auction.

Run from examples/tour/ (``python submit.py``) while the nodes run.
"""

import bidding
from proj.celery import app
from proj.tasks import read_scan, summarize, top_terms

TEXT = ("Contract net protocols announce a task, collect bids from the nodes that could do it, "
        "and award the task to the best bid. Bids carry confidence, load and cost.")

submitted = [
    (read_scan, read_scan.delay("invoice-0042-acme-corp.png")),  # only lens has "ocr"
    (top_terms, top_terms.delay(TEXT)),                          # lens and quill both bid
    (summarize, summarize.delay(TEXT)),                          # quill has both skills
]
for task, result in submitted:
    value = result.get(timeout=30)  # the task's own return value
    winner = bidding.explain(result.id, app=app).winner  # read from the store
    print(f"{result.id}  {task.name:<16} won by {winner!s:<6} -> {value!r}")
print(f"\nexplain the last one: bidding explain {submitted[-1][1].id} -A proj")
