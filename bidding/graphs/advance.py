"""Moving a graph on: when a subtask ends, announce the subtasks it made ready, or fail the
task and cancel what depends on the failure; when every subtask is done, the task's result.

``advance`` is idempotent and safe to run from several processes at once: every move is a
compare-and-set on the step or graph row. It runs on the node right after a subtask's attempt
reaches its final state (``task_ended``, called by ``BiddingTask``), at submit, and from every
node's sweeper for graphs nobody moved for a while (``advance_idle``: a subtask that failed
outside any worker, a node killed between its subtask's end and the advance, a dependency on
another task that finished).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import CursorResult, select, update
from sqlalchemy.exc import IntegrityError

from bidding import clock
from bidding.config import Settings
from bidding.context import Context
from bidding.graphs import plan
from bidding.graphs import store as rows
from bidding.graphs.spec import PRIORITY_LEVELS, Subtask, TaskDefinition
from bidding.graphs.templates import TemplateError, apply_mapping, resolve
from bidding.lifecycle import states
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow, Graph, GraphStep

logger = logging.getLogger(__name__)

#: Seconds a graph may go unmoved before a sweeper looks at it.
IDLE_SECONDS = 2.0
#: Seconds a started step may lack its announcement before it is announced again (its
#: announcer died between the two). An announcer that was only slow then announces it too:
#: whichever of the two commits second finds the step announced and leaves it be
#: (``_announced_meanwhile``).
UNANNOUNCED_SECONDS = 30.0


@dataclass
class _Ended:
    """The final outcome of a RUNNING step's bidding task."""

    state: str
    result: dict[str, Any] | None
    error: str | None


def task_ended(ctx: Context, task_id: str) -> None:
    """``task_id`` reached a final state: advance its graph, if it is a graph's subtask."""
    with read_session(ctx.settings.database_url) as session:
        graph_id = rows.graph_of_task(session, task_id)
    if graph_id is not None:
        advance(ctx, graph_id)


def advance_idle(ctx: Context, now: float | None = None,
                 limit: int = 20) -> int:
    """Advance the unfinished graphs nobody moved for ``IDLE_SECONDS`` (a sweeper phase; each
    is leased by moving its ``touched_at``, so one sweeper looks at it). Returns how many."""
    now = clock.now() if now is None else now
    with read_session(ctx.settings.database_url) as session:
        idle = session.execute(
            select(Graph.graph_id, Graph.touched_at)
            .where(Graph.state.in_([rows.WAITING, rows.EXECUTING]),
                   Graph.touched_at < now - IDLE_SECONDS)
            .order_by(Graph.touched_at).limit(limit)).all()
    done = 0
    for graph_id, touched in idle:
        with write_session(ctx.settings.database_url) as session:
            leased = cast(CursorResult[Any], session.execute(
                update(Graph).where(Graph.graph_id == graph_id, Graph.touched_at == touched)
                .values(touched_at=now))).rowcount
        if leased == 1:
            try:
                advance(ctx, graph_id)
                done += 1
            except Exception:
                logger.exception("graph %s: advancing it failed", graph_id)
    return done


def advance(ctx: Context, graph_id: str) -> str | None:
    """Move ``graph_id`` on as far as its subtasks allow; returns its state (None: unknown)."""
    url = ctx.settings.database_url
    with read_session(url) as session:
        graph = session.get(Graph, graph_id)
        if graph is None:
            return None
        steps = {s.step_id: s for s in session.scalars(
            select(GraphStep).where(GraphStep.graph_id == graph_id))}
        running = [s.task_id for s in steps.values() if s.state == rows.RUNNING]
        ended = {task_id: _Ended(state, result, error) for task_id, state, result, error in
                 session.execute(select(AnnouncementRow.task_id, AnnouncementRow.state,
                                        AnnouncementRow.result, AnnouncementRow.error)
                                 .where(AnnouncementRow.task_id.in_(running))).all()}
    defn = rows.definition(graph)
    now = clock.now()
    for step in steps.values():
        if step.state == rows.RUNNING:
            _finish_step(ctx, graph, defn, step, ended.get(step.task_id), now)
    if graph.state not in (rows.WAITING, rows.EXECUTING):
        return graph.state
    failed = sorted((s for s in steps.values() if s.state == rows.FAILED),
                    key=lambda s: (s.finished_at or now, s.position))
    if failed:
        _fail(ctx, graph, defn, steps, failed[0].step_id,
              failed[0].error or "failed")
        return rows.FAILED
    if graph.state == rows.WAITING and not _dependencies_done(ctx.settings, graph, defn, steps):
        return graph.state
    done = {sid for sid, s in steps.items() if s.state == rows.SUCCESS}
    if len(done) == len(steps):
        return _complete(ctx.settings, graph, defn, steps)
    started = {sid for sid, s in steps.items() if s.state != rows.PENDING}
    for subtask in plan.ready(defn.steps(), done, started, PRIORITY_LEVELS[defn.priority]):
        if not _start(ctx, graph, defn, steps, subtask):
            return rows.FAILED
    return rows.EXECUTING


