"""Traces through real workers: each task gives one trace with its announcement, bids, award
and execution, the execution a child of the award, with opentelemetry-instrumentation-celery
alongside.

The nodes are Celery workers started in this process (``celery.contrib.testing.worker``, a
thread pool), so that the SDK's in-memory exporter sees their spans as well as the caller's.
Redis broker, the store on SQLite: what is tested is where the spans are made and how their
context travels (on the announcement, in the execution message's headers), which no store
changes. ``test_tracing.py`` runs this module in a pytest process of its own.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import pytest
import redis

import bidding
from bidding import tracing
from bidding.config import get_settings, reset_settings
from bidding.nodes.profile import PROFILE_ENV, exec_queue
from bidding.nodes.registry import invalidate_cache, live_nodes
from bidding.store import upgrade
from bidding.store.migrate import forget_schema_checks
from tests.conftest import require
from tests.integration.app import app, failing, shared
from tests.integration.conftest import (
    BROKER,
    _check,
    _repoint,
    restore_app,
    wait_for,
    write_profile,
)

pytestmark = pytest.mark.integration

try:
    from opentelemetry.instrumentation.celery import CeleryInstrumentor
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    MISSING = ""
except ImportError as exc:  # the otel extra is not installed
    MISSING = str(exc)


@dataclass
class Traced:
    """The exporter every span of this process (caller and in-process nodes) goes to."""

    exporter: Any

    def of(self, task_id: str) -> list[ReadableSpan]:
        """The spans, ours and the Celery instrumentation's, of the trace(s) ``task_id``'s
        spans are in."""
        spans = list(self.exporter.get_finished_spans())
        traces = {s.context.trace_id for s in spans
                  if (s.attributes or {}).get("bidding.task_id") == task_id}
        return [s for s in spans if s.context.trace_id in traces]

    def finished(self, task_id: str) -> bool:
        """Whether ``task_id``'s execution spans have ended: ours and the instrumentation's
        (which ends after Celery stores the result)."""
        names = {s.name for s in self.of(task_id)}
        return tracing.EXECUTE in names and any(n.startswith("run/") for n in names)


#: The two nodes, named afresh each run: a node worker another module left running on the
#: same broker (a north of its cluster) must not take this module's executions.
NODES = tuple(f"{side}-{uuid.uuid4().hex[:6]}" for side in ("north", "south"))


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Traced]:
    """Two nodes (north, south) as worker threads of this process, a tracer provider with the
    in-memory exporter (ours through ``bidding.tracing``, and Celery's instrumentation's)."""
    require("the otel extra", not MISSING, MISSING)
    # The broker's db only (the session's redis_broker fixture flushes the counters' too).
    ok, reason = _check(lambda: redis.Redis.from_url(BROKER, socket_connect_timeout=2).ping())
    require("Redis", ok, f"{BROKER}: {reason}")
    redis.Redis.from_url(BROKER).flushdb()
    redis_broker = BROKER
    directory = tmp_path_factory.mktemp("tracing")
    database_url = f"sqlite:///{directory}/store.db"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = CeleryInstrumentor()
    env = {"BIDDING_DATABASE_URL": database_url, "BIDDING_HEARTBEAT_INTERVAL": "1",
           "BIDDING_BID_MODE": "auto"}
    saved_env = {k: os.environ.get(k) for k in (*env, PROFILE_ENV)}
    saved_conf = (app.conf.broker_url, app.conf.result_backend)
    os.environ.update(env)
    _repoint(app, redis_broker, redis_broker)
    reset_settings(app)
    forget_schema_checks()
    invalidate_cache()
    upgrade(database_url)
    # This process's tracer, not the global provider: the provider can be set only once
    # per process, and the other tests in it must run untraced.
    tracing._tracer = provider.get_tracer(tracing.TRACER_NAME)
    instrumentor.instrument(tracer_provider=provider)
    try:
        with _nodes(directory, NODES):
            settings = get_settings(app)
            assert wait_for(lambda: set(NODES) <= {
                n.name for n in live_nodes(settings, fresh=True)}, timeout=20)
            yield Traced(exporter)
    finally:
        instrumentor.uninstrument()
        tracing._tracer = None
        restore_app(app, saved_env, saved_conf)


@contextmanager
def _nodes(directory: Path, names: tuple[str, ...]) -> Iterator[None]:
    """Node workers (thread pools) in threads of this process, as
    ``celery.contrib.testing.worker.start_worker`` starts one; stopped together, since
    Celery's signal to stop is one flag for the whole process."""
    from celery._state import _set_task_join_will_block
    from celery.contrib.testing.worker import TestWorkController, setup_app_for_worker
    from celery.worker import state

    setup_app_for_worker(app, "WARNING", None)
    threads: list[threading.Thread] = []
    try:
        for name in names:
            profile = write_profile(directory, name, ["shared", "alpha"], capacity=2)
            # Each node's steps read their profile as they start: one after the other.
            os.environ[PROFILE_ENV] = str(profile)
            reset_settings(app)
            worker = TestWorkController(
                app=app, concurrency=2, pool="threads", hostname=f"{name}@tracing",
                loglevel="WARNING", logfile=None, ready_callback=None, without_heartbeat=True,
                without_mingle=True, without_gossip=True, queues=[exec_queue(name)])
            threads.append(threading.Thread(target=worker.start, daemon=True))
            threads[-1].start()
            worker.ensure_started()
        _set_task_join_will_block(False)
        yield
    finally:
        state.should_terminate = 0
        for thread in threads:
            thread.join(20)
        state.should_terminate = None


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


def named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def assert_one_trace(traced: Traced, task_id: str, bidders: set[str]) -> None:
    """``task_id``'s spans: one trace, rooted in its announcement, a bid per candidate, the
    award naming the winner, its score and strategy, and the execution on the winner, a child
    of the award."""
    spans = traced.of(task_id)
    assert len({s.context.trace_id for s in spans}) == 1
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
    assert execute.parent is not None and execute.parent.span_id == award.context.span_id
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
    assert {b.parent.span_id for b in named(spans, tracing.BID) if b.parent} == {
        announce.context.span_id}


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
    assert len({s.context.trace_id for s in spans}) == 1
    announcements = named(spans, tracing.ANNOUNCE)
    assert sorted(a.attributes["bidding.attempt"] for a in announcements) == [1, 2]
    first = next(a for a in announcements if a.attributes["bidding.attempt"] == 1)
    second = next(a for a in announcements if a.attributes["bidding.attempt"] == 2)
    assert second.parent is not None and second.parent.span_id == first.context.span_id
    awards = {a.context.span_id for a in named(spans, tracing.AWARD)}
    assert len(awards) == 2
    assert {e.parent.span_id for e in named(spans, tracing.EXECUTE) if e.parent} == awards
    # and each failed execution says so
    assert {e.status.status_code.name for e in named(spans, tracing.EXECUTE)} == {"ERROR"}
