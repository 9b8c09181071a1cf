"""What a broker outage does to announcing and reporting, shown on a store alone (SQLite and
PostgreSQL, no broker): tasks wait for nodes that are reconnecting, a new task whose bid
requests cannot be sent ends FAILED with the reason, and a final outcome the result backend
lacks is written from the store."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import update

from bidding.auction import routes as routes_module
from bidding.auction.announce import open_auction
from bidding.auction.board import StoreBoard
from bidding.auction.close import close_auction
from bidding.config import Settings
from bidding.context import Context
from bidding.execution.dispatch import start_by
from bidding.execution.report import report_if_final, report_results
from bidding.lifecycle import states as lifecycle
from bidding.models import Announcement, Refusal
from bidding.nodes.heartbeat import heartbeat, mark_offline
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import invalidate_cache, live_nodes
from bidding.store import write_session
from bidding.store.schema import AnnouncementRow, Node
from tests.unit.test_execution import assigned, log, row
from tests.unit.test_review_holes import bidding_row


def app() -> Celery:
    # A memory broker: the bid board is the store's.
    return Celery("t", broker="memory://", backend="cache+memory://", set_as_current=False)


def announcement(**fields: Any) -> Announcement:
    return Announcement(task_id=str(uuid.uuid4()), task_name="t.work", task_type="work",
                        required_skills=["ocr"], **fields)


def node(settings: Settings, name: str, skills: list[str]) -> None:
    heartbeat(settings, NodeProfile(name=name, capabilities=skills, capacity=2,
                                    price_per_unit=0.0, latency_ms=1, trust=70))
    invalidate_cache()


def test_a_task_waits_for_a_capable_node_that_is_reconnecting(settings: Settings) -> None:
    # given the only ocr node, offline because its worker lost the broker a moment ago
    node(settings, "scanner", ["ocr"])
    mark_offline(settings, "scanner")
    invalidate_cache()
    # when a task for ocr is announced
    task = announcement()
    assert open_auction(Context(settings, app()), task, new=True)
    # then it waits to be announced again in a heartbeat interval, not counted as a deferral
    found = row(settings, task.task_id)
    assert found.state == lifecycle.DEFERRED
    assert found.due_at is not None and found.due_at - time.time() <= settings.heartbeat_interval
    kind, _, _, detail = log(settings, task.task_id)[-1]
    assert kind == "DEFERRED" and detail["waiting_for"] == ["scanner"]
    assert "reconnecting to the broker" in detail["reason"] and detail["deferrals"] == 0


@pytest.mark.parametrize("why", ["stopped", "long gone", "other skills"])
def test_a_task_nobody_can_be_coming_back_for_fails_at_once(settings: Settings,
                                                            why: str) -> None:
    # given no live ocr node: the only one stopped cleanly, or offline for longer than the
    # grace period, or a reconnecting node without ocr
    node(settings, "scanner", ["ocr"] if why != "other skills" else ["nlp"])
    mark_offline(settings, "scanner", status="stopped" if why == "stopped" else "offline")
    if why == "long gone":
        with write_session(settings.database_url) as session:
            session.execute(update(Node).values(
                last_heartbeat=time.time() - settings.heartbeat_ttl - settings.liveness_grace - 1))
    invalidate_cache()
    # when a task for ocr is announced
    task = announcement()
    open_auction(Context(settings, app()), task, new=True)
    # then it fails fast with seed 001's outcome
    found = row(settings, task.task_id)
    assert found.state == lifecycle.FAILED
    assert found.error == "No bidders registered: no live node offers ocr"


def test_a_caller_whose_cached_node_list_predates_a_reconnect_does_not_fail_the_task(
    settings: Settings,
) -> None:
    # given the only ocr node offline (its worker lost the broker), and a caller that read the
    # live nodes just then (an empty list, kept for bidding_live_cache_seconds)
    node(settings, "scanner", ["ocr"])
    mark_offline(settings, "scanner")
    invalidate_cache()
    assert live_nodes(settings) == []
    # when the node's worker reconnects and beats (in its own process: this caller's cache is
    # not told) and a task for ocr is announced within the cache's second
    with write_session(settings.database_url) as session:
        session.execute(update(Node).values(status="online", last_heartbeat=time.time()))
    task = announcement()
    assert open_auction(Context(settings, app()), task, new=True)
    # then the task is not failed with "No bidders registered": the node is its candidate
    # and wins it
    found = row(settings, task.task_id)
    assert found.state == lifecycle.ASSIGNED, found.error
    assert found.candidates == ["scanner"] and found.assigned_node == "scanner"


def test_a_node_whose_heartbeats_failed_a_moment_ago_is_waited_for(settings: Settings) -> None:
    # given the only ocr node still marked online, whose heartbeats stopped reaching the store
    # a little longer ago than the heartbeat TTL (its store connections were dropped)
    node(settings, "scanner", ["ocr"])
    with write_session(settings.database_url) as session:
        session.execute(update(Node).values(
            last_heartbeat=time.time() - settings.heartbeat_ttl - 2))
    invalidate_cache()
    # when a task for ocr is announced
    task = announcement()
    assert open_auction(Context(settings, app()), task, new=True)
    # then it waits for the node, within the grace period, instead of failing at once
    found = row(settings, task.task_id)
    assert found.state == lifecycle.DEFERRED, found.error
    kind, _, _, detail = log(settings, task.task_id)[-1]
    assert kind == "DEFERRED" and detail["waiting_for"] == ["scanner"]


def test_a_caller_outlasts_a_dropped_store_connection_while_reading_the_live_nodes(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a live ocr node, and a store whose first liveness read fails as a dropped
    # connection does
    from sqlalchemy.exc import OperationalError

    from bidding.nodes import registry

    node(settings, "scanner", ["ocr"])
    real = registry.query_live_nodes
    calls: list[int] = []

    def dropped(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OperationalError("SELECT", {}, Exception("server closed the connection"))
        return real(*args, **kwargs)

    monkeypatch.setattr(registry, "query_live_nodes", dropped)
    task = announcement()
    # when a task for ocr is announced
    if settings.database_url.startswith("sqlite"):
        # (SQLite has no connection to drop: its errors are raised as they are)
        with pytest.raises(OperationalError):
            open_auction(Context(settings, app()), task, new=True)
        return
    assert open_auction(Context(settings, app()), task, new=True)
    # then the read is tried again and the task is awarded, not failed or refused
    found = row(settings, task.task_id)
    assert (found.state, found.assigned_node) == (lifecycle.ASSIGNED, "scanner")
    assert len(calls) == 2


def test_an_award_whose_commit_landed_and_whose_reply_was_lost_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a live ocr node on PostgreSQL, and the first commit of an award that lands while
    # its reply is lost with the connection (severed just then: a failover, a PgBouncer
    # restart)
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    from bidding.auction import bind as award_module
    from tests.unit.conftest import postgres_database

    with postgres_database() as url:
        settings = Settings(database_url=url, auto_migrate=False)
        node(settings, "scanner", ["ocr"])
        armed = [True]

        def lost(session: Session) -> None:
            if armed and session.info.get("awarding"):
                armed.clear()
                raise OperationalError("COMMIT", {}, ConnectionError(
                    "server closed the connection unexpectedly"), connection_invalidated=True)

        real_write_award = award_module.write_award

        def marked(session: Session, *args: Any, **kwargs: Any) -> bool:
            session.info["awarding"] = True
            return real_write_award(session, *args, **kwargs)

        monkeypatch.setattr(award_module, "write_award", marked)
        event.listen(Session, "after_commit", lost)
        try:
            task = announcement(bid_mode="proxy")
            # when a task for ocr is announced (its row, bids and award in one commit)
            assert open_auction(Context(settings, app()), task, new=True)
        finally:
            event.remove(Session, "after_commit", lost)
        # then the lost reply was met, and the task is awarded once, to the node, as stored:
        # not refused with an IntegrityError, not announced again
        assert not armed
        found = row(settings, task.task_id)
        assert (found.state, found.assigned_node) == (lifecycle.ASSIGNED, "scanner")
        kinds = [kind for kind, _, _, _ in log(settings, task.task_id)]
        assert kinds.count("ANNOUNCED") == 1 and kinds.count("AWARDED") == 1, kinds


def test_an_announcement_whose_commit_landed_and_whose_reply_was_lost_is_accepted() -> None:
    # given a live ocr node on PostgreSQL that is asked for its bid, and the first commit of
    # the new task's row landing while its reply is lost with the connection
    from sqlalchemy import event
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.orm import Session

    from tests.unit.conftest import postgres_database

    with postgres_database() as url:
        settings = Settings(database_url=url, auto_migrate=False)
        node(settings, "scanner", ["ocr"])
        armed = [True]

        def lost(session: Session) -> None:
            if armed:
                armed.clear()
                raise OperationalError("COMMIT", {}, ConnectionError(
                    "server closed the connection unexpectedly"), connection_invalidated=True)

        event.listen(Session, "after_commit", lost)
        try:
            task = announcement(bid_mode="ask")
            # when the task is announced (its write is tried again, as every caller's is)
            assert open_auction(Context(settings, app()), task, new=True)
        finally:
            event.remove(Session, "after_commit", lost)
        # then the caller is not refused with an IntegrityError: the task is up for bidding,
        # announced once
        assert not armed
        assert row(settings, task.task_id).state == lifecycle.BIDDING
        kinds = [kind for kind, _, _, _ in log(settings, task.task_id)]
        assert kinds == ["ANNOUNCED"], kinds


def test_a_new_task_whose_bid_requests_cannot_be_sent_ends_failed_with_the_reason(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a live ocr node, and a broker that refuses every publish
    node(settings, "scanner", ["ocr"])

    def down(*_: Any, **__: Any) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr(routes_module, "request_bids", down)
    task = announcement(bid_mode="ask")
    # when it is announced, the caller gets the error
    with pytest.raises(ConnectionError):
        open_auction(Context(settings, app()), task, new=True)
    # and the store does not keep a half-announced task: it ended FAILED, saying why
    found = row(settings, task.task_id)
    assert found.state == lifecycle.FAILED
    assert found.error == ("its bid requests could not be sent: ConnectionError: "
                           "broker down")


def test_a_result_the_backend_lacks_is_written_from_the_store(settings: Settings) -> None:
    # given a task that succeeded in the store, whose result never reached the backend
    celery = app()
    task = assigned(settings)
    with write_session(settings.database_url) as session:
        session.execute(update(AnnouncementRow)
                        .where(AnnouncementRow.task_id == task.task_id)
                        .values(state=lifecycle.SUCCESS, result={"value": {"pages": 3}}))
    assert celery.AsyncResult(task.task_id).state == "PENDING"
    # when its worker reports that the write failed, and a sweeper's report phase runs
    assert report_if_final(settings, task.task_id, delay=0)
    written = report_results(Context(settings, celery), now=time.time() + 1)
    # then the caller's result holds the real value, written once
    assert written == 1
    assert celery.AsyncResult(task.task_id).get(timeout=1) == {"pages": 3}
    assert report_results(Context(settings, celery), now=time.time() + 60) == 0


def test_a_failure_the_backend_lacks_is_written_with_its_own_error(settings: Settings) -> None:
    # given a task that failed in the store with the task's own error
    celery = app()
    task = assigned(settings)
    stored = {"exception": {"exc_type": "ValueError", "exc_module": "builtins",
                            "exc_message": ["bad page"]}}
    with write_session(settings.database_url) as session:
        session.execute(update(AnnouncementRow)
                        .where(AnnouncementRow.task_id == task.task_id)
                        .values(state=lifecycle.FAILED, result=stored, error="bad page"))
    # when it is reported
    assert report_if_final(settings, task.task_id, delay=0)
    assert report_results(Context(settings, celery), now=time.time() + 1) == 1
    # then the caller's .get() raises that error
    with pytest.raises(ValueError, match="bad page"):
        celery.AsyncResult(task.task_id).get(timeout=1)


def test_a_task_still_running_is_not_reported(settings: Settings) -> None:
    # given a task still ASSIGNED
    task = assigned(settings)
    # then a failed result write cannot make a sweeper report it
    assert not report_if_final(settings, task.task_id, delay=0)


def test_an_announcers_zero_schedule_to_start_means_no_limit_on_every_node() -> None:
    # given a task announced with no schedule-to-start limit, watched by a sweeper whose own
    # default is 60 s
    task = announcement(schedule_to_start_timeout=0)
    # then the sweeper applies none
    assert start_by(Settings(schedule_to_start_timeout=60), task, 100.0) is None
    assert start_by(Settings(schedule_to_start_timeout=60), announcement(), 100.0) == 160.0


@pytest.mark.parametrize("answers", ["none", "a failed bid"])
def test_an_auction_no_candidate_answered_is_announced_again_then_fails(
    settings: Settings, answers: str,
) -> None:
    # given an open auction whose one candidate never answers (killed before its heartbeat
    # expired), or answers only that it could not bid (its store restarting)
    settings = settings.model_copy(update={"silent_rounds": 2})
    task = announcement(bid_mode="ask")
    bidding_row(settings, task, ["scanner"])
    if answers == "a failed bid":
        StoreBoard(settings.database_url).post(
            Refusal(task_id=task.task_id, node="scanner", reason="bid failed: store down",
                    failed=True), expected=1, window=task.window)
    # when its window closes
    close_auction(Context(settings, app()), task.task_id, 1, closed_by="deadline")
    # then it is announced again a heartbeat interval later, and the log says why
    found = row(settings, task.task_id)
    assert found.state == lifecycle.DEFERRED and found.spec["silent_rounds"] == 1
    assert found.attempt == 2  # a new round: late answers to this one are told apart
    kind, _, _, detail = log(settings, task.task_id)[-1]
    assert kind == "DEFERRED" and "announced again, round 2 of 3" in detail["reason"]
    # and when its last round closes silent too, it fails with seed 001's outcome
    last = Announcement.model_validate(found.spec).model_copy(update={"silent_rounds": 2})
    with write_session(settings.database_url) as session:
        session.execute(update(AnnouncementRow).where(AnnouncementRow.task_id == task.task_id)
                        .values(state=lifecycle.BIDDING, spec=last.model_dump(mode="json")))
    close_auction(Context(settings, app()), task.task_id, 2, closed_by="deadline")
    found = row(settings, task.task_id)
    assert found.state == lifecycle.FAILED and (found.error or "").startswith("No bids received")


def test_an_auction_whose_candidate_refused_fails_at_once(settings: Settings) -> None:
    # given an open auction whose one candidate refused it (a decision, not an outage)
    task = announcement(bid_mode="ask")
    bidding_row(settings, task, ["scanner"])
    StoreBoard(settings.database_url).post(
        Refusal(task_id=task.task_id, node="scanner", reason="too busy"), expected=1,
        window=task.window)
    # when it closes, it fails with the refusal's reason, not announced again
    close_auction(Context(settings, app()), task.task_id, 1, closed_by="deadline")
    found = row(settings, task.task_id)
    assert found.state == lifecycle.FAILED and "too busy" in (found.error or "")


def test_attempts_lost_with_their_worker_do_not_teach_a_node_it_cannot_do_the_work(
    settings: Settings,
) -> None:
    # given a node that did a task type well once, then lost five attempts of it when its
    # worker was killed and restarted
    from bidding.auction.history import gather_histories
    from bidding.auction.scores import estimated_success
    from bidding.execution.episodes import record_episode

    node(settings, "scanner", ["ocr"])
    with write_session(settings.database_url) as session:
        for k in range(6):
            record_episode(session, {
                "task_id": f"t{k}", "attempt": 1, "node": "scanner", "task_type": "work",
                "skills": ["ocr"], "success": k == 0, "duration_s": 0.1, "cost": 0.0,
                "error": None if k == 0 else "worker scanner@h restarted", "finished_at": k,
                "lost": k > 0})
    # when it bids on that type
    history = gather_histories(settings, ["scanner"], "work")["scanner"]
    # then its confidence rests on the work it did, and its record (trust) has all six
    assert history.outcomes == (True,) and estimated_success(history.outcomes) == 1.0
    assert (history.attempts, history.successes) == (6, 1)


def test_warm_pays_the_first_calls_costs_at_start_up(fresh_url: str) -> None:
    # given a caller's app whose store does not exist yet
    import bidding
    from bidding.config import reset_settings

    celery = app()
    celery.conf.bidding_database_url = fresh_url
    reset_settings(celery)
    # when it warms up at start-up
    bidding.warm(celery)
    # then the store exists with its schema, and Celery's backend is built
    from sqlalchemy import inspect

    from bidding.store import get_engine

    assert "bidding_announcements" in inspect(get_engine(fresh_url)).get_table_names()
    assert "backend" in celery._local.__dict__ or celery._backend_cache is not None


def test_a_dropped_copy_whose_store_read_fails_is_still_only_dropped(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    # given a node dropping a stale copy of a task's execution while its store connection is
    # severed (restore_view reads the task to mend Flower's view)
    from sqlalchemy.exc import OperationalError

    from bidding.execution import report

    def severed(*_: Any, **__: Any) -> Any:
        raise OperationalError("SELECT", {}, ConnectionError("server closed the connection"))

    monkeypatch.setattr(report, "read_session", severed)
    # when it restores the view, then nothing is raised (an error here would reach the caller
    # as the task's outcome, though the task ran elsewhere), and the log says what was skipped
    report.restore_view(Context(settings, Celery("t", broker="memory://",
                                                 set_as_current=False)), "t-1")
    assert "Flower's view of it not restored" in caplog.text


def test_a_dropped_copy_points_flower_back_at_the_worker_that_ran_it_twice(
    settings: Settings, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bidding import clock
    from bidding.execution import report
    from bidding.lifecycle import events, states
    from bidding.models import Announcement
    from tests.stored import add_announcement

    # given a task that succeeded on bluefin, and sent events recorded
    add_announcement(settings.database_url,
                     Announcement(task_id="t-ran", task_name="t.work", task_type="work",
                                  announced_at=clock.now()),
                     states.SUCCESS, ["bluefin"], worker="bluefin@host",
                     result={"value": 7}, started_at=10.0, finished_at=12.5)
    sent: list[tuple[str, str | None, float]] = []
    monkeypatch.setattr(events, "send", lambda app, kind, task_id, hostname=None, **_: (
        sent.append((kind, hostname, time.monotonic()))))
    monkeypatch.setattr(report, "VIEW_RESENT_AFTER", 0.2)
    # when another node drops its stale copy and restores Flower's view
    began = time.monotonic()
    report.restore_view(Context(settings, Celery("t", broker="memory://", set_as_current=False)),
                        "t-ran")
    # then the task's real outcome is sent from bluefin's worker at once
    assert [(kind, host) for kind, host, _ in sent] == [("task-succeeded", "bluefin@host")]
    # and once more a little later, after the copy's own buffered events have reached Flower
    deadline = time.monotonic() + 5
    while len(sent) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [(kind, host) for kind, host, _ in sent] == [("task-succeeded", "bluefin@host")] * 2
    assert sent[1][2] - began >= 0.2
