"""What every ``bidding`` command shares: loading the app, its settings, the store's errors as
one line, and the ``-A/--app`` and ``--database-url`` options."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click
from celery import Celery
from celery.app.utils import find_app
from sqlalchemy.exc import OperationalError

from bidding.config import Settings, get_settings, load_settings, use_store_settings
from bidding.errors import BiddingError
from bidding.store import sqlite_path, store_label

APP_REQUIRED = "pass the Celery app with -A/--app (or set CELERY_APP)"


def load_app(name: str) -> Celery:
    """The Celery app ``name`` (module or module:attribute), with bidding installed on it."""
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


def settings_of(app_name: str | None, database_url: str | None,
                app: Celery | None = None) -> Settings:
    """The app's settings (or the defaults and BIDDING_* without an app), with the store URL
    given on the command line in place of the app's."""
    try:
        if app_name:
            settings = get_settings(app or load_app(app_name))
        else:
            settings = load_settings({})
            use_store_settings(settings)
    except BiddingError as exc:
        # A bad bidding_* setting or BIDDING_* variable is the user's to fix: one line, like a
        # bad profile, not a traceback.
        raise click.ClickException(str(exc)) from None
    if database_url:
        settings = settings.model_copy(update={"database_url": database_url})
    return settings


@contextmanager
def reading(database_url: str) -> Iterator[None]:
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
