"""Review item i: a task the sweepers' scans keep failing on (an announcement this version
cannot read) is parked with its reason, so that it cannot hide the tasks behind it; an outage
parks nothing; ``bidding status`` shows a parked task and ``bidding reset`` puts it back
(SQLite and PostgreSQL, no broker)."""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

import pytest
from celery import Celery
from click.testing import CliRunner
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError

from bidding.auction import announce, close, watchdog
from bidding.auction.opening import row_values
from bidding.cli import main
from bidding.config import Settings
from bidding.context import Context
from bidding.lifecycle import journal
from bidding.lifecycle import states as lifecycle
from bidding.lifecycle.transition import Expect, Log, transition
from bidding.models import Announcement
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow
from tests.stored import add_announcement
from tests.unit.test_execution import assigned

APP = Celery("t", broker="memory://", set_as_current=False)
#: What a stored announcement written by a later version may hold: an option this one lacks.
FROM_THE_FUTURE = {"future_option": 1}
UNREADABLE = ("cannot read its stored announcement: future_option: Extra inputs are not "
              "permitted (got 1)")


def unreadable(settings: Settings, count: int, state: str, *, node: str = "dead",
               at: float = 1000.0) -> list[str]:
    """``count`` tasks in ``state`` (delegated to ``node`` when in flight) whose stored
    announcement this version cannot read, the oldest awarded or closing at ``at``."""
    ids = []
    with write_session(settings.database_url) as session:
        for n in range(count):
            announcement = Announcement(task_id=f"future-{n:04d}-{uuid.uuid4().hex[:8]}",
                               task_name="t.noop", task_type="noop", announced_at=at + n)
            in_flight = state in lifecycle.IN_FLIGHT_STATES
            session.add(AnnouncementRow(**{
                **row_values(announcement, state, [node]),
                "spec": {**announcement.model_dump(mode="json"), **FROM_THE_FUTURE},
                "assigned_node": node if in_flight else None,
                "awarded_at": at + n if in_flight else None,
                "due_at": at + n if state in lifecycle.DUE_STATES else None,
            }))
            ids.append(announcement.task_id)
    return ids


def stored(settings: Settings, task_id: str) -> AnnouncementRow:
    with read_session(settings.database_url) as session:
        found = session.get(AnnouncementRow, task_id)
        assert found is not None
        session.expunge(found)
        return found


def parked(settings: Settings, ids: list[str]) -> dict[str | None, int]:
    """How many of ``ids`` are parked, by reason (None: not parked)."""
    with read_session(settings.database_url) as session:
        reasons = session.scalars(
            select(AnnouncementRow.parked).where(AnnouncementRow.task_id.in_(ids))
        ).all()
    counts: dict[str | None, int] = {}
    for reason in reasons:
        counts[reason] = counts.get(reason, 0) + 1
    return counts


