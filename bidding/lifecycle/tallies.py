"""The federation's counters, read from the store: how many auctions, awards, retries,
re-awards, escalations, final failures and refusals the message log holds, by label.

A counter is what the log holds now plus what retention pruned from it (``carry`` adds the
pruned tasks' counts to ``bidding_metric_totals`` in the prune's own transaction), so it never
goes down and is right at once after any process restarts: nothing is kept in memory. Each
family is one aggregate query over the messages of its kinds (the log's index on ``kind``);
free-text reasons become a few fixed labels in SQL (``lifecycle.reasons``), so a scrape reads
a few dozen rows, not one per message.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Select, and_, bindparam, case, func, literal, select
from sqlalchemy.orm import Session

from bidding.lifecycle import journal
from bidding.lifecycle import reasons as why
from bidding.store.schema import AnnouncementRow, Message, MetricTotal

#: A sample: its name, and its labels as sorted (name, value) pairs.
Key = tuple[str, tuple[tuple[str, str], ...]]

AUCTIONS = "bidding_auctions_total"
AWARDS = "bidding_awards_total"
RETRIES = "bidding_retries_total"
REAWARDS = "bidding_reawards_total"
ESCALATIONS = "bidding_escalations_total"
FAILURES = "bidding_task_failures_total"
REFUSALS = "bidding_bid_refusals_total"
ASSIGNMENT = "bidding_assignment_seconds"
#: Upper bounds (seconds) of the assignment histogram's buckets: an auction is milliseconds
#: when bids are proxied, its window (2 s by default) when nodes are asked.
ASSIGNMENT_BUCKETS: tuple[float, ...] = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                                         5.0, 10.0, 30.0, 60.0)


def _key(sample: str, **labels: Any) -> Key:
    return sample, tuple(sorted((k, str(v)) for k, v in labels.items()))


def _text(column: str) -> ColumnElement[str]:
    """A string field of a message's JSON detail, '' when absent."""
    return func.coalesce(Message.detail[column].as_string(), "")


def _label(text: ColumnElement[str], rules: why.Rules, other: str) -> ColumnElement[str]:
    """``reasons.classify`` in SQL: the first rule whose fragment the text holds."""
    lowered = func.lower(text)
    return case(*((lowered.contains(fragment, autoescape=True), literal(label))
                  for fragment, label in rules), else_=literal(other))


def _where(kinds: Sequence[str], scoped: bool) -> ColumnElement[bool]:
    condition: ColumnElement[bool] = Message.kind.in_(kinds)
    if scoped:
        condition = and_(condition, Message.task_id.in_(bindparam("ids", expanding=True)))
    return condition


def _grouped(*columns: Any, kinds: Sequence[str], scoped: bool,
             with_type: bool = False) -> Select[Any]:
    chosen = [*columns, func.count()]
    query = select(*chosen).select_from(Message)
    if with_type:
        query = query.outerjoin(AnnouncementRow, AnnouncementRow.task_id == Message.task_id)
    return query.where(_where(kinds, scoped)).group_by(*columns)


