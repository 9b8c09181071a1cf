"""Fixtures of the unit tests that use a store: a SQLite file in tmp_path, no broker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from bidding.store import dispose_all, upgrade
from bidding.store.migrate import forget_schema_checks


@pytest.fixture
def fresh_url(tmp_path) -> Iterator[str]:
    """URL of a SQLite file that does not exist yet; engines are closed afterwards."""
    yield f"sqlite:///{tmp_path / 'store.db'}"
    dispose_all()
    forget_schema_checks()


@pytest.fixture
def store_url(fresh_url: str) -> str:
    """URL of a SQLite store migrated to head."""
    upgrade(fresh_url)
    return fresh_url
