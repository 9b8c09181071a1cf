"""``bidding worker PROFILE -A APP``: a Celery worker for the node a profile describes."""

from __future__ import annotations

import os
from pathlib import Path

import click

from bidding.cli.celery_worker import run_worker
from bidding.cli.common import APP_REQUIRED, app_option, load_app, settings_of
from bidding.errors import BiddingError
from bidding.nodes.profile import PROFILE_ENV, exec_queue, load_profile


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("profile", type=click.Path(dir_okay=False))
@app_option
@click.option("-l", "--loglevel", default="INFO", show_default=True)
@click.option("-c", "--concurrency", type=click.IntRange(min=1), default=None,
              help="Tasks run at once: pool processes, or threads with --pool threads "
                   "(default: the profile's capacity).")
@click.option("--gossip/--no-gossip", default=False, show_default=True,
              help="Celery's gossip between workers. Off: nothing here uses it, and every "
                   "worker read every other's heartbeat events (16 idle nodes: 10% of a core).")
@click.pass_context
def worker(ctx: click.Context, profile: str, app_name: str | None, loglevel: str,
           concurrency: int | None, gossip: bool) -> None:
    """Start a Celery worker for the node described by PROFILE (a TOML file).

    Its pool runs the tasks awarded to the node (exec.<node>); its main process answers bid
    requests (bids.<node>), closes expired auctions, and heartbeats into the store. Events are
    on (-E) for Flower; Celery's gossip is off unless --gossip. Extra arguments are passed to
    `celery worker`.
    """
    try:
        node = load_profile(profile)
    except BiddingError as exc:
        raise click.ClickException(str(exc)) from None
    if not app_name:
        raise click.UsageError(APP_REQUIRED)
    path = str(Path(profile).resolve())
    os.environ[PROFILE_ENV] = path
    app = load_app(app_name)
    from bidding.store import upgrade

    upgrade(settings_of(app_name, None, app).database_url)
    argv = [
        "-Q", exec_queue(node.name),
        "-n", f"{node.name}@%h",
        "-E",
        "--prefetch-multiplier=1",
        "--loglevel", loglevel,
        "--bidding-profile", path,
    ]
    # A node runs what its bids promise: its capacity, unless told otherwise (the worker then
    # warns that the two differ).
    argv += ["--concurrency", str(concurrency or node.capacity)]
    if not gossip:
        # Each worker would consume every other worker's heartbeat events, every 2 s: a cost
        # that grows with the square of the nodes (bench/idle.py). Flower is an event consumer
        # of its own and still sees every worker.
        argv.append("--without-gossip")
    try:
        run_worker(app, [*argv, *ctx.args], ctx.command_path)
    except BiddingError as exc:
        # Refused as the worker starts (its node step checks the default strategy; finalizing
        # the app checks each bidding task's options): one line, as a bad profile.
        raise click.ClickException(str(exc)) from None
