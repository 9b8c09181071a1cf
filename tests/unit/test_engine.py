"""SQLite writers in several processes: each write transaction begins IMMEDIATE (it waits for the
write lock instead of failing when it upgrades), so none fails and no update is lost."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest
from sqlalchemy import text

from bidding.store import write_session
from bidding.store.engine import dispose_all, masked_url, store_label

SPAWN = multiprocessing.get_context("spawn")


def _count(url: str, times: int) -> None:
    """Child: read-modify-write a counter ``times`` times, one write transaction each."""
    for _ in range(times):
        with write_session(url) as session:
            value = session.execute(text("SELECT n FROM counter")).scalar_one()
            session.execute(text("UPDATE counter SET n = :n"), {"n": value + 1})
    dispose_all()


def test_writers_in_four_processes_lose_no_update(tmp_path: Path) -> None:
    # given a counter in a fresh store
    url = f"sqlite:///{tmp_path}/store.db"
    with write_session(url) as session:
        session.execute(text("CREATE TABLE counter (n INTEGER)"))
        session.execute(text("INSERT INTO counter VALUES (0)"))
    # when four processes each read and rewrite it 100 times
    children = [SPAWN.Process(target=_count, args=(url, 100)) for _ in range(4)]
    for child in children:
        child.start()
    for child in children:
        child.join(90)
    # then every one finished cleanly and every increment counted
    assert [c.exitcode for c in children] == [0, 0, 0, 0]
    with write_session(url) as session:
        assert session.execute(text("SELECT n FROM counter")).scalar_one() == 400
    dispose_all()


def test_masked_url_hides_only_the_password() -> None:
    # Given store URLs with a password, without one, and one that is not a URL
    with_password = "postgresql+psycopg://bob:s3cret@db.example:5432/bidding"
    without = "sqlite:////var/lib/bidding.db"

    # When they are masked for printing
    # Then the password is replaced, everything else kept, and garbage is not echoed back
    assert masked_url(with_password) == "postgresql+psycopg://bob:***@db.example:5432/bidding"
    assert masked_url(without) == without
    assert masked_url("not a url: s3cret") == "(unparsable database URL)"


def test_store_label_masks_the_password_and_resolves_a_relative_sqlite_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a command running in some folder
    monkeypatch.chdir(tmp_path)

    # When stores are named in a message
    # Then a password is masked, an absolute path kept as is, and a relative SQLite path is
    # shown with the file it means from here
    assert store_label("postgresql://bob:s3cret@db.example/bidding") == (
        "postgresql://bob:***@db.example/bidding")
    assert store_label("sqlite:////var/lib/bidding.db") == "sqlite:////var/lib/bidding.db"
    assert store_label("sqlite:///bidding.db") == (
        f"sqlite:///bidding.db (= {tmp_path.resolve() / 'bidding.db'})")
    assert store_label("sqlite://") == "sqlite://"
