"""The few words a metric's ``reason`` or ``outcome`` label takes, from the free text the log
keeps (pure).

A label must have a small, fixed set of values: a Prometheus series per distinct error text
would grow without end. Each rule is a fragment of the text (matched case-insensitively,
anywhere in it) and the label it gives; the first matching rule wins and the last label is the
catch-all. The same rules run in Python (``classify``) and in SQL (``tallies`` builds a CASE
from them), so a count read from the store and a text classified here agree.
"""

from __future__ import annotations

from collections.abc import Sequence

Rules = Sequence[tuple[str, str]]

#: Why an auction closed without a winner (a NO_AWARD message's error).
NO_AWARD_RULES: Rules = (
    ("no bidders registered", "no_bidders"),
    ("minimum confidence", "no_confident_bids"),
    ("no bids received", "no_bids"),
    ("budget", "over_budget"),
    ("trust", "untrusted"),
)
NO_AWARD_OTHER = "no_award"

#: Why a task failed for good (a TASK_FAILED or NO_AWARD message's error).
FAILURE_RULES: Rules = (
    ("expired", "expired"),
    ("deadline", "deadline"),
    ("no bidders registered", "no_bidders"),
    ("minimum confidence", "no_confident_bids"),
    ("no bids", "no_bids"),
    ("timelimitexceeded", "timeout"),
    ("time limit", "timeout"),
    ("revoked", "revoked"),
    ("not registered", "not_registered"),
    ("cannot run", "not_registered"),
    ("stopped heartbeating", "node_lost"),
    ("restarted", "node_lost"),
    ("did not start", "node_lost"),
    ("lost", "node_lost"),
    ("escalat", "escalated"),
    ("budget", "cost_exceeded"),
)
FAILURE_OTHER = "task_error"

#: Why a task went to another node (a REAWARDED message's reason).
REAWARD_RULES: Rules = (
    ("stopped heartbeating", "node_offline"),
    ("restarted", "worker_restarted"),
    ("did not start", "start_timeout"),
)
REAWARD_OTHER = "other"

#: Why a node declined to bid (a REFUSED message's reason).
REFUSAL_RULES: Rules = (
    ("deadline", "deadline"),
    ("expired", "expired"),
    ("no matching capability", "no_capability"),
    ("not registered", "not_registered"),
    ("overloaded", "overloaded"),
    ("profile", "misconfigured"),
    ("bid failed", "bid_error"),
    ("could not ask its bidder", "bidder_error"),
    ("timed out", "bidder_error"),
)
#: A node's own bidder said no, in its own words.
REFUSAL_OTHER = "declined"


def classify(text: str | None, rules: Rules, other: str) -> str:
    """The label of ``text`` under ``rules`` (its first matching fragment), else ``other``."""
    lowered = (text or "").lower()
    return next((label for fragment, label in rules if fragment in lowered), other)


def labels(rules: Rules, other: str) -> list[str]:
    """Every label ``rules`` can give, the catch-all last (each once)."""
    return list(dict.fromkeys([*(label for _, label in rules), other]))
