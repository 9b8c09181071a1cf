"""The commands about the whole federation's store: ``nodes``, ``stats``, ``check`` (the
protocol checker) and ``prune``."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING

import click

from bidding import clock
from bidding.cli.common import app_option, db_option, reading, settings_of
from bidding.store import store_label

if TYPE_CHECKING:
    from bidding.observe.nodes import NodeView


@click.command()
@app_option
@db_option
@click.option("--json", "as_json", is_flag=True)
def nodes(app_name: str | None, database_url: str | None, as_json: bool) -> None:
    """List the nodes that are alive now (fresh heartbeat), with their profiles."""
    from bidding.observe.nodes import node_views

    settings = settings_of(app_name, database_url)
    with reading(settings.database_url):
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
    holding = [n for n in live if n.resources or n.warm]
    if holding:
        click.echo("")
        click.echo(resources_table(holding))
    claimed = [n for n in live if n.calibration.confidence_attempts
               or n.calibration.cost_attempts or n.calibration.duration_attempts]
    if claimed:
        click.echo("")
        click.echo(calibration_table(claimed))


def resources_table(views: list[NodeView]) -> str:
    """The nodes' resources, one line each: every declared one as free/declared (what their
    unfinished attempts reserve is the difference), and the items each holds warm."""
    lines = [f"{'node':<12} {'resources (free/declared)':<40} warm"]
    for n in views:
        held = ", ".join(f"{name} {n.free.get(name, 0):g}/{total:g}"
                         for name, total in sorted(n.resources.items())) or "-"
        lines.append(f"{n.name:<12} {held:<40} {', '.join(n.warm) or '-'}")
    return "\n".join(lines)


def calibration_table(views: list[NodeView]) -> str:
    """The nodes' claims against their outcomes, one line each: claimed confidence against
    the realised success rate, estimated against actual cost and duration, each with the
    number of attempts behind it."""
    def num(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    def secs(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}s"

    lines = ["claims against outcomes (latest attempts; n: how many made the claim)",
             f"{'node':<12} {'n':>4} {'claimed':>7} {'success':>7} {'gap':>6}   "
             f"{'n':>4} {'est.cost':>9} {'cost':>9}   {'n':>4} {'est.time':>8} {'time':>8}"]
    for v in views:
        c = v.calibration
        lines.append(
            f"{v.name:<12} {c.confidence_attempts:>4} {num(c.claimed_confidence, '.2f'):>7} "
            f"{num(c.success_rate, '.2f'):>7} {num(c.confidence_gap, '+.2f'):>6}   "
            f"{c.cost_attempts:>4} {num(c.estimated_cost, '.4g'):>9} "
            f"{num(c.actual_cost, '.4g'):>9}   {c.duration_attempts:>4} "
            f"{secs(c.estimated_duration_s):>8} {secs(c.actual_duration_s):>8}")
    return "\n".join(lines)


@click.command()
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
    settings = settings_of(app_name, database_url)
    with reading(settings.database_url):
        ensure_schema(settings.database_url)
        result = collect(settings.database_url, window_start(since, seconds))
    if as_json:
        click.echo(result.model_dump_json(indent=2))
        return
    click.echo(result.render())


@click.command()
@click.argument("task_ids", nargs=-1, metavar="[TASK_ID]...")
@app_option
@db_option
@click.option("--since", type=float, default=0.0, help="Only tasks announced after (Unix time).")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON.")
def check(task_ids: tuple[str, ...], app_name: str | None, database_url: str | None,
          since: float, as_json: bool) -> None:
    """Check the message log against the protocol (an independent verifier).

    Every task's messages (or those of the TASK_IDs given) are replayed through the rules in
    docs/architecture.md ("The protocol checker"). Exit status 0 when every task keeps the
    protocol, 1 when any does not; each offending task is printed with the rule it breaks.
    """
    from bidding.observe.logcheck import check_log
    from bidding.store import ensure_schema

    settings = settings_of(app_name, database_url)
    with reading(settings.database_url):
        ensure_schema(settings.database_url)
        verdict = check_log(settings.database_url, list(task_ids) or None, since)
    if as_json:
        click.echo(json.dumps({"ok": verdict.ok, **verdict.model_dump(mode="json"),
                               "by_rule": verdict.by_rule()}, indent=2))
    else:
        click.echo(verdict.render())
    if not verdict.ok:
        sys.exit(1)


@click.command()
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
    settings = settings_of(app_name, database_url)
    with reading(settings.database_url):
        ensure_schema(settings.database_url)
        pruned = prune_store(settings, seconds, dry_run=dry_run)
    cutoff = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(clock.now() - seconds))
    click.echo(f"{'would prune' if dry_run else 'pruned'} {pruned.line()}: finished before "
               f"{cutoff} (older than {older_than}) in {store_label(settings.database_url)}")
