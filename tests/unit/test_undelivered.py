"""An award whose execution message cannot be sent is not lost: it is logged SEND_FAILED and a
sweep sends it again to the same winner (SQLite and PostgreSQL; the send is faked, no broker)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import select, update

from bidding.auction import award
from bidding.auction import watchdog as sweeper
from bidding.auction.reaward import LostWinner, replace_winner
from bidding.config import Settings
from bidding.context import Context
from bidding.execution import dispatch
from bidding.lifecycle import journal
from bidding.lifecycle import states as lifecycle
from bidding.models import Announcement, Award
from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.profile import NodeProfile
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow, Episode
from tests.unit.test_execution import NODE, assigned, log


class Broker:
    """A stand-in for ``send_execution``: down until ``up`` is set, and counting sends."""

    def __init__(self) -> None:
        self.up = False
        self.sent: list[tuple[str, str]] = []

    def send(self, app: Any, announcement: Any, node: str, settings: Any = None) -> None:
        if not self.up:
            raise ConnectionError("broker down")
        self.sent.append((announcement.task_id, node))


@pytest.fixture
def broker(monkeypatch: pytest.MonkeyPatch) -> Broker:
    fake = Broker()
    monkeypatch.setattr(award, "send_execution", fake.send)
    monkeypatch.setattr(sweeper, "send_execution", fake.send)
    return fake


@pytest.fixture
def app() -> Celery:
    """An app whose sends the ``broker`` fixture fakes."""
    return Celery("t", broker="memory://", set_as_current=False)


def live_node(settings: Settings, now: float | None = None) -> None:
    """``NODE`` heartbeats (at ``now``)."""
    heartbeat(settings, NodeProfile(name=NODE, capabilities=["s1", "s2"]), now=now)


def undelivered(settings: Settings) -> Announcement:
    """A task awarded to live ``NODE`` whose send failed (SEND_FAILED, due now)."""
    live_node(settings)
    announcement = assigned(settings)
    dispatch.mark_undelivered(settings, announcement, NODE, ConnectionError("broker down"))
    return announcement


def episodes(settings: Settings, task_id: str) -> list[Episode]:
    """The task's episodes: a failure counted against a node would be one."""
    with read_session(settings.database_url) as session:
        return list(session.scalars(select(Episode).where(Episode.task_id == task_id)))


def row(settings: Settings, task_id: str) -> AnnouncementRow:
    with read_session(settings.database_url) as session:
        found = session.scalars(select(AnnouncementRow)
                                .where(AnnouncementRow.task_id == task_id)).one()
        session.expunge(found)
        return found


def test_an_award_that_cannot_be_sent_is_sent_again_to_the_same_winner(
    settings: Settings, broker: Broker, app: Celery, caplog: pytest.LogCaptureFixture,
) -> None:
    # given a live winner, and an award committed while the broker is down
    live_node(settings)
    announcement = assigned(settings)
    won = Award(
        task_id=announcement.task_id,
        attempt=announcement.attempt,
        outcome="awarded",
        winner=NODE,
        strategy="weighted",
        closed_by="proxy bids",
    )
    # when the award is routed
    award.route_award(Context(settings, app), announcement, won)
    # then nothing was sent, the log says why, and the task is due for a resend
    assert broker.sent == []
    kind, node, _, detail = log(settings, announcement.task_id)[-1]
    assert (kind, node) == (journal.SEND_FAILED, NODE)
    assert detail["error"] == "ConnectionError: broker down"
    assert detail["queue"] == f"exec.{NODE}"
    assert row(settings, announcement.task_id).due_at is not None
    assert "sending it to exec.n1 failed" in caplog.text

    # when a sweep runs while the broker is still down
    moved, _ = sweeper.check_winners(Context(settings, app), now=time.time())
    # then the resend failed too and is put off, and the node still has the task
    assert moved == 0
    kinds = [m[0] for m in log(settings, announcement.task_id)]
    assert kinds[-2:] == [journal.SEND_FAILED, journal.SEND_FAILED]
    again = row(settings, announcement.task_id)
    assert again.state == lifecycle.ASSIGNED and again.assigned_node == NODE
    assert again.due_at is not None and again.due_at > time.time() + 1

    # when the broker is back and the put-off time has come
    broker.up = True
    moved, _ = sweeper.check_winners(Context(settings, app),
                                     now=time.time() + sweeper.RESEND_BACKOFF)
    # then the task is sent to the same winner, ASSIGNED to it, its delivery checked in a minute
    assert moved == 1 and broker.sent == [(announcement.task_id, NODE)]
    final = row(settings, announcement.task_id)
    assert (final.state, final.assigned_node) == (lifecycle.ASSIGNED, NODE)
    assert final.due_at is not None and final.due_at >= time.time() + 55
    kind, node, _, detail = log(settings, announcement.task_id)[-1]
    assert (kind, node, detail["why"]) == (journal.RESENT, NODE, "its send failed")
    # and no failed attempt counts against the node
    assert episodes(settings, announcement.task_id) == []
    # and a later sweep leaves it alone
    assert sweeper.check_winners(Context(settings, app), now=time.time() + 1)[0] == 0
    # and a sweeper that saw it due before the resend cannot take it from the node, nor
    # send it a second time
    now = time.time()
    assert not replace_winner(
        Context(settings, app),
        LostWinner(
            announcement, announcement.attempt, NODE, lifecycle.ASSIGNED, "late", due_by=now
        ),
        {NODE},
        now,
    )
    assert not sweeper.resend(
        Context(settings, app), sweeper.Winner(announcement, announcement.attempt, NODE), now
    )
    assert broker.sent == [(announcement.task_id, NODE)]
    assert row(settings, announcement.task_id).assigned_node == NODE
    assert episodes(settings, announcement.task_id) == []


