"""Traces through real workers: each task gives one trace with its announcement, bids, award
and execution, the execution a child of the award, with opentelemetry-instrumentation-celery
alongside.

The nodes are ``bidding worker`` processes started with ``-A tests.integration.traced_app``:
each sends its spans, as an operator's would go to a collector, to one file, one JSON line a
span; this process (the caller) sends its own there too, through a tracer provider of its own.
Redis broker, the store on SQLite: what is tested is where the spans are made and how their
context travels (on the announcement, in the execution message's headers), which no store
changes. ``test_tracing.py`` runs this module in a pytest process of its own: the caller's
tracer and Celery's instrumentation are process-wide, and the other tests run untraced.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest

import bidding
from bidding import tracing
from bidding.config import get_settings
from bidding.nodes.registry import live_nodes
from tests.conftest import require
from tests.integration.app import app, failing, shared
from tests.integration.conftest import running_cluster, wait_for

pytestmark = pytest.mark.integration

try:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    from tests.integration.traced_app import TRACE_FILE_ENV, JsonLinesExporter

    MISSING = ""
except ImportError as exc:  # the otel extra is not installed
    MISSING = str(exc)


@dataclass(frozen=True)
class Span:
    """One span as the exporter wrote it."""

    name: str
    trace_id: str
    span_id: str
    parent: str | None
    attributes: dict[str, Any]
    status: str


@dataclass
class Traced:
    """The file every span of the flow (the caller's and the nodes') goes to."""

    path: Path

    def spans(self) -> list[Span]:
        """Every span written so far."""
        if not self.path.exists():
            return []
        text = self.path.read_text(encoding="utf-8")
        # A line still being appended (no newline yet) is read at the next look.
        lines = text.splitlines()[:text.count("\n")]
        return [Span(**{k: v for k, v in json.loads(line).items() if k != "pid"})
                for line in lines if line.strip()]

    def of(self, task_id: str) -> list[Span]:
        """The spans, ours and the Celery instrumentation's, of the trace(s) ``task_id``'s
        spans are in."""
        spans = self.spans()
        traces = {s.trace_id for s in spans if s.attributes.get("bidding.task_id") == task_id}
        return [s for s in spans if s.trace_id in traces]

    def finished(self, task_id: str) -> bool:
        """Whether ``task_id``'s execution spans have ended: ours and the instrumentation's
        (which ends after Celery stores the result)."""
        names = {s.name for s in self.of(task_id)}
        return tracing.EXECUTE in names and any(n.startswith("run/") for n in names)


#: The two nodes.
NODES = ("north", "south")


@pytest.fixture(scope="module")
def traced(redis_broker: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    """Two node workers (north, south) tracing to one file, and a tracer provider of this
    process's writing there too (ours through ``bidding.tracing``, and Celery's
    instrumentation's)."""
    require("the otel extra", not MISSING, MISSING)
    directory = tmp_path_factory.mktemp("tracing")
    path = directory / "spans.jsonl"
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(JsonLinesExporter(str(path))))
    instrumentor = CeleryInstrumentor()
    # This process's tracer, not the global provider: the provider can be set only once
    # per process.
    tracing._tracer = provider.get_tracer(tracing.TRACER_NAME)
    instrumentor.instrument(tracer_provider=provider)
    try:
        with running_cluster(f"sqlite:///{directory}/store.db", directory, "sqlite",
                             broker=redis_broker, nodes={n: ["shared", "alpha"] for n in NODES},
                             capacity=2, app_module="tests.integration.traced_app",
                             extra_env={"BIDDING_BID_MODE": "auto",
                                        TRACE_FILE_ENV: str(path)}):
            yield Traced(path)
    finally:
        instrumentor.uninstrument()
        tracing._tracer = None


class Stuck(AssertionError):
    """A task whose result did not come in time."""


def outcome(result: Any, timeout: float) -> Any:
    """``result.get(timeout)``; when it times out, the error carries the store's account of
    the task (its state, bids and attempts) and the nodes' liveness, so that a failure in CI
    says where the task stopped."""
    from celery.exceptions import TimeoutError as CeleryTimeout

    try:
        return result.get(timeout=timeout)
    except CeleryTimeout as exc:
        settings = get_settings(app)
        try:
            account = bidding.explain(result.id, database_url=settings.database_url).render()
        except Exception as error:  # the account is for the reader only
            account = f"(no account: {error!r})"
        live = sorted(n.name for n in live_nodes(settings, fresh=True))
        raise Stuck(f"{result.id} timed out after {timeout} s; live nodes {live}; "
                             f"broker {app.conf.broker_url}\n{account}") from exc


