"""The tour's Celery project: ``-A proj`` finds the app here, as ``celery -A proj`` does."""

from proj.celery import app

__all__ = ["app"]
