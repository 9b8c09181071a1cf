"""Where the library works: one object for the settings, the Celery app and the store they
name, passed where the two travelled as a pair."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from bidding.config import Settings

if TYPE_CHECKING:
    from celery import Celery


@dataclass(frozen=True)
class Context:
    """The settings (``bidding_*``), the Celery app, and the store the settings name."""

    settings: Settings
    app: Celery

    @property
    def store_url(self) -> str:
        """The store's URL (``bidding_database_url``)."""
        return self.settings.database_url
