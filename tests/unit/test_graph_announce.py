"""A task graph's step announced twice: its announcer took longer than
``UNANNOUNCED_SECONDS``, and a sweeper, finding the step started without an announcement,
announced it too. One announcement is stored; whichever announcer loses sees the step
announced and does nothing (SQLite and PostgreSQL, a memory broker, no worker)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from celery import Celery
from sqlalchemy import func, select, update

import bidding
from bidding.config import Settings, celery_conf
from bidding.context import Context
from bidding.graphs import store as rows
from bidding.graphs.advance import UNANNOUNCED_SECONDS, advance
from bidding.graphs.submit import submit
from bidding.lifecycle import journal
from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import invalidate_cache
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow, Graph, GraphStep, Message

#: A task without subtasks: one step, one auction for the capability.
SINGLE: dict[str, Any] = {
    "name": "Extract one paper",
    "agent_capability": "pdf_text_extraction",
    "input": {"type": "object", "properties": {"paper_pdf_url": {"type": "string"}}},
    "input_values": {"paper_pdf_url": "https://example.org/a.pdf"},
}


def caller_app(settings: Settings, bid_mode: str) -> Celery:
    """An announcing app (no worker) whose capability task extracts text."""
    app = Celery("graphs", set_as_current=False)
    app.conf.update(celery_conf("memory://", "cache+memory://"),
                    bidding_database_url=settings.database_url, bidding_bid_mode=bid_mode)

    @app.task(shared=False, base=bidding.BiddingTask, name="t.extract",
              capability="pdf_text_extraction")
    def extract(paper_pdf_url: str) -> dict[str, Any]:
        return {"text": paper_pdf_url}

    return app


@pytest.mark.parametrize("loser", ["original", "sweeper"])
@pytest.mark.parametrize("bid_mode", ["ask", "proxy"])
def test_a_step_announced_twice_is_announced_once_and_the_graph_runs_on(
        settings: Settings, monkeypatch: pytest.MonkeyPatch, bid_mode: str,
        loser: str) -> None:
    # (the developer's BIDDING_* settings are not this app's)
    for name in [k for k in os.environ if k.startswith("BIDDING_")]:
        monkeypatch.delenv(name)
    # given a live node that extracts text
    heartbeat(settings, NodeProfile(name="n1", capabilities=["pdf_text_extraction"]))
    invalidate_cache()
    app = caller_app(settings, bid_mode)
    task = app.tasks["t.extract"]
    real = task.apply_async
    calls: list[str] = []
    original: list[tuple[Any, Any]] = []
    done: list[Any] = []
    swept: list[BaseException] = []

    def sweeper() -> None:
        # A node's sweeper, advancing the graph nobody moved (advance_idle), finds the step
        # started longer than UNANNOUNCED_SECONDS ago without an announcement.
        with write_session(settings.database_url) as session:
            session.execute(update(GraphStep).values(
                announced_at=GraphStep.announced_at - UNANNOUNCED_SECONDS - 1))
        (graph_id,) = read_graph_ids(settings)
        try:
            advance(Context(settings, app), graph_id)
        except Exception as exc:  # what advance_idle would log
            swept.append(exc)

    def announce_in_order(*args: Any, **kwargs: Any) -> Any:
        if not calls:
            # The original announce, slower than the re-announce delay: the sweeper takes
            # the step for unannounced meanwhile.
            calls.append("original")
            original.append((args, kwargs))
            sweeper()
            if loser == "sweeper":
                return done[0]  # it committed first, within the sweeper's announce
            return real(*args, **kwargs)  # it commits after the sweeper's: it loses
        calls.append("sweeper")
        if loser == "sweeper":
            # The original commits between the sweeper's look and its announce.
            done.append(real(*original[0][0], **original[0][1]))
        return real(*args, **kwargs)

    monkeypatch.setattr(task, "apply_async", announce_in_order)
    # when the task is submitted, its step announced twice in the order that loses
    handle = submit(SINGLE, app=app)
    # then both announced it
    assert calls == ["original", "sweeper"]
    # and neither failed: the loser saw the step announced, and the graph runs on
    assert swept == []
    assert handle.status() == rows.EXECUTING
    (step,) = handle.progress().steps
    assert step.status != "FAILED"
    # and the step is one auction, announced once
    with read_session(settings.database_url) as session:
        assert session.scalar(select(func.count()).select_from(AnnouncementRow)) == 1
        assert session.scalar(select(func.count()).select_from(Message).where(
            Message.kind == journal.ANNOUNCED)) == 1
        assert session.scalar(select(GraphStep.state)) == rows.RUNNING
        # and run once: by proxy one award, sent once; asked, its auction is open
        assert session.scalar(select(func.count()).select_from(Message).where(
            Message.kind == journal.AWARDED)) == (1 if bid_mode == "proxy" else 0)


def read_graph_ids(settings: Settings) -> list[str]:
    with read_session(settings.database_url) as session:
        return list(session.scalars(select(Graph.graph_id)))
