"""The protocol checker over a store's message log, ``bidding check`` and what ``bidding stats``
adds (per task type, escalations, the checker's verdict), on SQLite and PostgreSQL, no broker:
the logs are written by the real announcing code (no capable node: failed, or deferred until
escalated)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from celery import Celery
from click.testing import CliRunner
from sqlalchemy import update

from bidding.auction.announce import announce_due, open_auction
from bidding.cli import main
from bidding.config import Settings
from bidding.context import Context
from bidding.lifecycle import journal
from bidding.models import Announcement, Fallbacks
from bidding.observe.logcheck import check_log
from bidding.observe.stats import collect
from bidding.store import write_session
from bidding.store.schema import Message


def app() -> Celery:
    return Celery("t", broker="memory://", backend="cache+memory://", set_as_current=False)


def submit(settings: Settings, task_type: str, *, defer: bool = False) -> str:
    """A task no live node can do: it fails at once, or is deferred (escalated on its next
    announcement)."""
    fallbacks = Fallbacks(on_capability_unavailable="defer", defer_seconds=0,
                          max_deferrals=1) if defer else Fallbacks()
    announcement = Announcement(task_id=str(uuid.uuid4()), task_name="t.work", task_type=task_type,
                       required_skills=["nobody_has_it"], fallbacks=fallbacks)
    assert open_auction(Context(settings, app()), announcement, new=True)
    return announcement.task_id


def corrupt(settings: Settings, task_id: str, of: str, **values: Any) -> None:
    """Rewrite the ``of`` messages of ``task_id`` by hand, as SQL on the store would."""
    with write_session(settings.database_url) as session:
        session.execute(update(Message).where(Message.task_id == task_id, Message.kind == of)
                        .values(**values))


def test_real_logs_keep_the_protocol_until_one_is_corrupted(settings: Settings) -> None:
    # given a task that found no node and one deferred, then escalated when announced again
    failed = submit(settings, "ocr")
    deferred = submit(settings, "translation", defer=True)
    announce_due(Context(settings, app()), now=time.time() + 1)
    # when the log is checked, then both keep the protocol
    clean = check_log(settings.database_url)
    assert (clean.tasks, clean.violations, clean.ok) == (2, [], True)
    # when a message is corrupted by hand (the escalation rewritten as a success)
    corrupt(settings, deferred, journal.ESCALATED, kind=journal.TASK_SUCCEEDED)
    # then the checker names the task, the rule and the message
    found = check_log(settings.database_url)
    assert [(v.task_id, v.rule) for v in found.violations] == [(deferred, "run_order")]
    assert found.offending() == [deferred] and not found.ok
    # and asked about the other task alone, it is clean; about an unknown one, it says so
    assert check_log(settings.database_url, [failed]).ok
    unknown = check_log(settings.database_url, [failed, "no-such-task"])
    assert (unknown.tasks, unknown.missing, unknown.ok) == (1, ["no-such-task"], False)


def test_since_leaves_out_the_tasks_announced_before(settings: Settings) -> None:
    # given a task announced, then (a moment later) a task whose log is broken
    submit(settings, "ocr")
    later = time.time()
    time.sleep(0.01)
    broken = submit(settings, "ocr")
    corrupt(settings, broken, journal.NO_AWARD, node="east", kind=journal.AWARDED)
    # when only the tasks announced since then are checked, then only the later one is
    found = check_log(settings.database_url, since=later)
    assert found.tasks == 1 and [v.rule for v in found.violations] == ["award_to_bidder"]


def test_stats_add_success_per_task_type_escalations_and_the_checkers_verdict(
        settings: Settings) -> None:
    # given two failed ocr tasks, one escalated translation, and a task the monitor flagged
    submit(settings, "ocr")
    submit(settings, "ocr")
    deferred = submit(settings, "translation", defer=True)
    announce_due(Context(settings, app()), now=time.time() + 1)
    with write_session(settings.database_url) as session:
        journal.record(session, deferred, journal.WATCH_ESCALATED, reason="silent")
    # when the stats are collected
    stats = collect(settings.database_url)
    # then each task type has its own success rate
    by_type = {t.task_type: t for t in stats.task_types}
    assert (by_type["ocr"].announced, by_type["ocr"].failed, by_type["ocr"].success_rate) == (
        2, 2, 0.0)
    assert (by_type["translation"].unfinished, by_type["translation"].success_rate) == (1, None)
    # and the escalations are counted, final and flagged apart
    assert (stats.escalated, stats.watch_escalated) == (1, 1)
    # and the checker's verdict covers every task: the flag after the escalation is a fault
    assert stats.protocol is not None
    assert (stats.protocol.tasks_checked, stats.protocol.violations) == (3, 1)
    assert stats.protocol.by_rule == {"final_is_final": 1}
    text = stats.render()
    assert "escalations: 1 escalated (final), 1 flagged by the monitor" in text
    assert "protocol checker: 3 task log(s) checked, 1 violation(s) in 1 task(s)" in text
    assert "ocr" in text and "0.0%" in text


def test_bidding_check_exits_0_when_the_log_keeps_the_protocol_and_1_when_not(
        settings: Settings) -> None:
    runner = CliRunner()
    url = settings.database_url
    # given real logs
    task = submit(settings, "ocr")
    # when `bidding check` reads them, then it exits 0 and says so
    ok = runner.invoke(main, ["check", "--database-url", url])
    assert ok.exit_code == 0, ok.output
    assert "checked 1 task(s): every one keeps the protocol" in ok.output
    # when the task's announcement is deleted from the log
    with write_session(url) as session:
        session.execute(update(Message).where(Message.task_id == task,
                                              Message.kind == journal.ANNOUNCED)
                        .values(kind="ANNOUNCD"))
    # then it exits 1, printing the task and the rule it breaks, as text and as JSON
    bad = runner.invoke(main, ["check", task, "--database-url", url])
    assert bad.exit_code == 1
    assert f"{task} known_kind: unknown kind 'ANNOUNCD'" in bad.output
    as_json = runner.invoke(main, ["check", "--database-url", url, "--json"])
    assert as_json.exit_code == 1
    verdict = json.loads(as_json.output)
    assert verdict["ok"] is False and verdict["tasks"] == 1
    assert {v["rule"] for v in verdict["violations"]} == {"known_kind", "announced_first"}
