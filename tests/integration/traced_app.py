"""The integration tests' app, traced: a node worker started with ``-A`` this module sends
every span it makes (ours, and opentelemetry-instrumentation-celery's) to the file that
``BIDDING_IT_TRACE_FILE`` names, one JSON object a line, as an operator's worker would send
them to a collector. ``tracing_flow.py`` reads them back.

Spans are exported as each ends (``SimpleSpanProcessor``: no thread, so a prefork pool's
processes, forked after this import, export as their parent does), each batch one append.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from tests.integration.app import app, failing, shared

__all__ = ["TRACE_FILE_ENV", "JsonLinesExporter", "app", "failing", "shared", "span_record"]

#: The variable naming the file the spans go to.
TRACE_FILE_ENV = "BIDDING_IT_TRACE_FILE"


def span_record(span: ReadableSpan) -> dict[str, Any]:
    """What the flow asserts on, of one span: its name, ids (hex), parent, attributes and
    status."""
    context = span.context
    return {
        "name": span.name,
        "trace_id": format(context.trace_id, "032x") if context else None,
        "span_id": format(context.span_id, "016x") if context else None,
        "parent": format(span.parent.span_id, "016x") if span.parent else None,
        "attributes": dict(span.attributes or {}),
        "status": span.status.status_code.name,
        "pid": os.getpid(),
    }


class JsonLinesExporter(SpanExporter):
    """Append each span, as a JSON line, to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = "".join(json.dumps(span_record(s), default=str) + "\n" for s in spans)
        # One write in append mode: lines from several processes never interleave.
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """Nothing held open."""


if os.environ.get(TRACE_FILE_ENV):
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(
        os.environ[TRACE_FILE_ENV])))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument(tracer_provider=provider)
