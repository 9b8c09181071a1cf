"""``bidding api -A APP``: serve the AITP HTTP API with uvicorn."""

from __future__ import annotations

import importlib.util

import click

from bidding.cli.common import APP_REQUIRED, app_option, load_app, settings_of


@click.command()
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
        raise click.UsageError(APP_REQUIRED)
    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        raise click.ClickException(
            "the HTTP API needs FastAPI and uvicorn: pip install 'celery-bidding[api]'")
    import uvicorn

    from bidding.api.app import create_app
    from bidding.api.exposure import is_loopback, open_refusal

    app = load_app(app_name)
    settings = settings_of(app_name, None, app)  # a bad setting is refused here, in one line
    refusal = open_refusal(host, settings.api_token, allow_open)
    if refusal is not None:
        raise click.ClickException(refusal)
    if settings.api_token is None and not is_loopback(host):
        guard = ("only the read token (bidding_api_read_token)" if settings.api_read_token
                 else f"no token: anyone who reaches {host}:{port} may submit and reset tasks")
        click.echo(f"bidding api: --allow-open: writes need {guard}", err=True)
    uvicorn.run(create_app(app), host=host, port=port, log_level="info")