def _finish_step(ctx: Context, graph: Graph, defn: TaskDefinition,
                 step: GraphStep, ended: _Ended | None, now: float) -> None:
    """Record the end of a RUNNING step whose task is final (or announce it again when its
    announcement never got written)."""
    if ended is None:
        if (step.announced_at or 0.0) < now - UNANNOUNCED_SECONDS:
            _announce_again(ctx, graph, defn, step, now)
        return
    if ended.state not in states.FINAL_STATES:
        return
    values: dict[str, Any] = {"finished_at": now}
    if ended.state == states.SUCCESS:
        subtask = rows.steps_by_id(defn)[step.step_id]
        try:
            output = apply_mapping((ended.result or {}).get("value"), subtask.output_mapping,
                                   step.step_id)
            target, values["output"] = rows.SUCCESS, output
        except TemplateError as exc:
            target, values["error"] = rows.FAILED, str(exc)
    else:
        target, values["error"] = rows.FAILED, _reason(ended)
    with write_session(ctx.settings.database_url) as session:
        if rows.move_step(session, graph.graph_id, step.step_id, rows.RUNNING, target,
                          **values):
            step.state = target
            for key, value in values.items():
                setattr(step, key, value)
            logger.info("graph %s: subtask %s %s", graph.graph_id, step.step_id, target)


def _reason(ended: _Ended) -> str:
    if ended.error:
        return ended.error
    exc = (ended.result or {}).get("exception") or {}
    if exc:
        return f"{exc.get('exc_type')}: {' '.join(exc.get('exc_message') or [])}"
    return f"its task ended {ended.state}"


def _fail(ctx: Context, graph: Graph, defn: TaskDefinition,
          steps: Mapping[str, GraphStep], step_id: str, reason: str) -> None:
    """Fail the task for ``step_id``'s failure: every step not started is never started, and
    every other step still running is stopped (its work can no longer be used)."""
    now = clock.now()
    after = set(plan.dependents(defn.steps(), step_id))
    stopped: list[str] = []
    with write_session(ctx.settings.database_url) as session:
        if not rows.move_graph(session, graph.graph_id, (rows.WAITING, rows.EXECUTING),
                               rows.FAILED, error=f"subtask {step_id} failed: {reason}",
                               failed_step=step_id, finished_at=now):
            return
        for sid, step in steps.items():
            why = (f"never started: it depends on {step_id}, which failed" if sid in after
                   else f"never started: the task failed ({step_id} failed)")
            rows.move_step(session, graph.graph_id, sid, rows.PENDING, rows.CANCELLED,
                           error=why, finished_at=now)
            if sid != step_id and rows.move_step(
                    session, graph.graph_id, sid, rows.RUNNING, rows.CANCELLED,
                    error=f"stopped: the task failed ({step_id} failed)", finished_at=now):
                stopped.append(step.task_id)
    graph.state = rows.FAILED
    logger.warning("graph %s failed: subtask %s failed: %s", graph.graph_id, step_id, reason)
    for task_id in stopped:
        # As `celery control revoke --terminate` would: its node drops or ends it, and the
        # store records it FAILED ("revoked").
        try:
            ctx.app.control.revoke(task_id, terminate=True)
        except Exception:  # the broker down: the subtask finishes, and its result is unused
            logger.warning("graph %s: stopping subtask task %s failed", graph.graph_id,
                           task_id, exc_info=True)


def _dependencies_done(settings: Settings, graph: Graph, defn: TaskDefinition,
                       steps: Mapping[str, GraphStep]) -> bool:
    """A task that waits for other tasks (metadata.dependencies): start it once they all
    completed (True), fail it if one failed, else keep it waiting."""
    wanted = defn.metadata.dependencies
    with read_session(settings.database_url) as session:
        found = dict(session.execute(select(Graph.graph_id, Graph.state)
                                     .where(Graph.graph_id.in_(wanted))).all())
    bad = [d for d in wanted if found.get(d) == rows.FAILED]
    if bad:
        now = clock.now()
        with write_session(settings.database_url) as session:
            if rows.move_graph(session, graph.graph_id, rows.WAITING, rows.FAILED,
                               error=f"dependency {bad[0]} failed", finished_at=now):
                for sid in steps:
                    rows.move_step(session, graph.graph_id, sid, rows.PENDING,
                                   rows.CANCELLED, finished_at=now,
                                   error=f"never started: dependency {bad[0]} failed")
        return False
    if any(found.get(d) != rows.COMPLETED for d in wanted):
        return False
    with write_session(settings.database_url) as session:
        rows.move_graph(session, graph.graph_id, rows.WAITING, rows.EXECUTING)
    graph.state = rows.EXECUTING
    return True


