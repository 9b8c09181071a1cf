"""The protocol checker run over the store's message log (``bidding check``, ``bidding stats``):
every task, the tasks named, or those announced since a time; one task's messages at a time,
in log order."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from itertools import groupby
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Select, and_, or_, select

from bidding.observe.checker import Violation, check_task
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow, Message

#: Rows fetched at a time: the log of a large store is read in pieces, not held at once.
BATCH = 2000


class CheckReport(BaseModel):
    """The checker's verdict over a set of tasks."""

    #: Tasks whose logs were checked.
    tasks: int
    violations: list[Violation]
    #: Task ids asked for that have no message in the log.
    missing: list[str] = []

    @property
    def ok(self) -> bool:
        """Every task checked keeps the protocol, and every one asked for was found."""
        return not self.violations and not self.missing

    def by_rule(self) -> dict[str, int]:
        """How many violations of each rule, most frequent first."""
        return dict(Counter(v.rule for v in self.violations).most_common())

    def offending(self) -> list[str]:
        """The ids of the tasks with a violation, in the order found."""
        return list(dict.fromkeys(v.task_id for v in self.violations))

    def render(self) -> str:
        """One line per violation, then the summary (plain text)."""
        lines = [v.line() for v in self.violations]
        lines += [f"{t}: not in the message log" for t in self.missing]
        if not self.violations:
            lines.append(f"checked {self.tasks} task(s): every one keeps the protocol")
        else:
            rules = ", ".join(f"{rule} {n}" for rule, n in self.by_rule().items())
            lines.append(f"checked {self.tasks} task(s): {len(self.violations)} violation(s) "
                         f"in {len(self.offending())} task(s) ({rules})")
        return "\n".join(lines)


def _query(task_ids: Sequence[str] | None, since: float) -> Select[Any]:
    query = select(Message.id, Message.task_id, Message.kind, Message.node, Message.attempt,
                   Message.detail)
    if task_ids:
        query = query.where(Message.task_id.in_(list(task_ids)))
    if since > 0:
        # A task is in the window when it was announced since (as ``bidding stats`` counts);
        # a message of no known task, when it was written since.
        query = query.outerjoin(AnnouncementRow, AnnouncementRow.task_id == Message.task_id).where(
            or_(AnnouncementRow.announced_at >= since,
                and_(AnnouncementRow.task_id.is_(None), Message.at >= since)))
    return query.order_by(Message.task_id, Message.id)


def _logs(database_url: str, task_ids: Sequence[str] | None, since: float
          ) -> Iterator[tuple[str, list[Any]]]:
    # In a transaction: PostgreSQL's server-side cursor (``yield_per``) needs one.
    with read_session(database_url, in_transaction=True) as session:
        rows = session.execute(_query(task_ids, since).execution_options(yield_per=BATCH))
        for task_id, messages in groupby(rows, key=lambda row: row.task_id):
            yield str(task_id), list(messages)


def check_log(database_url: str, task_ids: Sequence[str] | None = None,
              since: float = 0.0) -> CheckReport:
    """Check the log of every task in the store (or of ``task_ids``; or of the tasks announced
    since ``since``, Unix time) against the protocol."""
    violations: list[Violation] = []
    seen: set[str] = set()
    for task_id, messages in _logs(database_url, task_ids, since):
        seen.add(task_id)
        violations += check_task(task_id, messages)
    missing = [t for t in dict.fromkeys(task_ids or ()) if t not in seen]
    return CheckReport(tasks=len(seen), violations=violations, missing=missing)
