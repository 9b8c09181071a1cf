"""``bidding db upgrade``: create or migrate the store's schema."""

from __future__ import annotations

import click

from bidding.cli.common import app_option, db_option, settings_of


@click.group()
def db() -> None:
    """Store schema commands."""


@db.command()
@app_option
@db_option
def upgrade(app_name: str | None, database_url: str | None) -> None:
    """Create or migrate the store's schema to the newest revision."""
    from bidding.store import masked_url
    from bidding.store import upgrade as do_upgrade

    settings = settings_of(app_name, database_url)
    do_upgrade(settings.database_url)
    click.echo(f"store at {masked_url(settings.database_url)} is up to date")
