"""One sweep's phases are independent (a store on SQLite, no broker)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from bidding.auction import sweeper
from bidding.config import load_settings
from bidding.context import Context


def test_a_failing_phase_does_not_stop_the_rest_of_the_sweep(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    # given a deadline closer that fails (the bid board's Redis is unreachable, say)
    settings = load_settings({"bidding_database_url": store_url}, environ={})
    app = Celery("t", broker="memory://", set_as_current=False)
    ran: list[str] = []

    def broken(*_: Any) -> int:
        raise ConnectionError("redis down")

    monkeypatch.setattr(sweeper, "close_expired", broken)
    monkeypatch.setattr(sweeper, "announce_due", lambda *_: ran.append("announce_due") or 0)
    monkeypatch.setattr(sweeper, "check_winners",
                        lambda *_: (ran.append("check_winners"), (0, 3))[1])
    # when a sweep runs
    alive = sweeper.sweep(Context(settings, app))
    # then retries and watchdogs still ran, and the failure is in the log
    assert ran == ["announce_due", "check_winners"] and alive == 3
    assert "sweep: broken failed" in caplog.text
