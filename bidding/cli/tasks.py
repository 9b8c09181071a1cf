"""The commands about one task: ``explain``, ``status``, ``reset`` and ``submit``; ``tasks``,
the latest tasks by tag or state; and ``monitor``, seed 002's watch of delegated tasks in the
foreground."""

from __future__ import annotations

import json
import signal
import threading
import time

import click

from bidding.cli.common import APP_REQUIRED, app_option, db_option, load_app, reading, settings_of
from bidding.errors import BiddingError
from bidding.store import store_label


@click.command()
@click.argument("task_id")
@app_option
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as JSON.")
def explain(task_id: str, app_name: str | None, database_url: str | None,
            as_json: bool) -> None:
    """Show every bid of TASK_ID's auction, its score breakdown, the strategy and the winner."""
    from bidding.graphs.progress import graph_progress, is_graph
    from bidding.observe.explain import explain as do_explain

    app = load_app(app_name) if app_name else None
    settings = settings_of(app_name, database_url, app)
    with reading(settings.database_url):
        if is_graph(settings.database_url, task_id):
            # A task graph: its subtasks, each with the task id whose auction explain shows.
            progress = graph_progress(settings.database_url, task_id)
            click.echo(progress.model_dump_json(indent=2) if as_json else progress.render())
            return
        # With the app, an open auction's answers on the Redis board are shown too.
        result = do_explain(task_id, app=app, database_url=settings.database_url)
    click.echo(result.model_dump_json(indent=2) if as_json else result.render())


@click.command()
@click.argument("task_id")
@app_option
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(task_id: str, app_name: str | None, database_url: str | None, as_json: bool) -> None:
    """Where TASK_ID stands: state, attempt, node, progress, cost against budget."""
    from bidding.graphs.progress import graph_progress, is_graph
    from bidding.observe.status import task_status

    settings = settings_of(app_name, database_url)
    with reading(settings.database_url):
        if is_graph(settings.database_url, task_id):
            progress = graph_progress(settings.database_url, task_id)
            click.echo(progress.model_dump_json(indent=2) if as_json else progress.render())
            return
        result = task_status(settings.database_url, task_id)
    click.echo(result.model_dump_json(indent=2) if as_json else result.render())


@click.command()
@app_option
@db_option
@click.option("--tag", default=None, help="Only the tasks with this tag.")
@click.option("--state", default=None, help="Only the tasks in this state (SUCCESS, FAILED...).")
@click.option("--limit", type=click.IntRange(1, 500), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the tasks as JSON.")
def tasks(app_name: str | None, database_url: str | None, tag: str | None, state: str | None,
          limit: int, as_json: bool) -> None:
    """The latest tasks, newest first: state, node, estimated and actual cost, tags and who
    created them (a task graph's subtasks carry its tags)."""
    from bidding.observe.listing import list_tasks, render

    settings = settings_of(app_name, database_url)
    with reading(settings.database_url):
        found = list_tasks(settings.database_url, tag=tag, state=state, limit=limit)
    click.echo(json.dumps([t.model_dump() for t in found], indent=2) if as_json
               else render(found))


@click.command()
@click.argument("task_id")
@app_option
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print what was cleared as JSON.")
def reset(task_id: str, app_name: str | None, database_url: str | None, as_json: bool) -> None:
    """Clear TASK_ID's checking state (checks without news, next check, escalation) and put it
    back under watch: its next check comes bidding_initial_check_wait_time from now. A task
    the sweepers parked (shown by `bidding status`) is scanned again."""
    from bidding.observe.reset import reset as do_reset

    settings = settings_of(app_name, database_url)
    with reading(settings.database_url):
        outcome = do_reset(task_id, database_url=settings.database_url)
    click.echo(outcome.model_dump_json(indent=2) if as_json else outcome.render())


@click.command()
@app_option
@db_option
@click.option("--once", is_flag=True, help="One pass of the due checks, then exit.")
def monitor(app_name: str | None, database_url: str | None, once: bool) -> None:
    """Watch delegated tasks in the foreground: check those their nodes have been
    silent about, with backoff, and escalate those that stay silent (a log line, the
    task_escalated signal, bidding_notify_url). Node workers run the same loop; this one is for
    a store no node worker watches, or to see escalations as they happen. Ctrl-C stops it."""
    import logging

    from bidding.observe.checking import check_due
    from bidding.observe.monitor import Monitor

    app = load_app(app_name) if app_name else None
    settings = settings_of(app_name, database_url, app=app)
    # Escalations are warnings of bidding's loggers; the store's migrations say nothing here.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("bidding").setLevel(logging.INFO)
    with reading(settings.database_url):
        from bidding.store import ensure_schema

        ensure_schema(settings.database_url)
        if once:
            done = check_due(settings, app=app)
            click.echo(f"{done.written} check(s) written, {len(done.escalated)} escalated")
            return
    loop = Monitor(settings, app=app)
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    click.echo(f"watching delegated tasks in the store {store_label(settings.database_url)} "
               "(Ctrl-C stops)")
    loop.start()
    try:
        while not stop.wait(1.0):
            pass
    finally:
        loop.stop()
    click.echo("monitor stopped")


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@app_option
@click.option("--input", "input_json", default=None,
              help="The task's input values as a JSON object (added to input_values).")
@click.option("--wait", is_flag=True, help="Wait for the result, showing progress.")
@click.option("--timeout", type=float, default=None, help="Seconds --wait waits at most.")
def submit(file: str, app_name: str | None, input_json: str | None, wait: bool,
           timeout: float | None) -> None:
    """Submit the AITP task definition in FILE (YAML or JSON): validated, then its subtasks are
    auctioned as their dependencies complete. Prints the task id (for `bidding status`)."""
    from bidding.graphs.submit import submit as do_submit

    if not app_name:
        raise click.UsageError(APP_REQUIRED)
    app = load_app(app_name)
    try:
        values = json.loads(input_json) if input_json else None
    except ValueError as exc:
        raise click.BadParameter(f"not JSON: {exc}", param_hint="--input") from None
    try:
        handle = do_submit(file, app=app, input=values)
    except BiddingError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(handle.id)
    if not wait:
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    shown = ""
    while True:
        progress = handle.progress()
        line = " ".join(f"{s.step_id}:{s.status}" for s in progress.steps)
        if line != shown:
            click.echo(f"  {progress.percent_complete:3d}%  {line}", err=True)
            shown = line
        if progress.status in ("COMPLETED", "FAILED"):
            break
        if deadline is not None and time.monotonic() > deadline:
            raise click.ClickException(f"task {handle.id}: still {progress.status} after "
                                       f"{timeout}s")
        time.sleep(0.2)
    if progress.status == "FAILED":
        raise click.ClickException(f"task {handle.id} failed: {progress.error}")
    click.echo(json.dumps(progress.result, indent=2))
