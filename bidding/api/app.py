"""``create_app(celery_app)``: the AITP endpoints (seed 004 section 8) and the views behind
``bidding explain``, ``bidding nodes`` and ``bidding stats``, as a FastAPI application.

Every route reads the store or calls the function the command line calls: ``bidding.submit``,
``task_status``, ``graph_progress``, ``explain``, ``node_views``, ``stats.collect``,
``recent_auctions``, ``assignments_over_time``. The dashboard (``api.dashboard``) is served at
``/`` and reads these routes only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from celery import Celery
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, status
from fastapi.responses import JSONResponse, Response
from kombu.exceptions import OperationalError as BrokerError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel
from sqlalchemy.exc import DataError, OperationalError

from bidding import clock
from bidding.api.auth import read_access, write_access
from bidding.api.dashboard import mount_dashboard
from bidding.api.limits import BodyLimit
from bidding.api.models import FINAL, NotDone, Problem, Submitted, TaskResult, TaskState, aitp_state
from bidding.app import install
from bidding.config import get_settings
from bidding.errors import ConfigurationError, UnknownTaskError
from bidding.graphs.progress import GraphProgress, graph_progress, is_graph
from bidding.graphs.spec import TaskDefinition
from bidding.graphs.submit import submit
from bidding.graphs.validate import GraphValidationError
from bidding.observe.auctions import MAX_LIMIT, AuctionFeed, recent_auctions
from bidding.observe.explain import Explanation, explain
from bidding.observe.history import AuctionFilter, Outcome
from bidding.observe.listing import MAX_LIMIT as LIST_LIMIT
from bidding.observe.listing import TaskSummary, list_tasks
from bidding.observe.metrics import registry
from bidding.observe.nodes import NodeView, node_views
from bidding.observe.reset import ResetOutcome, reset
from bidding.observe.stats import Stats, collect, window_start
from bidding.observe.status import TaskStatus, task_status
from bidding.observe.timeline import MAX_BUCKETS, Timeline, assignments_over_time
from bidding.store import ensure_schema, store_label

T = TypeVar("T")

_401: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "A token is set and the request has not got it"}}
_404: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "No task with this id in the store"}}
_503: dict[int | str, dict[str, Any]] = {
    503: {"model": Problem, "description": "The store (or, for a write, the broker) cannot "
          "be reached"}}
#: What every write may answer besides, whatever it does.
_WRITE: dict[int | str, dict[str, Any]] = {
    **_401,
    403: {"model": Problem, "description": "A write without a bearer token, the "
          "X-Bidding-Request header or a JSON body: one a web page on another site could "
          "send"},
    413: {"model": Problem, "description": "The body is over bidding_api_max_body_bytes"},
    **_503}


#: The largest id the message log holds: its id column is a 32-bit INTEGER on PostgreSQL.
_MAX_ID = 2**31 - 1
#: A task's id in a path. No store can hold a NUL character (PostgreSQL refuses it in text),
#: so an id with one is refused as such (422) instead of failing in the store (500).
TaskId = Annotated[str, Path(pattern=r"^[^\x00]+$", description="a task graph's id (POST "
                             "/aitp/tasks) or a bidding task's (.delay())")]


class GraphReset(BaseModel):
    """What a reset of a task graph cleared: each announced subtask's, by subtask id."""

    task_id: str
    subtasks: dict[str, ResetOutcome]


class GraphBids(BaseModel):
    """The bids of a task graph: each subtask's auction, by subtask id."""

    task_id: str
    subtasks: dict[str, Explanation]


def _estimate_graph(p: GraphProgress, now: float) -> float | None:
    if p.finished_at is not None:
        return p.finished_at
    done = sum(1 for s in p.steps if s.status == "COMPLETED")
    if not done or not p.total_steps:
        return None
    return p.created_at + (now - p.created_at) * p.total_steps / done


def _estimate_task(s: TaskStatus, now: float) -> float | None:
    if s.finished_at is not None:
        return s.finished_at
    percent = s.progress.get("percent")
    if not s.started_at or not isinstance(percent, (int, float)) or percent <= 0:
        return None
    return s.started_at + (now - s.started_at) * 100.0 / float(percent)


def _graph_state(p: GraphProgress) -> TaskState:
    return TaskState(
        task_id=p.task_id, status=p.status, state=p.status,
        progress=p.model_dump(include={"current_step", "total_steps", "percent_complete",
                                       "steps"}),
        current_step=p.current_step, estimated_completion=_estimate_graph(p, clock.now()),
        cost_so_far=p.cost, tags=p.tags, created_by=p.created_by,
        estimated_cost=p.estimated_cost, actual_cost=p.cost,
        ledger=[e.model_dump() for e in p.ledger], remaining_budget=p.remaining_budget)


