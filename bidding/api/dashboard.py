"""The dashboard: a static page (HTML, vanilla JavaScript, CSS; package data, no build step)
served at ``/`` that reads the API from the browser, as any other client would.

The page and its files carry no data, so they are served without a token; the page sends the
read token (``#token=...`` in its address, or typed into it) with every API request.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

#: The page's files, shipped in the wheel (pyproject's package-data).
STATIC = Path(__file__).with_name("static")
#: Where the page's script and style sheet are served.
ASSETS = "/dashboard"


def mount_dashboard(api: FastAPI) -> None:
    """Serve the dashboard at ``/`` and its files under ``/dashboard/``, outside the schema."""
    api.mount(ASSETS, StaticFiles(directory=STATIC), name="dashboard")

    @api.get("/", include_in_schema=False)
    def index() -> FileResponse:
        """The dashboard page."""
        # no-cache: after an upgrade the browser asks again instead of running an old page.
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})
