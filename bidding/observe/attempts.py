"""A task's attempts, one line each, read from its message log (pure): which node had each
attempt, how it ended and with what error, so that ``explain``, ``status`` and the caller's
error tell the whole story of a task that was retried, re-awarded or announced again."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from pydantic import BaseModel

from bidding.lifecycle import journal


class _Message(Protocol):
    kind: str
    node: str | None
    attempt: int
    detail: Any


class AttemptView(BaseModel):
    """One attempt of a task: its node(s), its outcome and its error."""

    attempt: int
    #: The nodes that held it, in order (more than one when it was re-awarded).
    nodes: list[str] = []
    #: "announced", "awarded", "running", "succeeded", "failed", "lost", "no winner",
    #: "no answer", "waiting", "escalated".
    outcome: str = "announced"
    error: str | None = None
    #: What followed it, e.g. "retried in 1.0s", "re-awarded to south".
    then: str | None = None
    #: Nodes that lost it along the way, each with why.
    lost: list[str] = []
    #: Nodes this attempt's auction was to leave out (the announcement's ``exclude_nodes``),
    #: each with why: they failed the task or lost it. One that is the only capable node is
    #: asked all the same (``auction.candidates.not_excluded``), and the text says so.
    excluded: dict[str, str] = {}

    def line(self) -> str:
        """``#2 north -> south: succeeded`` (plain text)."""
        nodes = " -> ".join(self.nodes) or "-"
        text = f"#{self.attempt} {nodes}: {self.outcome}"
        if self.error:
            text += f": {self.error}"
        if self.lost:
            text += f" (lost: {'; '.join(self.lost)})"
        if self.then:
            text += f"; {self.then}"
        return text


def exclusion_reason(node: str, earlier: Iterable[AttemptView]) -> str:
    """Why a retry leaves ``node`` out: what happened to the latest earlier attempt it held."""
    for a in sorted(earlier, key=lambda v: -v.attempt):
        taken = next((entry for entry in a.lost if entry.split(":", 1)[0] == node), None)
        if taken is not None:
            return f"attempt #{a.attempt} was moved from it ({taken.split(':', 1)[1].strip()})"
        if a.nodes and a.nodes[-1] == node:
            if a.outcome in ("failed", "lost", "expired"):
                error = f": {a.error}" if a.error else ""
                return f"it {a.outcome} attempt #{a.attempt}{error}"
            return f"it held attempt #{a.attempt} ({a.outcome})"
    return "it failed the task or lost it before"


def attempt_history(messages: Iterable[_Message]) -> list[AttemptView]:
    """The attempts of a task, oldest first, from its messages in log order."""
    views: dict[int, AttemptView] = {}

    def view(n: int) -> AttemptView:
        return views.setdefault(n, AttemptView(attempt=n))

    for m in messages:
        d = dict(m.detail or {})
        a = view(m.attempt)
        if m.kind == journal.ANNOUNCED and d.get("exclude_nodes"):
            asked = set(d.get("candidates") or ())
            earlier = [v for n, v in views.items() if n < m.attempt]
            a.excluded = {
                str(node): exclusion_reason(str(node), earlier)
                + ("; asked all the same: no other live node could do it" if node in asked
                   else "")
                for node in d["exclude_nodes"]}
        elif m.kind == journal.AWARDED and m.node:
            a.nodes.append(m.node)
            a.outcome = "awarded"
        elif m.kind == journal.REAWARDED:
            a.lost.append(f"{d.get('from', '?')}: {d.get('reason', '')}".strip())
            if d.get("to"):
                a.nodes.append(str(d["to"]))
            a.outcome = "awarded"
        elif m.kind == journal.TASK_ACCEPTED:
            a.outcome = "running"
            if m.node and m.node not in a.nodes:
                a.nodes.append(m.node)
        elif m.kind == journal.TASK_SUCCEEDED:
            a.outcome, a.error = "succeeded", None
        elif m.kind in (journal.TASK_FAILED, journal.OUTPUT_INVALID, journal.COST_EXCEEDED):
            a.outcome, a.error = "failed", d.get("error") or a.error
        elif m.kind == journal.EXPIRED:
            a.outcome, a.error = "expired", d.get("error") or a.error
        elif m.kind == journal.NO_AWARD:
            a.outcome, a.error = "no winner", d.get("error")
        elif m.kind == journal.ESCALATED:
            a.outcome, a.error = "escalated", d.get("reason") or d.get("error")
        elif m.kind == journal.RETRYING:
            # Logged under the next attempt; it says how the previous one ended.
            prev = view(int(d.get("next_attempt", m.attempt)) - 1)
            if d.get("error"):
                prev.outcome, prev.error = "failed", str(d["error"])
            else:
                prev.outcome = "lost" if prev.outcome in ("awarded", "running") else prev.outcome
                prev.error = prev.error or d.get("why")
            delay = d.get("delay_s")
            prev.then = f"retried in {delay:g}s" if isinstance(delay, (int, float)) else "retried"
        elif m.kind == journal.DEFERRED:
            if "silent_rounds" in d:  # a silent auction, announced again as the next attempt
                prev = view(m.attempt - 1)
                prev.outcome, prev.error = "no answer", d.get("reason")
                prev.then = "announced again"
            else:
                a.outcome, a.error = "waiting", d.get("reason")
    return [views[n] for n in sorted(views)]