def named(spans: list[Span], name: str) -> list[Span]:
    return [s for s in spans if s.name == name]


def assert_one_trace(traced: Traced, task_id: str, bidders: set[str]) -> None:
    """``task_id``'s spans: one trace, rooted in its announcement, a bid per candidate, the
    award naming the winner, its score and strategy, and the execution on the winner, a child
    of the award."""
    spans = traced.of(task_id)
    assert len({s.trace_id for s in spans}) == 1
    (announce,) = named(spans, tracing.ANNOUNCE)
    assert announce.parent is None  # the task's root: the caller had no span of its own
    bids = named(spans, tracing.BID)
    assert {b.attributes["bidding.node"] for b in bids} == bidders
    (award,) = named(spans, tracing.AWARD)
    winner = award.attributes["bidding.winner"]
    assert winner in bidders
    assert award.attributes["bidding.strategy"] == "weighted"
    assert 0 < award.attributes["bidding.score"] <= 1.5
    (execute,) = named(spans, tracing.EXECUTE)
    assert execute.parent is not None and execute.parent == award.span_id
    assert execute.attributes["bidding.node"] == winner
    # opentelemetry-instrumentation-celery's spans (the execution's publish and run) are
    # in the same trace
    assert {s.name for s in spans} >= {f"apply_async/{shared.name}", f"run/{shared.name}"}


def test_a_proxied_task_gives_one_trace_down_to_its_execution(traced: Traced) -> None:
    # given two nodes bidding with the built-in function (the caller bids for them: "auto")
    # when a task is called and its result awaited
    result = shared.delay(1)
    assert outcome(result, 15) == {"node": ANY, "value": 1}
    # then its trace holds the announcement, a bid per node, the award and the execution
    # on the winner, a child of the award
    assert wait_for(lambda: traced.finished(result.id), timeout=5)
    assert_one_trace(traced, result.id, set(NODES))


def test_an_asked_task_gives_one_trace_across_the_nodes(traced: Traced) -> None:
    # given the same nodes, asked for their bids (each bids on its own listener thread and
    # the last answer's node awards)
    # when a task is called
    result = shared.apply_async((2,), bidding={"bid_mode": "ask"})
    assert outcome(result, 15) == {"node": ANY, "value": 2}
    # then its spans, made on the nodes, are still one trace, the execution under the award
    assert wait_for(lambda: traced.finished(result.id), timeout=5)
    assert_one_trace(traced, result.id, set(NODES))
    # and the nodes' bids are children of the announcement (carried on the request)
    spans = traced.of(result.id)
    (announce,) = named(spans, tracing.ANNOUNCE)
    assert {b.parent for b in named(spans, tracing.BID) if b.parent} == {announce.span_id}


def test_a_retried_task_stays_in_its_trace(traced: Traced) -> None:
    # given a task that fails on its node and is retried once, at once
    result = failing.apply_async(("boom",), bidding={"retry_policy": {
        "max_retries": 1, "backoff": "fixed", "base_ms": 0}})
    # when it has failed for good
    with pytest.raises(Exception, match="boom") as failed:
        outcome(result, 20)
    assert not isinstance(failed.value, Stuck), failed.value
    # then both attempts' auctions and executions are in the one trace
    assert wait_for(lambda: len(named(traced.of(result.id), tracing.EXECUTE)) == 2, timeout=5)
    spans = traced.of(result.id)
    assert len({s.trace_id for s in spans}) == 1
    announcements = named(spans, tracing.ANNOUNCE)
    assert sorted(a.attributes["bidding.attempt"] for a in announcements) == [1, 2]
    first = next(a for a in announcements if a.attributes["bidding.attempt"] == 1)
    second = next(a for a in announcements if a.attributes["bidding.attempt"] == 2)
    assert second.parent is not None and second.parent == first.span_id
    awards = {a.span_id for a in named(spans, tracing.AWARD)}
    assert len(awards) == 2
    assert {e.parent for e in named(spans, tracing.EXECUTE) if e.parent} == awards
    # and each failed execution says so
    assert {e.status for e in named(spans, tracing.EXECUTE)} == {"ERROR"}