def _outputs(steps: Mapping[str, GraphStep]) -> dict[str, dict[str, Any]]:
    return {sid: dict(s.output or {}) for sid, s in steps.items() if s.state == rows.SUCCESS}


def task_result(defn: TaskDefinition, parent_input: Mapping[str, Any],
                outputs: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The task's result: the merged outputs of its sink subtasks, or what its own
    ``output_mapping`` says (templates, or renames of that merged output)."""
    merged: dict[str, Any] = {}
    for sid in plan.sinks(defn.steps()):
        merged.update(outputs.get(sid) or {})
    if not defn.output_mapping:
        return merged
    result: dict[str, Any] = {}
    for key, value in defn.output_mapping.items():
        if "${" in value:
            result[key] = resolve(value, parent_input, outputs)
        elif key in merged:
            result[value] = merged[key]
        else:
            raise TemplateError(f"output_mapping.{key}: the sink subtasks' output has no "
                                f"field {key!r}")
    return result


def _complete(settings: Settings, graph: Graph, defn: TaskDefinition,
              steps: Mapping[str, GraphStep]) -> str:
    import jsonschema  # here: a worker that never completes a graph does not load it

    now = clock.now()
    try:
        result = task_result(defn, graph.input, _outputs(steps))
        if defn.output:
            jsonschema.validate(result, defn.output)
    except (TemplateError, jsonschema.ValidationError) as exc:
        message = exc.message if isinstance(exc, jsonschema.ValidationError) else str(exc)
        with write_session(settings.database_url) as session:
            rows.move_graph(session, graph.graph_id, rows.EXECUTING, rows.FAILED,
                            error=f"the task's output is invalid: {message}", finished_at=now)
        return rows.FAILED
    with write_session(settings.database_url) as session:
        rows.move_graph(session, graph.graph_id, rows.EXECUTING, rows.COMPLETED,
                        result=result, finished_at=now)
    logger.info("graph %s completed", graph.graph_id)
    return rows.COMPLETED


def options(defn: TaskDefinition, subtask: Subtask, remaining: float | None) -> dict[str, Any]:
    """The ``bidding={...}`` options of a subtask's announcement (AITP 2.2 metadata)."""
    meta = defn.metadata
    found: dict[str, Any] = {
        "priority": (PRIORITY_LEVELS[defn.priority] if subtask.priority is None
                     else subtask.priority),
        "content": f"{defn.name}: {subtask.name or subtask.subtask_id}",
    }
    if meta.deadline is not None:
        found["deadline"] = meta.deadline
    # AITP metadata kept with each subtask: found by tag, and who created it.
    if meta.tags:
        found["tags"] = list(meta.tags)
    if defn.created_by:
        found["created_by"] = defn.created_by
    if remaining is not None:
        found["budget"] = max(0.0, remaining)
    timeout = subtask.timeout_seconds or meta.timeout_seconds
    if timeout is not None:
        found["timeout_seconds"] = timeout
    retry = subtask.retry_policy or meta.retry_policy
    if retry is not None:
        found["retry_policy"] = retry.policy()
    # AITP 6.2: the task's fallbacks, each overridden by the subtask's own.
    fallbacks = {**(meta.fallback.fallbacks() if meta.fallback else {}),
                 **(subtask.fallback.fallbacks() if subtask.fallback else {})}
    if fallbacks:
        found["fallbacks"] = fallbacks
    return found


def _start(ctx: Context, graph: Graph, defn: TaskDefinition,
           steps: Mapping[str, GraphStep], subtask: Subtask) -> bool:
    """Announce a ready subtask (once: PENDING -> RUNNING first). False when the task failed."""
    sid = subtask.subtask_id
    step = steps[sid]
    remaining: float | None = None
    limit = defn.metadata.cost_limit
    if limit is not None:
        with read_session(ctx.settings.database_url) as session:
            now_steps = {r.step_id: r for r in session.scalars(
                select(GraphStep).where(GraphStep.graph_id == graph.graph_id))}
            costs = rows.spent(session, [s.task_id for s in now_steps.values()])
        finished = sum(costs.get(s.task_id, 0.0) for s in now_steps.values()
                       if s.state in rows.STEP_FINAL)
        held = sum(max(s.budget or 0.0, costs.get(s.task_id, 0.0))
                   for s in now_steps.values() if s.state == rows.RUNNING)
        pending = sum(1 for s in now_steps.values() if s.state == rows.PENDING)
        remaining = plan.budget_share(limit, finished, held, pending)
        if remaining <= 0:
            _fail_step(ctx, graph, defn, steps, sid,
                       f"cost_limit {limit:g} reached (spent {finished + held:.4f})")
            return False
    try:
        kwargs = resolve(subtask.input, graph.input, _outputs(steps))
    except TemplateError as exc:
        _fail_step(ctx, graph, defn, steps, sid, str(exc))
        return False
    now = clock.now()
    with write_session(ctx.settings.database_url) as session:
        if not rows.move_step(session, graph.graph_id, sid, rows.PENDING, rows.RUNNING,
                              input=kwargs, announced_at=now, budget=remaining):
            return True  # another process announced it
    step.state = rows.RUNNING
    try:
        ctx.app.tasks[step.task_name].apply_async(kwargs=kwargs, task_id=step.task_id,
                                              bidding=options(defn, subtask, remaining))
    except Exception as exc:
        if _announced_meanwhile(ctx.settings, exc, step.task_id):
            logger.info("graph %s: subtask %s was announced meanwhile by a sweeper (this "
                        "announce took over %gs); its auction runs it", graph.graph_id, sid,
                        UNANNOUNCED_SECONDS)
            return True
        logger.exception("graph %s: announcing subtask %s failed", graph.graph_id, sid)
        with write_session(ctx.settings.database_url) as session:
            rows.move_step(session, graph.graph_id, sid, rows.RUNNING, rows.FAILED,
                           error=f"could not be announced: {exc}", finished_at=clock.now())
        _fail(ctx, graph, defn, steps, sid, f"could not be announced: {exc}")
        return False
    logger.info("graph %s: subtask %s announced as %s", graph.graph_id, sid, step.task_id)
    return True


def _fail_step(ctx: Context, graph: Graph, defn: TaskDefinition,
               steps: Mapping[str, GraphStep], step_id: str, reason: str) -> None:
    with write_session(ctx.settings.database_url) as session:
        rows.move_step(session, graph.graph_id, step_id, rows.PENDING, rows.FAILED,
                       error=reason, finished_at=clock.now())
    _fail(ctx, graph, defn, steps, step_id, reason)


def _announce_again(ctx: Context, graph: Graph, defn: TaskDefinition,
                    step: GraphStep, now: float) -> None:
    """A RUNNING step without an announcement: its announcer died in between. Announce it
    (one sweeper: the step's ``announced_at`` is compare-and-set first)."""
    with write_session(ctx.settings.database_url) as session:
        taken = cast(CursorResult[Any], session.execute(
            update(GraphStep).where(GraphStep.graph_id == graph.graph_id,
                                    GraphStep.step_id == step.step_id,
                                    GraphStep.state == rows.RUNNING,
                                    GraphStep.announced_at == step.announced_at)
            .values(announced_at=now))).rowcount
    if taken != 1:
        return
    subtask = rows.steps_by_id(defn)[step.step_id]
    remaining = step.budget  # the share it was given when it was started
    logger.warning("graph %s: subtask %s was started but never announced; announcing it",
                   graph.graph_id, step.step_id)
    try:
        ctx.app.tasks[step.task_name].apply_async(kwargs=step.input or {}, task_id=step.task_id,
                                              bidding=options(defn, subtask, remaining))
    except Exception as exc:
        if not _announced_meanwhile(ctx.settings, exc, step.task_id):
            raise
        logger.info("graph %s: subtask %s was announced meanwhile by its slow announcer; "
                    "its auction runs it", graph.graph_id, step.step_id)


def _announced_meanwhile(settings: Settings, exc: BaseException, task_id: str) -> bool:
    """Whether announcing step task ``task_id`` failed with ``exc`` because another process
    announced it first: its row's key is taken (IntegrityError) and the row is there. A step
    is announced twice when its announcer takes longer than ``UNANNOUNCED_SECONDS`` and a
    sweeper announces it too; the one that commits second must leave it be, not fail it."""
    if not isinstance(exc, IntegrityError):
        return False
    with read_session(settings.database_url) as session:
        return session.scalar(select(AnnouncementRow.task_id)
                              .where(AnnouncementRow.task_id == task_id)) is not None
