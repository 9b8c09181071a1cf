"""The settings of an app, loaded once and checked for JSON-only serialization."""

from __future__ import annotations

from typing import Any

from celery import Celery

from bidding.config import Settings, load_settings
from bidding.errors import ConfigurationError

_ATTR = "_bidding_settings"
#: The only content types an app may accept: JSON, by name or by MIME type.
JSON_CONTENT = frozenset({"json", "application/json"})


def get_settings(app: Celery) -> Settings:
    """``app``'s bidding settings (``app.conf.bidding_*`` overridden by ``BIDDING_*``)."""
    found: Settings | None = getattr(app, _ATTR, None)
    if found is None:
        check_json_only(app)
        found = load_settings(dict(app.conf))
        setattr(app, _ATTR, found)
    return found


def reset_settings(app: Celery) -> None:
    """Forget cached settings (after changing ``app.conf`` in tests)."""
    if hasattr(app, _ATTR):
        delattr(app, _ATTR)


def celery_conf(broker_url: str, result_backend: str | None = None) -> dict[str, Any]:
    """The Celery settings a bidding app's nodes want: JSON only (what ``check_json_only``
    enforces), executions fetched one at a time, and broker retries at start-up."""
    return {
        "broker_url": broker_url,
        "result_backend": result_backend or broker_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "worker_prefetch_multiplier": 1,
        "broker_connection_retry_on_startup": True,
    }


def check_json_only(app: Celery) -> None:
    """Refuse an app configured to send or accept pickle: bidding messages are JSON only."""
    conf = app.conf
    for key in ("task_serializer", "result_serializer"):
        if conf.get(key) != "json":
            raise ConfigurationError(f"{key}: must be 'json' for celery-bidding "
                                     f"(got {conf.get(key)!r})")
    for key in ("accept_content", "result_accept_content"):
        accepted = conf.get(key) or []
        bad = [c for c in accepted if str(c) not in JSON_CONTENT]
        if bad:
            raise ConfigurationError(f"{key}: must accept JSON only (got {list(accepted)!r})")