def test_unreadable_rows_filling_the_watchdogs_scan_are_parked_and_the_lost_winner_is_replaced(
    settings: Settings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # given 120 tasks on a dead node whose announcements this version cannot read (more than
    # one scan of the watchdog takes), awarded before anything else
    bad = unreadable(settings, 120, lifecycle.ASSIGNED)
    # and a real lost winner, awarded after them, its node dead too
    real = assigned(settings, node="dead")
    with write_session(settings.database_url) as session:
        session.execute(
            update(AnnouncementRow)
            .where(AnnouncementRow.task_id == real.task_id)
            .values(awarded_at=5000.0)
        )
    # when the watchdog sweeps, pass after pass
    caplog.set_level(logging.WARNING, logger="bidding")
    now = time.time()
    passes = 0
    while stored(settings, real.task_id).state == lifecycle.ASSIGNED and passes < 10:
        watchdog.check_winners(Context(settings, APP), now + passes)
        passes += 1
    # then the lost winner is re-placed within a few passes (a new auction: nobody else bid)
    assert stored(settings, real.task_id).state == lifecycle.RETRYING
    assert passes <= 4
    # and when the watchdog goes on, every unreadable task ends parked with its reason
    for later in range(3):
        watchdog.check_winners(Context(settings, APP), now + passes + later)
    assert parked(settings, bad) == {f"watchdog: {UNREADABLE}": 120}
    # and each was logged twice (its first failure, its parking), without a traceback
    first = [r for r in caplog.records if bad[0] in r.getMessage()]
    assert [r.levelname for r in first] == ["WARNING", "ERROR"], [r.getMessage() for r in first]
    assert all(r.exc_info is None for r in first)
    # and a parked task is not read again: another pass logs nothing about it
    caplog.clear()
    watchdog.check_winners(Context(settings, APP), now + passes + 5)
    assert bad[0] not in caplog.text


def test_the_watchdog_scans_the_oldest_awards_first(settings: Settings) -> None:
    # given three tasks on a dead node, inserted newest first
    ids = []
    for awarded in (3000.0, 2000.0, 1000.0):
        announcement = assigned(settings, node="dead")
        with write_session(settings.database_url) as session:
            session.execute(
                update(AnnouncementRow)
                .where(AnnouncementRow.task_id == announcement.task_id)
                .values(awarded_at=awarded)
            )
        ids.append(announcement.task_id)
    # when the watchdog's scan takes one at a time
    moved = [watchdog.check_winners(Context(settings, APP), limit=1)[0] for _ in ids]
    # then they are re-placed oldest award first
    assert moved == [1, 1, 1]
    order = []
    with read_session(settings.database_url) as session:
        for task_id in ids:
            order.append(
                (
                    session.scalars(
                        select(journal.MESSAGES.c.id).where(
                            journal.MESSAGES.c.task_id == task_id,
                            journal.MESSAGES.c.kind == journal.RETRYING,
                        )
                    ).one(),
                    task_id,
                )
            )
    assert [task_id for _, task_id in sorted(order)] == list(reversed(ids))


def test_unreadable_auctions_are_parked_by_the_deadline_closer_and_the_others_close(
    settings: Settings,
) -> None:
    # given 5 open auctions past their window that this version cannot read, and one it can,
    # which closes last
    bad = unreadable(settings, 5, lifecycle.BIDDING)
    good = add_announcement(
        settings.database_url,
        Announcement(task_id=str(uuid.uuid4()), task_name="t.noop", task_type="noop",
                     announced_at=9000.0, window=2.0),
        lifecycle.BIDDING, [])
    # when the deadline closer takes at most 5 auctions a pass, pass after pass
    for n in range(4):
        close.close_expired(Context(settings, APP), time.time() + n, limit=5)
    # then the unreadable ones are parked, and the readable one was closed (no bids: failed)
    assert parked(settings, bad) == {f"deadline closer: {UNREADABLE}": 5}
    assert stored(settings, good.task_id).state == lifecycle.FAILED


def test_unreadable_due_tasks_are_parked_by_the_announcer_and_the_others_announced(
    settings: Settings,
) -> None:
    # given 3 deferred tasks due that this version cannot read, and one it can, due after them
    # (no node can do it: it fails when announced)
    bad = unreadable(settings, 3, lifecycle.DEFERRED)
    good = add_announcement(
        settings.database_url,
        Announcement(task_id=str(uuid.uuid4()), task_name="t.noop", task_type="noop",
                     required_skills=["nobody_has_it"], announced_at=9000.0, window=2.0),
        lifecycle.DEFERRED, [], due_at=9000.0)
    # when the announcer takes at most 3 due tasks a pass, pass after pass
    for n in range(4):
        announce.announce_due(Context(settings, APP), time.time() + n, limit=3)
    # then the unreadable ones are parked, and the readable one was announced (and failed)
    assert parked(settings, bad) == {f"announcer: {UNREADABLE}": 3}
    assert stored(settings, good.task_id).state == lifecycle.FAILED


def test_an_outage_parks_nothing(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a lost winner, and a store that fails every re-placement (a restart)
    real = assigned(settings, node="dead")

    def store_down(*args: Any, **kwargs: Any) -> bool:
        raise OperationalError("UPDATE", {}, ConnectionError("server closed the connection"))

    monkeypatch.setattr(watchdog, "replace_winner", store_down)
    # when the watchdog fails on it pass after pass
    for n in range(5):
        watchdog.check_winners(Context(settings, APP), time.time() + n)
    # then it is neither parked nor counted against it
    found = stored(settings, real.task_id)
    assert (found.parked, found.scan_failures) == (None, 0)


def test_a_transition_clears_a_parking(settings: Settings) -> None:
    # given a parked task
    announcement = assigned(settings)
    with write_session(settings.database_url) as session:
        session.execute(
            update(AnnouncementRow)
            .where(AnnouncementRow.task_id == announcement.task_id)
            .values(scan_failures=3, parked="watchdog: something")
        )
    # when it moves on (its node begins it)
    with write_session(settings.database_url) as session:
        assert transition(
            session,
            announcement.task_id,
            lifecycle.EXECUTING,
            Log(journal.TASK_ACCEPTED),
            Expect(states=(lifecycle.ASSIGNED,), node="n1"),
        )
    # then what failed is history: every scan looks at it again
    found = stored(settings, announcement.task_id)
    assert (found.parked, found.scan_failures) == (None, 0)


def test_status_shows_a_parked_task_and_reset_puts_it_back(settings: Settings) -> None:
    # given an unreadable task the watchdog parked
    [task_id] = unreadable(settings, 1, lifecycle.ASSIGNED)
    for n in range(3):
        watchdog.check_winners(Context(settings, APP), time.time() + n)
    url = settings.database_url
    runner = CliRunner()
    # when `bidding status` runs
    shown = runner.invoke(main, ["status", task_id, "--database-url", url])
    # then it shows the task, parked with its reason and how to put it back
    assert shown.exit_code == 0, shown.output
    assert f"parked: watchdog: {UNREADABLE}" in shown.output
    assert f"`bidding reset {task_id}`" in shown.output
    as_json = json.loads(
        runner.invoke(main, ["status", task_id, "--database-url", url, "--json"]).output
    )
    assert as_json["parked"] == f"watchdog: {UNREADABLE}"
    # when `bidding reset` runs
    reset = runner.invoke(main, ["reset", task_id, "--database-url", url])
    # then it says it cleared the parking, and the scans look at the task again
    assert reset.exit_code == 0, reset.output
    assert f"parked: watchdog: {UNREADABLE}" in reset.output
    found = stored(settings, task_id)
    assert (found.parked, found.scan_failures) == (None, 0)
