"""The store: SQLAlchemy models, sessions and migrations (SQLite by default, PostgreSQL by URL)."""

from bidding.store.engine import (
    dispose_all,
    get_engine,
    keep_clock,
    masked_url,
    read_session,
    sqlite_path,
    statement_session,
    store_label,
    write_session,
)
from bidding.store.migrate import ensure_schema, upgrade

__all__ = [
    "dispose_all",
    "ensure_schema",
    "get_engine",
    "keep_clock",
    "masked_url",
    "read_session",
    "sqlite_path",
    "statement_session",
    "store_label",
    "upgrade",
    "write_session",
]