def test_a_winner_late_to_start_is_still_replaced_not_resent(
    settings: Settings,
    broker: Broker,
    app: Celery,
) -> None:
    # given a task sent to a live winner, which has not started it by its start deadline
    announcement = assigned(settings, schedule_to_start_timeout=30)  # due to start within 30 s
    later = time.time() + 31
    live_node(settings, now=later)
    broker.up = True
    # when a sweep runs after that deadline
    sweeper.check_winners(Context(settings, app), now=later)
    # then it is not resent to the same node: the late-start watchdog took it from the node
    assert (announcement.task_id, NODE) not in broker.sent
    messages = log(settings, announcement.task_id)
    assert journal.RESENT not in [m[0] for m in messages]
    retrying = next(m for m in messages if m[0] == journal.RETRYING)
    assert retrying[3]["why"].startswith(f"node {NODE} did not start the task in time")
    assert row(settings, announcement.task_id).state == lifecycle.RETRYING


def test_a_resender_that_dies_after_sending_leaves_the_task_to_be_sent_again(
    settings: Settings,
    broker: Broker,
    app: Celery,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given an undelivered task, and a sweeper that dies right after its send went out
    announcement = undelivered(settings)
    broker.up = True

    def dies(*_: Any, **__: Any) -> None:
        raise SystemExit("sweeper killed")

    with monkeypatch.context() as patch, pytest.raises(SystemExit):
        patch.setattr(sweeper.journal, "record", dies)
        sweeper.check_winners(Context(settings, app), now=time.time())
    assert len(broker.sent) == 1
    # when other sweeps run before and after its lease runs out
    assert sweeper.check_winners(Context(settings, app), now=time.time())[0] == 0
    moved, _ = sweeper.check_winners(
        Context(settings, app), now=time.time() + sweeper.RESEND_BACKOFF
    )
    # then it is sent again, to the same node (which runs one copy: execution.begin)
    assert moved == 1 and broker.sent == [(announcement.task_id, NODE)] * 2
    assert row(settings, announcement.task_id).assigned_node == NODE


def test_an_award_whose_message_was_lost_is_sent_again_at_its_delivery_check(
    settings: Settings,
    broker: Broker,
    app: Celery,
) -> None:
    # given a task awarded to a live node, with no schedule-to-start timeout (the announcer's
    # is 0), whose message never went out (the process that awarded it died before sending)
    settings = settings.model_copy(update={"schedule_to_start_timeout": 0.0})
    announcement = assigned(settings)
    won = dispatch.delivery_due(settings, announcement, announcement.announced_at)
    assert won == announcement.announced_at + settings.delivery_check_seconds
    broker.up = True
    later = announcement.announced_at + settings.delivery_check_seconds + 1
    live_node(settings, now=later)
    # when a sweep runs after its delivery check is due
    moved, _ = sweeper.check_winners(Context(settings, app), now=later)
    # then it is sent again to the same node, saying why, and not blamed on the node
    assert moved == 1 and broker.sent == [(announcement.task_id, NODE)]
    kind, node, _, detail = log(settings, announcement.task_id)[-1]
    assert (kind, node) == (journal.RESENT, NODE)
    assert "sent again in case its message was lost" in detail["why"]
    found = row(settings, announcement.task_id)
    assert (found.state, found.assigned_node) == (lifecycle.ASSIGNED, NODE)
    # and its delivery is checked again later: after a minute, or as long as it has waited
    assert found.due_at is not None and found.due_at >= time.time() + 59
    assert dispatch.delivery_due(settings, announcement, 1000.0, waited=300.0) == 1300.0
    # (with a schedule-to-start timeout, that deadline is the next look instead)
    timed = announcement.model_copy(update={"schedule_to_start_timeout": 5.0})
    assert dispatch.delivery_due(settings, timed, 1000.0, waited=300.0) == 1005.0
    assert episodes(settings, announcement.task_id) == []


def test_a_resend_that_outlasts_its_lease_leaves_the_task_to_the_sweeper_that_took_it_over(
    settings: Settings,
    broker: Broker,
    app: Celery,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given an undelivered task, and a send so slow that another sweeper takes the task over
    # (its own lease) before the send returns
    announcement = undelivered(settings)
    takeover = time.time() + 100.0

    def slow_send(app_: Any, rfp_: Any, node: str, settings_: Any = None) -> None:
        with write_session(settings.database_url) as session:
            session.execute(
                update(AnnouncementRow)
                .where(AnnouncementRow.task_id == announcement.task_id)
                .values(due_at=takeover)
            )

    monkeypatch.setattr(sweeper, "send_execution", slow_send)
    # when the first sweeper's send returns
    assert sweeper.resend(
        Context(settings, app),
        sweeper.Winner(announcement, announcement.attempt, NODE),
        time.time(),
        "its send failed",
        announcement.announced_at,
    )
    # then it logs no RESENT (SEND_FAILED stays the last word) and leaves the other's lease
    assert journal.RESENT not in [m[0] for m in log(settings, announcement.task_id)]
    assert row(settings, announcement.task_id).due_at == takeover