def _task_state(s: TaskStatus) -> TaskState:
    return TaskState(
        task_id=s.task_id, status=aitp_state(s.state), state=s.state, progress=s.progress,
        current_step=1, estimated_completion=_estimate_task(s, clock.now()),
        cost_so_far=s.cost_so_far, watch=s.watch, parked=s.parked, priority=s.priority,
        expires_at=s.expires_at, tags=s.tags,
        created_by=s.created_by, estimated_cost=s.estimated_cost, actual_cost=s.actual_cost,
        ledger=[e.model_dump() for e in s.ledger], remaining_budget=s.remaining_budget)


def _per_step(url: str, graph_id: str, fn: Callable[[str], T]) -> dict[str, T]:
    """``fn`` of each announced subtask of a graph, by step id (a step not announced yet has
    nothing to show or clear)."""
    found: dict[str, T] = {}
    for step in graph_progress(url, graph_id).steps:
        try:
            found[step.step_id] = fn(step.task_id)
        except UnknownTaskError:
            continue
    return found


def _not_found(exc: UnknownTaskError) -> HTTPException:
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=str(exc))


def create_app(celery_app: Celery) -> FastAPI:
    """The API of ``celery_app``'s federation: its store, its capability tasks."""
    install(celery_app)
    settings = get_settings(celery_app)
    url = settings.database_url
    def store_ready() -> None:
        # The store's schema is checked (and migrated) once per process; a store that cannot
        # be opened (a SQLite folder that does not exist, a server down) is a 503, not a 500.
        try:
            ensure_schema(url)
        except ConfigurationError as exc:
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, detail=str(exc)) from None

    reads = [Depends(read_access(settings)), Depends(store_ready)]
    writes = [Depends(write_access(settings)), Depends(store_ready)]
    api = FastAPI(title="celery-bidding AITP API", version="0.1.0",
                  description="Seed 004 section 8: submit a task definition, follow it, read "
                              "its result; every auction's bids; the nodes; the statistics.")
    # Outermost of the application's own layers: a body over the limit is refused before
    # anything reads it.
    api.add_middleware(BodyLimit, limit=settings.api_max_body_bytes)

    @api.exception_handler(OperationalError)
    async def store_down(request: Request, exc: OperationalError) -> JSONResponse:
        reason = str(exc.orig or exc).strip().splitlines()[0]
        return JSONResponse(status_code=503, content={
            "detail": f"cannot open the store {store_label(url)}: {reason}"})

    @api.exception_handler(DataError)
    async def unstorable(request: Request, exc: DataError) -> JSONResponse:
        # A value of the request the store cannot hold (PostgreSQL: a NUL character in a
        # definition's text): the request's fault, said as FastAPI says a bad field.
        reason = str(exc.orig or exc).strip().splitlines()[0]
        return JSONResponse(status_code=422, content={"detail": [
            {"loc": ["body"], "msg": f"the store cannot hold a value of it: {reason}",
             "type": "unstorable_value"}]})

    @api.exception_handler(BrokerError)
    async def broker_down(request: Request, exc: BrokerError) -> JSONResponse:
        return JSONResponse(status_code=503, content={
            "detail": f"cannot reach the broker: {exc}"})

    @api.post("/aitp/tasks", status_code=status.HTTP_201_CREATED, response_model=Submitted,
              dependencies=writes, tags=["tasks"],
              responses={**_WRITE, 400: {
                  "model": Problem, "description": "The body cannot be read (bytes that are "
                  "not UTF-8 text)"}, 422: {
                  "model": Problem, "description": "The definition does not validate, or "
                  "cannot run (the detail names the subtask and field)"}})
    def submit_task(definition: TaskDefinition) -> Submitted:
        """AITP 8.1: validate the definition, record it and announce what can start."""
        try:
            handle = submit(definition, app=celery_app)
        except GraphValidationError as exc:
            raise HTTPException(422, detail=[
                {"loc": ["body"], "msg": e, "type": "invalid_definition"}
                for e in exc.errors]) from None
        except ConfigurationError as exc:
            raise HTTPException(422, detail=[
                {"loc": ["body"], "msg": str(exc), "type": "invalid_definition"}]) from None
        progress = graph_progress(url, handle.id)
        return Submitted(task_id=handle.id, status=progress.status,
                         created_at=progress.created_at)

    @api.get("/aitp/tasks", response_model=list[TaskSummary], dependencies=reads,
             tags=["tasks"], responses={**_401, **_503})
    def get_tasks(
        tag: Annotated[str | None, Query(max_length=64, pattern=r"^[^\x00]+$",
                                         description="only the tasks with this tag")] = None,
        state: Annotated[str | None, Query(max_length=16, pattern=r"^[A-Z_]+$",
                                           description="only the tasks in this state "
                                           "(SUCCESS, FAILED, EXECUTING...)")] = None,
        limit: Annotated[int, Query(ge=1, le=LIST_LIMIT,
                                    description="how many tasks, newest first")] = 50,
    ) -> list[TaskSummary]:
        """The latest bidding tasks, newest first (a task graph's subtasks name their graph
        and carry its tags): state, node, tags, who created them, estimated and actual
        cost."""
        return list_tasks(url, tag=tag, state=state, limit=limit)

    @api.get("/aitp/tasks/{task_id}", response_model=TaskState, dependencies=reads,
             tags=["tasks"], responses={**_401, **_404, **_503})
    def get_task(task_id: TaskId) -> TaskState:
        """AITP 8.2: a submitted task graph, or a bidding task (``.delay()``) by its id."""
        try:
            if is_graph(url, task_id):
                return _graph_state(graph_progress(url, task_id))
            return _task_state(task_status(url, task_id))
        except UnknownTaskError as exc:
            raise _not_found(exc) from None

    @api.get("/aitp/tasks/{task_id}/result", response_model=TaskResult, dependencies=reads,
             tags=["tasks"], responses={**_401, **_404, **_503, 409: {
                 "model": NotDone, "description": "The task has not ended yet"}})
    def get_result(task_id: TaskId) -> TaskResult | JSONResponse:
        """AITP 8.3: the outcome of a task that ended; 409 while it runs."""
        try:
            if is_graph(url, task_id):
                p = graph_progress(url, task_id)
                # A graph's states are AITP's already (PENDING, EXECUTING, COMPLETED, FAILED).
                state, aitp, cost, error, output = p.status, p.status, p.cost, p.error, p.result
                took = (None if p.finished_at is None
                        else (p.finished_at - p.created_at) * 1000)
            else:
                s = task_status(url, task_id)
                state, aitp, cost, error = s.state, aitp_state(s.state), s.cost_so_far, s.error
                output = (s.result or {}).get("value")
                took = (None if s.finished_at is None or s.started_at is None
                        else (s.finished_at - s.started_at) * 1000)
        except UnknownTaskError as exc:
            raise _not_found(exc) from None
        if aitp not in FINAL:
            return JSONResponse(status_code=status.HTTP_409_CONFLICT, content=NotDone(
                task_id=task_id, status=aitp,
                detail=f"task {task_id} is {aitp} ({state}): not done yet").model_dump())
        return TaskResult(task_id=task_id, status=aitp,
                          result=output if aitp == "COMPLETED" else None, cost=cost,
                          execution_time_ms=took, error=error if aitp == "FAILED" else None)

    @api.get("/aitp/tasks/{task_id}/bids", response_model=Explanation | GraphBids,
             dependencies=reads, tags=["auctions"], responses={**_401, **_404, **_503})
    def get_bids(task_id: TaskId) -> Explanation | GraphBids:
        """Every bid of the task's auction, its score breakdown, the strategy and the winner
        (``bidding explain --json``); for a task graph, each started subtask's."""
        try:
            if is_graph(url, task_id):
                return GraphBids(task_id=task_id, subtasks=_per_step(
                    url, task_id, lambda t: explain(t, app=celery_app, database_url=url)))
            return explain(task_id, app=celery_app, database_url=url)
        except UnknownTaskError as exc:
            raise _not_found(exc) from None

    @api.post("/aitp/tasks/{task_id}/reset", response_model=ResetOutcome | GraphReset,
              dependencies=writes, tags=["tasks"], responses={**_WRITE, **_404})
    def reset_task(task_id: TaskId) -> ResetOutcome | GraphReset:
        """Seed 002's ``reset_task`` (``bidding reset``): clear the task's checking state
        (checks without news, next check, escalation) and put it back under watch; for a task
        graph, each announced subtask's."""
        try:
            if is_graph(url, task_id):
                return GraphReset(task_id=task_id, subtasks=_per_step(
                    url, task_id, lambda t: reset(t, database_url=url)))
            return reset(task_id, database_url=url)
        except UnknownTaskError as exc:
            raise _not_found(exc) from None

    metrics = registry(settings, celery_app)

    @api.get("/metrics", dependencies=reads, tags=["nodes"], response_class=Response,
             responses={200: {"content": {CONTENT_TYPE_LATEST: {}},
                              "description": "Prometheus' text format"}, **_401, **_503})
    def get_metrics() -> Response:
        """The federation's metrics for Prometheus, read from the store at each scrape:
        auctions, awards, retries, re-awards, escalations, failures and refusals (counters),
        assignment latency (histogram), live nodes, tasks in flight, the oldest unassigned
        task and the journal's backlog (gauges)."""
        return Response(generate_latest(metrics), media_type=CONTENT_TYPE_LATEST)

    @api.get("/aitp/nodes", response_model=list[NodeView], dependencies=reads, tags=["nodes"],
             responses={**_401, **_503})
    def get_nodes() -> list[NodeView]:
        """Every node in the store: profile, live or not, load, learned trust, tasks won,
        success rate."""
        return node_views(settings)

    @api.get("/aitp/stats", response_model=Stats, dependencies=reads, tags=["nodes"],
             responses={**_401, **_503})
    def get_stats(
        since: Annotated[float | None, Query(
            allow_inf_nan=False, description="Unix time: the announcements since then "
            "(0: every task in the store; default: the last 24 hours)")] = None,
        protocol: bool = True,
    ) -> Stats:
        """``bidding stats``: tasks per node, success rate, assignment latency p50/p99,
        success per task type, escalations, and the protocol checker's verdict (a replay of
        the window's message log: ``protocol=false`` leaves it out, as the dashboard's polls
        do). The window is the last 24 hours unless ``since`` says otherwise."""
        return collect(url, window_start(since), protocol=protocol)

    @api.get("/aitp/auctions", response_model=AuctionFeed, dependencies=reads,
             tags=["auctions"], responses={**_401, **_503, 422: {
                 "model": Problem, "description": "A query parameter is not valid (the "
                 "detail's ``loc`` names it)"}})
    def get_auctions(
        limit: Annotated[int, Query(ge=1, le=MAX_LIMIT,
                                    description="how many auctions, newest first")] = 20,
        after: Annotated[int, Query(ge=0, le=_MAX_ID, description="only auctions that "
                                    "closed after this cursor (a previous answer's "
                                    "``cursor``)")] = 0,
        before: Annotated[int | None, Query(ge=1, le=_MAX_ID, description="only auctions "
                                            "that closed before this cursor: a previous "
                                            "answer's ``older``, for the page before it")] = None,
        outcome: Annotated[Outcome | None, Query(description="awarded (to the best bid), "
                                                 "fallback (to a fallback node) or failed "
                                                 "(no winner)")] = None,
        task_type: Annotated[str | None, Query(min_length=1, max_length=64,
                                               pattern=r"^[^\x00]+$",
                                               description="only this task type")] = None,
        node: Annotated[str | None, Query(min_length=1, max_length=32, pattern=r"^[^\x00]+$",
                                          description="only auctions this node answered "
                                          "(bid or refused) or won")] = None,
        since: Annotated[float | None, Query(ge=0, allow_inf_nan=False, description="Unix "
                                             "time: closed at or after it")] = None,
        until: Annotated[float | None, Query(ge=0, allow_inf_nan=False, description="Unix "
                                             "time: closed before it")] = None,
        contested: Annotated[bool, Query(description="only auctions with two or more bids "
                                         "in time (refusals and late bids do not count)")
                             ] = False,
    ) -> AuctionFeed:
        """The auctions that closed, newest first: each one's bids with their scores and
        breakdowns, the winner, the assignment latency, and why the winner won. Page back
        through every auction in the store with ``before`` (each answer's ``older``, None on
        the last page), keeping the same filters; poll for new ones with ``after``."""
        if since is not None and until is not None and until <= since:
            raise HTTPException(422, detail=[{
                "loc": ["query", "until"], "msg": f"until ({until}) must be after since "
                f"({since})", "type": "value_error", "input": until}])
        where = AuctionFilter(outcome=outcome, task_type=task_type, node=node, since=since,
                              until=until, contested=contested)
        return recent_auctions(url, limit=limit, after=after, before=before, where=where)

    @api.get("/aitp/timeline", response_model=Timeline, dependencies=reads, tags=["nodes"],
             responses={**_401, **_503})
    def get_timeline(
        since: Annotated[float | None, Query(
            allow_inf_nan=False, description="Unix time the chart starts at (default: the "
            "first assignment of the last hour)")] = None,
        until: Annotated[float | None, Query(
            allow_inf_nan=False, description="Unix time the chart ends at (default: the "
            "latest assignment)")] = None,
        buckets: Annotated[int, Query(ge=1, le=MAX_BUCKETS)] = 30,
    ) -> Timeline:
        """Assignments per node over time (awards and moves to the next-best bidder), counted
        in equal time buckets."""
        return assignments_over_time(url, since=since, until=until, buckets=buckets)

    mount_dashboard(api)
    return api
