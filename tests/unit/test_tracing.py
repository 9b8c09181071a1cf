"""bidding.tracing: nothing without a configured provider; with one, the task's context
carried on its announcement and in the execution message's headers."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from bidding import tracing
from bidding.models import Announcement, Award, Score
from tests.conftest import require

try:
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    MISSING = ""
except ImportError as exc:
    MISSING = str(exc)


def announcement(**fields: object) -> Announcement:
    return Announcement(task_id="t1", task_name="proj.extract", task_type="extract",
                        **fields)  # type: ignore[arg-type]


@pytest.fixture
def exporter(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """A configured global provider (as an application sets one), exporting to memory."""
    require("the otel extra", not MISSING, MISSING)
    found = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(found))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    monkeypatch.setattr(tracing, "_tracer", None)
    yield found


def test_without_a_provider_nothing_is_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    # given no tracer provider configured (the API's default)
    require("the otel extra", not MISSING, MISSING)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    monkeypatch.setattr(tracing, "_tracer", None)
    task = announcement()
    # when the hooks run
    with tracing.announce_span(task) as span:
        headers = tracing.execution_headers(task)
    # then no span is made, nothing is written on the announcement or the message
    assert span is None and task.trace == {} and headers == {}
    assert not tracing.enabled()


def test_without_opentelemetry_nothing_is_traced(monkeypatch: pytest.MonkeyPatch) -> None:
    # given OpenTelemetry not installed
    monkeypatch.setattr(tracing, "_api", False)
    monkeypatch.setattr(tracing, "_tracer", None)
    # when the hooks run, then they do nothing
    with tracing.bid_span(announcement(), "north") as span:
        tracing.note_answer(span, None)
    assert span is None and tracing.inject() == {}


def test_the_announcement_carries_its_spans_context(exporter: InMemorySpanExporter) -> None:
    # given a configured provider
    task = announcement()
    # when the task is announced
    with tracing.announce_span(task):
        pass
    # then its announcement carries the announcement span's W3C traceparent
    (span,) = exporter.get_finished_spans()
    assert span.name == tracing.ANNOUNCE and span.parent is None
    version, trace_id, span_id, _flags = task.trace["traceparent"].split("-")
    assert version == "00"
    assert int(trace_id, 16) == span.context.trace_id and int(span_id, 16) == span.context.span_id


def test_spans_elsewhere_are_children_of_the_carried_context(
        exporter: InMemorySpanExporter) -> None:
    # given an announcement traced in another process (its context on it)
    task = announcement()
    with tracing.announce_span(task):
        pass
    (root,) = exporter.get_finished_spans()
    # when a node bids and awards with no span current, and the award sends the execution
    with tracing.bid_span(task, "north") as bid:
        tracing.note_answer(bid, SimpleNamespace(confidence=0.8))
    award = Award(task_id="t1", outcome="awarded", winner="north", strategy="weighted",
                  closed_by="all bids in", scores=[Score(node="north", total=0.71)])
    with tracing.award_span(task, award):
        headers = tracing.execution_headers(task)
    # and the winner runs it from the message's headers
    with tracing.execution_span(headers[tracing.HEADER], "t1", "proj.extract", "north", 1):
        pass
    spans = {s.name: s for s in exporter.get_finished_spans()}
    # then every span is in the task's trace: the bid and award under the announcement,
    # the execution under the award, with their attributes
    assert {s.context.trace_id for s in spans.values()} == {root.context.trace_id}
    assert spans[tracing.BID].parent.span_id == root.context.span_id
    assert spans[tracing.BID].attributes["bidding.node"] == "north"
    assert spans[tracing.BID].attributes["bidding.confidence"] == 0.8
    assert spans[tracing.AWARD].parent.span_id == root.context.span_id
    assert dict(spans[tracing.AWARD].attributes).items() >= {
        "bidding.winner": "north", "bidding.score": 0.71, "bidding.strategy": "weighted"}.items()
    assert spans[tracing.EXECUTE].parent.span_id == spans[tracing.AWARD].context.span_id


def test_a_later_attempt_is_announced_in_the_first_ones_trace(
        exporter: InMemorySpanExporter) -> None:
    # given a task announced once (its context stored with it)
    first = announcement()
    with tracing.announce_span(first):
        pass
    # when a sweeper announces its retry, from the stored announcement
    retry = Announcement.model_validate(first.model_dump(mode="json")).model_copy(
        update={"attempt": 2})
    with tracing.announce_span(retry):
        pass
    # then the retry's announcement is a child of the first, and keeps the task's context
    one, two = exporter.get_finished_spans()
    assert two.parent.span_id == one.context.span_id
    assert retry.trace == first.trace


def test_a_resent_execution_carries_the_tasks_context(exporter: InMemorySpanExporter) -> None:
    # given a traced task, and a sweeper resending its execution with no span current
    task = announcement()
    with tracing.announce_span(task):
        pass
    # when the execution's headers are made, then they carry the task's own context
    assert tracing.execution_headers(task) == {tracing.HEADER: task.trace}
