"""The federation's metrics in Prometheus' text format (``GET /metrics`` of ``bidding api``).

Everything is read from the store at scrape time (``prometheus_client``'s custom collector):
the counters from the message log and what retention carried (``lifecycle.tallies``), the
gauges from the tasks and nodes as they stand. Any process serving it reports the same
figures, right after it starts; none keeps state of its own.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from celery import Celery
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry
from sqlalchemy import func, or_, select

from bidding import clock
from bidding.config import Settings
from bidding.context import Context
from bidding.lifecycle import reasons as why
from bidding.lifecycle import states, tallies
from bidding.nodes.registry import query_live_nodes
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow

#: Each counter family: its help text and its label names (in order).
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    tallies.AUCTIONS: ("Auctions closed, by outcome (awarded, fallback, or why none won) and "
                       "task type", ("outcome", "task_type")),
    tallies.AWARDS: ("Awards (first awards and re-awards) by the node that won", ("node",)),
    tallies.RETRIES: ("Failed attempts retried under the task's retry policy", ()),
    tallies.REAWARDS: ("Tasks moved to another node because their winner was lost", ("reason",)),
    tallies.ESCALATIONS: ("Tasks escalated: capability (deferred too often) or watch (silent "
                          "too long)", ("source",)),
    tallies.FAILURES: ("Tasks that ended FAILED, by reason", ("reason",)),
    tallies.REFUSALS: ("Bid requests a node declined, by reason", ("reason",)),
}
#: The ``reason``/``outcome`` values each family can take, shown at 0 before they happen (so
#: that a rate over them exists from the start).
KNOWN_LABELS: dict[str, tuple[str, list[str]]] = {
    tallies.REAWARDS: ("reason", why.labels(why.REAWARD_RULES, why.REAWARD_OTHER)),
    tallies.FAILURES: ("reason", [*why.labels(why.FAILURE_RULES, why.FAILURE_OTHER),
                                  "cost_exceeded", "output_invalid"]),
    tallies.REFUSALS: ("reason", why.labels(why.REFUSAL_RULES, why.REFUSAL_OTHER)),
    tallies.ESCALATIONS: ("source", ["capability", "watch"]),
}
#: States of a task announced and not yet started on a node.
UNSTARTED = (states.BIDDING, states.ASSIGNED, states.DEFERRED)


class StoreCollector(Collector):
    """Reads every metric from the store at each scrape."""

    def __init__(self, settings: Settings, app: Celery | None = None) -> None:
        self.settings = settings
        self.app = app

    def collect(self) -> Iterator[Metric]:
        """The metric families, read now."""
        now = clock.now()
        with read_session(self.settings.database_url) as session:
            counted = tallies.counters(session)
            in_flight = dict(session.execute(
                select(AnnouncementRow.assigned_node, func.count())
                .where(AnnouncementRow.state.in_(states.IN_FLIGHT_STATES))
                .group_by(AnnouncementRow.assigned_node)).all())
            oldest = session.scalar(
                select(func.min(AnnouncementRow.announced_at)).where(or_(
                    AnnouncementRow.state.in_(UNSTARTED),
                    # waiting for a node coming back, or a scheduled start that has come
                    (AnnouncementRow.state == states.PENDING)
                    & (AnnouncementRow.due_at <= now))))
        live = query_live_nodes(self.settings)
        yield from _counters(counted)
        yield _histogram(counted)
        nodes = GaugeMetricFamily("bidding_nodes_live", "Nodes heartbeating now")
        nodes.add_metric([], len(live))
        yield nodes
        flight = GaugeMetricFamily("bidding_tasks_in_flight",
                                   "Tasks awarded to a node and not ended (ASSIGNED or "
                                   "EXECUTING), by node", labels=["node"])
        for node in sorted({n.name for n in live} | {n for n in in_flight if n}):
            flight.add_metric([node], in_flight.get(node, 0))
        yield flight
        age = GaugeMetricFamily("bidding_oldest_unassigned_seconds",
                                "Age of the oldest task announced and not yet started on a node "
                                "(0 when none waits)")
        age.add_metric([], max(0.0, now - oldest) if oldest is not None else 0.0)
        yield age
        backlog = self._journal_backlog()
        if backlog is not None:
            journal = GaugeMetricFamily("bidding_journal_backlog",
                                        "Awards written behind and not in the store yet")
            journal.add_metric([], backlog)
            yield journal

    def _journal_backlog(self) -> int | None:
        """The write-behind journal's backlog, when it is on (None otherwise)."""
        if not self.settings.award_journal or self.app is None:
            return None
        from bidding.auction.writebehind.journal import get_journal

        journal = get_journal(Context(self.settings, self.app))
        return None if journal is None else journal.backlog()


def _counters(counted: dict[tallies.Key, float]) -> Iterator[Metric]:
    by_family: dict[str, dict[tuple[str, ...], float]] = defaultdict(dict)
    for (sample, labels), value in counted.items():
        if sample in COUNTERS:
            names = COUNTERS[sample][1]
            given = dict(labels)
            by_family[sample][tuple(given.get(n, "") for n in names)] = value
    for sample, (help_text, names) in COUNTERS.items():
        values = by_family.get(sample, {})
        if sample in KNOWN_LABELS:
            for known in KNOWN_LABELS[sample][1]:
                values.setdefault((known,), 0.0)
        if not names:
            values.setdefault((), 0.0)
        family = CounterMetricFamily(sample.removesuffix("_total"), help_text,
                                     labels=list(names))
        for label_values, value in sorted(values.items()):
            family.add_metric(list(label_values), value)
        yield family


def _histogram(counted: dict[tallies.Key, float]) -> Metric:
    bucket = f"{tallies.ASSIGNMENT}_bucket"
    by_bound = {dict(labels)["le"]: value for (sample, labels), value in counted.items()
                if sample == bucket}
    bounds = [tallies.bucket_bound(b) for b in tallies.ASSIGNMENT_BUCKETS] + ["+Inf"]
    family = HistogramMetricFamily(
        tallies.ASSIGNMENT, "Seconds from a task's announcement to its award")
    family.add_metric(
        [], [(b, by_bound.get(b, 0.0)) for b in bounds],
        sum_value=counted.get((f"{tallies.ASSIGNMENT}_sum", ()), 0.0))
    return family


def registry(settings: Settings, app: Celery | None = None) -> CollectorRegistry:
    """A registry holding only the store's collector (none of the process's own metrics:
    every API process must report the same figures)."""
    found = CollectorRegistry(auto_describe=False)
    found.register(StoreCollector(settings, app))
    return found