def _queries(scoped: bool) -> list[tuple[Select[Any], Any]]:
    """Each family's query, and how a row of it becomes samples."""
    task_type = func.coalesce(AnnouncementRow.task_type, "unknown")
    failure = case((Message.kind == journal.COST_EXCEEDED, literal("cost_exceeded")),
                   (Message.kind == journal.OUTPUT_INVALID, literal("output_invalid")),
                   else_=_label(_text("error"), why.FAILURE_RULES, why.FAILURE_OTHER))
    latency = Message.detail["latency_ms"].as_float()
    buckets = [func.sum(case((latency <= bound * 1000.0, 1), else_=0))
               for bound in ASSIGNMENT_BUCKETS]
    return [
        (_grouped(func.coalesce(_text("outcome"), "awarded"), task_type,
                  kinds=[journal.AWARDED], scoped=scoped, with_type=True),
         lambda outcome, kind, n: [(_key(AUCTIONS, outcome=outcome or "awarded",
                                         task_type=kind), n)]),
        (_grouped(_label(_text("error"), why.NO_AWARD_RULES, why.NO_AWARD_OTHER), task_type,
                  kinds=[journal.NO_AWARD], scoped=scoped, with_type=True),
         lambda outcome, kind, n: [(_key(AUCTIONS, outcome=outcome, task_type=kind), n)]),
        (_grouped(func.coalesce(Message.node, ""), kinds=[journal.AWARDED, journal.REAWARDED],
                  scoped=scoped),
         lambda node, n: [(_key(AWARDS, node=node), n)]),
        (_grouped(_label(_text("reason"), why.REAWARD_RULES, why.REAWARD_OTHER),
                  kinds=[journal.REAWARDED], scoped=scoped),
         lambda reason, n: [(_key(REAWARDS, reason=reason), n)]),
        (_grouped(kinds=[journal.RETRYING], scoped=scoped),
         lambda n: [(_key(RETRIES), n)]),
        (_grouped(Message.kind, kinds=[journal.ESCALATED, journal.WATCH_ESCALATED],
                  scoped=scoped),
         lambda kind, n: [(_key(ESCALATIONS, source="capability" if kind == journal.ESCALATED
                                else "watch"), n)]),
        # An auction without a winner fails its task (NO_AWARD); the other paths to FAILED
        # say TASK_FAILED, or why a finished attempt's result was refused.
        (_grouped(failure, kinds=[journal.TASK_FAILED, journal.NO_AWARD, journal.COST_EXCEEDED,
                                  journal.OUTPUT_INVALID], scoped=scoped),
         lambda reason, n: [(_key(FAILURES, reason=reason), n)]),
        (_grouped(_label(_text("reason"), why.REFUSAL_RULES, why.REFUSAL_OTHER),
                  kinds=[journal.REFUSED], scoped=scoped),
         lambda reason, n: [(_key(REFUSALS, reason=reason), n)]),
        (select(*buckets, func.coalesce(func.sum(latency), 0.0), func.count())
         .select_from(Message).where(_where([journal.AWARDED], scoped)),
         _histogram),
    ]


def _histogram(*row: Any) -> list[tuple[Key, float]]:
    *counts, total_ms, n = row
    samples = [(_key(f"{ASSIGNMENT}_bucket", le=bucket_bound(bound)), float(c or 0))
               for bound, c in zip(ASSIGNMENT_BUCKETS, counts, strict=True)]
    samples.append((_key(f"{ASSIGNMENT}_bucket", le="+Inf"), float(n or 0)))
    samples.append((_key(f"{ASSIGNMENT}_sum"), float(total_ms or 0) / 1000.0))
    samples.append((_key(f"{ASSIGNMENT}_count"), float(n or 0)))
    return samples


def bucket_bound(value: float) -> str:
    """A bucket bound as Prometheus' client writes it (``0.005``, ``1.0``, ``60.0``)."""
    return repr(float(value))


def count(session: Session, task_ids: Sequence[str] | None = None) -> dict[Key, float]:
    """Every counter sample the log holds (only ``task_ids``' messages when given)."""
    found: dict[Key, float] = defaultdict(float)
    params = {"ids": list(task_ids)} if task_ids is not None else {}
    for query, samples in _queries(scoped=task_ids is not None):
        for row in session.execute(query, params):
            for key, value in samples(*row):
                found[key] += float(value or 0)
    return dict(found)


def _labels_text(labels: Iterable[tuple[str, str]]) -> str:
    return json.dumps(list(labels), separators=(",", ":"))


def carried(session: Session) -> dict[Key, float]:
    """What retention pruned from the log, by sample."""
    return {(row.sample, tuple((k, v) for k, v in json.loads(row.labels))): row.value
            for row in session.scalars(select(MetricTotal))}


def counters(session: Session) -> dict[Key, float]:
    """Every counter sample: what the log holds plus what retention pruned from it."""
    total = defaultdict(float, carried(session))
    for key, value in count(session).items():
        total[key] += value
    return dict(total)


def carry(session: Session, task_ids: Sequence[str]) -> None:
    """Add what ``task_ids``' messages count to the pruned totals: called by the prune in its
    own transaction, before it deletes them."""
    for (sample, labels), value in count(session, task_ids).items():
        if not value:
            continue
        # Locked: a second prune at once (`bidding prune` beside the nodes' job) adds after.
        row = session.get(MetricTotal, (sample, _labels_text(labels)), with_for_update=True)
        if row is None:
            session.add(MetricTotal(sample=sample, labels=_labels_text(labels), value=value))
        else:
            row.value += value
    session.flush()
