"""OpenTelemetry traces of each task: its announcement, each bid, the award and the execution.

Optional: with the ``otel`` extra installed and a tracer provider configured (the process's
global one, ``opentelemetry.trace.set_tracer_provider``), every hook here makes a span; else
each is one check and returns a shared do-nothing context manager. OpenTelemetry is imported
at the first hook once something else has imported it (setting a provider takes that) or the
environment names a provider; never at import time, so the library runs without it, and a
process that never traces does not load it.

One trace per task, across the processes that work on it. The caller's announcement span is
the trace's root (or a child of the caller's own span, when it announces inside one); its
context is written on the announcement (``Announcement.trace``, a W3C ``traceparent``
carrier) before the announcement is stored or sent, so a node that bids, the node or sweeper
that awards, and a later attempt's announcement all find it. The award's context travels in
the execution message's headers (``HEADER``), so the execution is a child of the award.
Where a span of ours is current (the caller's announcement, around its proxy bids and award)
the next one nests under it; elsewhere it is a child of the carried context.

This module imports nothing of bidding at run time (``docs/architecture.md``, "Traces"): the
auction, the execution and the Celery task all call it, so it sits in the lowest layer.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bidding.models import Announcement, Award

#: The instrumentation scope of every span.
TRACER_NAME = "bidding"
#: The execution message's header carrying the award span's context (a carrier: a dict of
#: ``traceparent`` and, when set, ``tracestate``); a name of its own, so that
#: opentelemetry-instrumentation-celery's ``traceparent`` header (its publish span) and ours
#: never overwrite each other.
HEADER = "bidding_trace"

ANNOUNCE = "bidding.announce"
BID = "bidding.bid"
AWARD = "bidding.award"
EXECUTE = "bidding.execute"

_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()

#: The variable naming a tracer provider the API loads at its first request.
_PROVIDER_ENV = "OTEL_PYTHON_TRACER_PROVIDER"
# The opentelemetry.trace module once imported, False when it is not installed.
_api: Any = None
# Whether the environment names a provider (the API then loads it at its first request);
# None until the first hook looks.
_from_env: bool | None = None
# The tracer, once a real provider is configured: it can be set only once per process.
_tracer: Any = None


def tracer() -> Any:
    """The tracer of ``TRACER_NAME``, or None when OpenTelemetry is not installed or no tracer
    provider is configured (the API's default provider only hands out spans that do nothing:
    skipping them costs less)."""
    global _api, _from_env, _tracer
    if _tracer is not None:
        return _tracer
    if _api is None:
        if _from_env is None:
            _from_env = _PROVIDER_ENV in os.environ
        if not _from_env and "opentelemetry.trace" not in sys.modules:
            # No provider can be set without importing the API (or naming one in the
            # environment): until something has, it is not imported here (about 3 MB).
            return None
        try:
            from opentelemetry import trace
        except ImportError:
            _api = False
            return None
        _api = trace
    if _api is False:
        return None
    # Nothing set yet: the public getter would look the environment up on every call (about
    # 1.5 us each, against 0.1 us for this).
    if getattr(_api, "_TRACER_PROVIDER", _api) is None and not _from_env:
        return None
    provider = _api.get_tracer_provider()
    if isinstance(provider, _api.ProxyTracerProvider | _api.NoOpTracerProvider):
        return None
    _tracer = provider.get_tracer(TRACER_NAME)
    return _tracer


def enabled() -> bool:
    """True when spans are being made (a provider is configured)."""
    return tracer() is not None


def inject() -> dict[str, str]:
    """The current context as a carrier (``traceparent``...), written by the global
    propagator (W3C Trace Context unless configured otherwise); empty when not tracing."""
    if tracer() is None:
        return {}
    from opentelemetry import propagate

    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


def _span_is_current() -> bool:
    from opentelemetry import trace

    return bool(trace.get_current_span().get_span_context().is_valid)


def _parent(carrier: Mapping[str, str] | None) -> Any:
    """The context a new span starts in: the current one when a span is current (ours, or
    the caller's own), else the one ``carrier`` holds (None: the current, empty, context)."""
    if not carrier or _span_is_current():
        return None
    from opentelemetry import propagate

    return propagate.extract(dict(carrier))


def _attributes(announcement: Announcement) -> dict[str, Any]:
    return {
        "bidding.task_id": announcement.task_id,
        "bidding.task_name": announcement.task_name,
        "bidding.task_type": announcement.task_type,
        "bidding.attempt": announcement.attempt,
    }


def announce_span(announcement: Announcement) -> contextlib.AbstractContextManager[Any]:
    """The announcement's span, current while the auction opens (its proxy bids and award
    nest under it). A first announcement's context is written on ``announcement.trace``; a
    later attempt's announcement (a sweeper's) is a child of that context."""
    found = tracer()
    if found is None:
        return _NULL
    return _announce_span(found, announcement)


@contextlib.contextmanager
def _announce_span(found: Any, announcement: Announcement) -> Iterator[Any]:
    with found.start_as_current_span(
        ANNOUNCE, context=_parent(announcement.trace), attributes=_attributes(announcement)
    ) as span:
        if not announcement.trace:
            announcement.trace = inject()
        yield span


def bid_span(announcement: Announcement, node: str) -> contextlib.AbstractContextManager[Any]:
    """A bid's span: ``node`` answering ``announcement`` (on the node, or by proxy)."""
    found = tracer()
    if found is None:
        return _NULL
    attributes = _attributes(announcement)
    attributes["bidding.node"] = node
    return found.start_as_current_span(  # type: ignore[no-any-return]
        BID, context=_parent(announcement.trace), attributes=attributes
    )


def note_answer(span: Any, answer: Any) -> None:
    """Put a bid's outcome on its span: its confidence, or that (and why) it refused."""
    if span is None:
        return
    if hasattr(answer, "confidence"):
        span.set_attribute("bidding.confidence", float(answer.confidence))
    else:
        span.set_attribute("bidding.refused", True)
        span.set_attribute("bidding.reason", str(getattr(answer, "reason", "")))


def award_span(announcement: Announcement, award: Award) -> contextlib.AbstractContextManager[Any]:
    """The award's span, current while the award is routed (the execution message sent in it
    carries its context): its outcome, winner, winning score and strategy."""
    found = tracer()
    if found is None:
        return _NULL
    attributes = _attributes(announcement)
    attributes.update({
        "bidding.outcome": award.outcome,
        "bidding.strategy": award.strategy,
        "bidding.closed_by": award.closed_by,
    })
    if award.winner is not None:
        attributes["bidding.winner"] = award.winner
        score = next((s.total for s in award.scores if s.node == award.winner), None)
        if score is not None:
            attributes["bidding.score"] = score
    if award.error:
        attributes["bidding.error"] = award.error
    return found.start_as_current_span(  # type: ignore[no-any-return]
        AWARD, context=_parent(announcement.trace), attributes=attributes
    )


def execution_headers(announcement: Announcement) -> dict[str, dict[str, str]]:
    """The execution message's tracing header: the current span's context (the award's), or
    without one (a sweeper resending an execution) the task's own; empty when not tracing."""
    if tracer() is None:
        return {}
    carrier = inject() if _span_is_current() else {}
    carrier = carrier or dict(announcement.trace)
    return {HEADER: carrier} if carrier else {}


def execution_span(carrier: Mapping[str, str] | None, task_id: str, task_name: str, node: str,
              attempt: int) -> contextlib.AbstractContextManager[Any]:
    """The execution's span on the winner, a child of the context its message carried
    (``execution_headers``), whatever span is current in the worker."""
    found = tracer()
    if found is None:
        return _NULL
    from opentelemetry import propagate

    return found.start_as_current_span(  # type: ignore[no-any-return]
        EXECUTE,
        context=propagate.extract(dict(carrier)) if carrier else None,
        attributes={
            "bidding.task_id": task_id,
            "bidding.task_name": task_name,
            "bidding.node": node,
            "bidding.attempt": attempt,
        },
    )
