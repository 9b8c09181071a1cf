"""The HTTP API (issue 13) through its ASGI app: a SQLite store, a memory:// broker, no worker."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from fastapi.testclient import TestClient

import bidding
from bidding.api.app import create_app
from bidding.config import celery_conf, get_settings, load_settings
from bidding.context import Context
from bidding.graphs.advance import advance
from bidding.nodes.heartbeat import heartbeat
from bidding.nodes.profile import load_profile
from bidding.nodes.registry import invalidate_cache

REPO = Path(__file__).resolve().parents[2]

#: A task without subtasks: one auction for the capability.
SINGLE: dict[str, Any] = {
    "name": "Extract one paper",
    "agent_capability": "pdf_text_extraction",
    "input": {"type": "object", "required": ["paper_pdf_url"],
              "properties": {"paper_pdf_url": {"type": "string"}}},
    "input_values": {"paper_pdf_url": "https://example.org/a.pdf"},
}


def make_app(store_url: str, **conf: Any) -> Celery:
    app = Celery("api", set_as_current=False)
    app.conf.update(celery_conf("memory://", "cache+memory://"),
                    bidding_database_url=store_url, **conf)

    @app.task(shared=False, base=bidding.BiddingTask, name="t.extract",
              capability="pdf_text_extraction")
    def extract(paper_pdf_url: str) -> dict[str, Any]:
        return {"text": paper_pdf_url}

    return app


@pytest.fixture
def celery_app(store_url: str) -> Celery:
    invalidate_cache()
    # Asking its nodes, so that an auction stays open until bluefin (no worker here) answers;
    # in "auto" the caller would bid for it and award at once.
    return make_app(store_url, bidding_bid_mode="ask")


@pytest.fixture
def client(celery_app: Celery) -> TestClient:
    return TestClient(create_app(celery_app))


def nodes_beat(store_url: str, *names: str) -> None:
    """The demo's nodes ``names`` (profiles in workers/) are alive, as their heartbeats say."""
    settings = load_settings({"bidding_database_url": store_url}, environ={})
    for name in names:
        heartbeat(settings, load_profile(REPO / "workers" / f"{name}.toml"))
    invalidate_cache()


def bluefin_beats(store_url: str) -> None:
    """Node bluefin (pdf_text_extraction) is alive: auctions stay open, waiting for its bid."""
    nodes_beat(store_url, "bluefin")


def finish(store_url: str, task_id: str, value: Any) -> None:
    """The task's node ran it: SUCCESS with its value, started 1.5 s before it ended."""
    now = time.time()
    with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE bidding_announcements SET state = 'SUCCESS', started_at = ?, "
                     "finished_at = ?, result = json(?) WHERE task_id = ?",
                     (now - 1.5, now, f'{{"value": {value}}}', task_id))
    conn.close()


def test_a_submitted_definition_is_created_and_then_readable(
        client: TestClient, store_url: str) -> None:
    # given a live node that can extract text
    bluefin_beats(store_url)
    # when a one-step definition is posted
    created = client.post("/aitp/tasks", json=SINGLE)
    # then it is created, EXECUTING (its step is announced), with its id and time
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["status"] == "EXECUTING"
    assert body["created_at"] == pytest.approx(time.time(), abs=30)
    # and GET shows it, its one step announced and no cost yet
    state = client.get(f"/aitp/tasks/{body['task_id']}")
    assert state.status_code == 200, state.text
    shown = state.json()
    assert shown["task_id"] == body["task_id"]
    assert shown["status"] == "EXECUTING"
    assert shown["progress"]["steps"][0]["status"] == "BIDDING"
    assert shown["current_step"] == 1 and shown["cost_so_far"] == 0
    assert shown["progress"]["total_steps"] == 1
    assert shown["progress"]["steps"][0]["agent_capability"] == "pdf_text_extraction"
    assert shown["estimated_completion"] is None
    # and its result is not there yet: 409, saying so
    result = client.get(f"/aitp/tasks/{body['task_id']}/result")
    assert result.status_code == 409, result.text
    assert "not done" in result.json()["detail"]
    # and its bids are its subtask's auction (bluefin asked, no answer yet)
    bids = client.get(f"/aitp/tasks/{body['task_id']}/bids")
    assert bids.status_code == 200, bids.text
    (auction,) = bids.json()["subtasks"].values()
    assert auction["candidates"] == ["bluefin"] and auction["state"] == "BIDDING"


def test_a_plain_bidding_task_is_read_by_its_id(
        client: TestClient, celery_app: Celery, store_url: str) -> None:
    # given a .delay() task whose auction is open
    bluefin_beats(store_url)
    task_id = celery_app.tasks["t.extract"].delay("https://example.org/b.pdf").id
    # when its status is read, then it is PENDING (bidding) and not done
    state = client.get(f"/aitp/tasks/{task_id}")
    assert state.status_code == 200, state.text
    assert (state.json()["status"], state.json()["state"]) == ("PENDING", "BIDDING")
    assert client.get(f"/aitp/tasks/{task_id}/result").status_code == 409
    # and its bids are `bidding explain --json`
    bids = client.get(f"/aitp/tasks/{task_id}/bids").json()
    assert bids["task_id"] == task_id and bids["strategy"] == "weighted"
    # given its node ran it in 1.5 s
    finish(store_url, task_id, '{"text": "b"}')
    # when its result is read, then it is COMPLETED with the task's value and its time
    result = client.get(f"/aitp/tasks/{task_id}/result")
    assert result.status_code == 200, result.text
    got = result.json()
    assert got["status"] == "COMPLETED" and got["result"] == {"text": "b"}
    assert got["execution_time_ms"] == pytest.approx(1500, abs=5)
    assert got["cost"] == 0 and got["error"] is None
    assert client.get(f"/aitp/tasks/{task_id}").json()["status"] == "COMPLETED"


def test_a_task_that_found_no_node_has_failed_with_its_reason(
        client: TestClient, celery_app: Celery) -> None:
    # given no live node at all
    # when a definition is posted, then it is accepted, and its only step fails at once
    created = client.post("/aitp/tasks", json=SINGLE)
    assert created.status_code == 201, created.text
    task_id = created.json()["task_id"]
    # and a node's sweeper moves the task on (fails it for its step)
    advance(Context(get_settings(celery_app), celery_app), task_id)
    # then its result is final: FAILED, naming why
    result = client.get(f"/aitp/tasks/{task_id}/result")
    assert result.status_code == 200, result.text
    assert result.json()["status"] == "FAILED"
    assert "No bidders registered" in result.json()["error"]
    assert result.json()["result"] is None


@pytest.mark.parametrize("path", ["/aitp/tasks/nope", "/aitp/tasks/nope/result",
                                  "/aitp/tasks/nope/bids"])
def test_an_unknown_id_is_404(client: TestClient, path: str) -> None:
    # given an id nothing was submitted under, when it is read, then 404 names it
    answer = client.get(path)
    assert answer.status_code == 404, answer.text
    assert "nope" in answer.json()["detail"]


def test_a_definition_that_does_not_validate_is_422_naming_the_field(
        client: TestClient) -> None:
    # given a definition whose subtask lacks its capability
    bad = {"name": "x", "subtasks": [{"subtask_id": "s1", "name": "one"}]}
    # when it is posted, then 422 names the subtask's field
    answer = client.post("/aitp/tasks", json=bad)
    assert answer.status_code == 422, answer.text
    locs = [e["loc"] for e in answer.json()["detail"]]
    assert ["body", "subtasks", 0, "agent_capability"] in locs
    # given a definition without a name, then 422 names it
    nameless = client.post("/aitp/tasks", json={"agent_capability": "pdf_text_extraction"})
    assert nameless.status_code == 422
    assert ["body", "name"] in [e["loc"] for e in nameless.json()["detail"]]
    # given a body that is not an object, then 422 too, never 500
    assert client.post("/aitp/tasks", json=[1, 2]).status_code == 422


def test_a_definition_that_cannot_run_is_422_naming_the_subtask(client: TestClient) -> None:
    # given a subtask asking for a capability no task of the app implements
    spec = {"name": "x", "subtasks": [
        {"subtask_id": "s1", "name": "one", "agent_capability": "telepathy"}]}
    # when it is posted, then 422 names the subtask and the capability
    answer = client.post("/aitp/tasks", json=spec)
    assert answer.status_code == 422, answer.text
    message = " ".join(e["msg"] for e in answer.json()["detail"])
    assert "s1" in message and "telepathy" in message
    # given a required input value missing, then 422 names the input field
    missing = client.post("/aitp/tasks", json={**SINGLE, "input_values": {}})
    assert missing.status_code == 422, missing.text
    assert "paper_pdf_url" in str(missing.json()["detail"])


def test_a_definition_with_nan_in_its_input_is_422_naming_the_field(client: TestClient) -> None:
    # given a definition whose input values hold NaN (Python's JSON reader accepts it; JSON
    # has no NaN, and the subtask's stored announcement would say null)
    body = ('{"name": "x", "agent_capability": "pdf_text_extraction", '
            '"input_values": {"paper_pdf_url": "https://example.org/a.pdf", '
            '"options": {"dpi": NaN}}}')
    # when it is posted
    answer = client.post("/aitp/tasks", content=body,
                         headers={"content-type": "application/json"})
    # then 422 names the field and says why
    assert answer.status_code == 422, answer.text
    assert "input['options']['dpi']: NaN is not JSON" in str(answer.json()["detail"])


def test_writes_need_the_token_when_it_is_set(store_url: str) -> None:
    # given an API token
    client = TestClient(create_app(make_app(store_url, bidding_api_token="s3cret")))
    # when a definition is posted without it, or with a wrong one, then 401
    assert client.post("/aitp/tasks", json=SINGLE).status_code == 401
    wrong = client.post("/aitp/tasks", json=SINGLE, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert wrong.headers["WWW-Authenticate"] == "Bearer"
    # when it is posted with the token, then it is created
    ok = client.post("/aitp/tasks", json=SINGLE, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 201, ok.text
    # and reads stay open
    assert client.get(f"/aitp/tasks/{ok.json()['task_id']}").status_code == 200
    assert client.get("/aitp/nodes").status_code == 200


def test_reads_need_a_token_when_the_read_token_is_set(store_url: str) -> None:
    # given a write token and a read token
    client = TestClient(create_app(make_app(store_url, bidding_api_token="w",
                                            bidding_api_read_token="r")))
    # when the stats are read without a token, then 401
    assert client.get("/aitp/stats").status_code == 401
    # when they are read with either token, then they are shown
    for token in ("r", "w"):
        answer = client.get("/aitp/stats", headers={"Authorization": f"Bearer {token}"})
        assert answer.status_code == 200, answer.text
    # and the read token does not allow writes
    denied = client.post("/aitp/tasks", json=SINGLE, headers={"Authorization": "Bearer r"})
    assert denied.status_code == 401


def test_nodes_show_profile_liveness_load_trust_wins_and_success_rate(
        client: TestClient, store_url: str) -> None:
    # given bluefin alive, with 4 finished attempts of which 1 succeeded
    bluefin_beats(store_url)
    with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
        conn.execute("UPDATE bidding_nodes SET attempts = 4, successes = 1")
    conn.close()
    # when the nodes are listed
    answer = client.get("/aitp/nodes")
    assert answer.status_code == 200, answer.text
    (node,) = answer.json()
    # then bluefin is live, idle, with its profile, learned trust and record
    assert node["name"] == "bluefin" and node["live"] is True and node["status"] == "online"
    assert "pdf_text_extraction" in node["capabilities"]
    assert node["load"] == 0 and node["in_flight"] == 0 and node["tasks_won"] == 0
    assert node["success_rate"] == 0.25
    # and its learned trust moved from its declared 75 toward 25%: (75 x 10 + 100) / 14
    assert node["trust"] == 75 and node["learned_trust"] == pytest.approx(60.7, abs=0.05)


def test_stats_are_those_of_bidding_stats(client: TestClient, store_url: str) -> None:
    # given one announced task
    bluefin_beats(store_url)
    assert client.post("/aitp/tasks", json=SINGLE).status_code == 201
    # when the stats are read, then it is counted, unfinished
    stats = client.get("/aitp/stats").json()
    assert (stats["announced"], stats["unfinished"]) == (1, 1)
    # with its task type, the escalations, and the protocol checker's verdict on its log
    [task_type] = stats["task_types"]
    assert (task_type["announced"], task_type["unfinished"]) == (1, 1)
    assert (stats["escalated"], stats["watch_escalated"]) == (0, 0)
    assert stats["protocol"] == {"tasks_checked": 1, "violations": 0,
                                 "tasks_with_violations": 0, "by_rule": {}}
    # and ?since= after it leaves it out
    assert client.get("/aitp/stats", params={"since": time.time() + 60}).json()[
        "announced"] == 0
    # and ?protocol=false (the dashboard's polls) skips the replay of the log
    cheap = client.get("/aitp/stats", params={"protocol": "false"}).json()
    assert (cheap["announced"], cheap["protocol"]) == (1, None)
    # and a since that is not a number of seconds is refused, naming it
    nan = client.get("/aitp/stats", params={"since": "nan"})
    assert nan.status_code == 422 and "since" in nan.text


def test_the_openapi_schema_declares_every_status_code(client: TestClient) -> None:
    # when the schema is read
    paths = client.get("/openapi.json").json()["paths"]
    codes = {(path, method): set(op["responses"]) for path, ops in paths.items()
             for method, op in ops.items()}
    # then each endpoint declares what it answers
    assert {"201", "401", "422", "503"} <= codes[("/aitp/tasks", "post")]
    assert {"200", "401", "404", "503"} <= codes[("/aitp/tasks/{task_id}", "get")]
    assert {"200", "401", "404", "409", "503"} <= codes[("/aitp/tasks/{task_id}/result", "get")]
    assert {"200", "401", "404"} <= codes[("/aitp/tasks/{task_id}/bids", "get")]
    assert {"200", "401"} <= codes[("/aitp/nodes", "get")]
    assert {"200", "401", "422"} <= codes[("/aitp/stats", "get")]


def test_a_completed_graph_reads_completed_with_its_result(
        client: TestClient, celery_app: Celery, store_url: str) -> None:
    # given a posted one-step task whose subtask a node ran in 1.5 s
    bluefin_beats(store_url)
    task_id = client.post("/aitp/tasks", json=SINGLE).json()["task_id"]
    step = client.get(f"/aitp/tasks/{task_id}").json()["progress"]["steps"][0]
    finish(store_url, step["task_id"], '{"text": "a"}')
    # and the node moved the graph on
    advance(Context(get_settings(celery_app), celery_app), task_id)
    # when its status and result are read, then it is COMPLETED with the subtask's output
    state = client.get(f"/aitp/tasks/{task_id}").json()
    assert state["status"] == "COMPLETED" and state["progress"]["percent_complete"] == 100
    result = client.get(f"/aitp/tasks/{task_id}/result")
    assert result.status_code == 200, result.text
    assert result.json()["status"] == "COMPLETED"
    assert result.json()["result"] == {"text": "a"}
    assert result.json()["execution_time_ms"] > 0


def test_a_store_that_cannot_be_opened_is_503_naming_it(tmp_path: Path) -> None:
    # given an app whose store is in a folder that does not exist
    url = f"sqlite:///{tmp_path / 'missing' / 'store.db'}"
    client = TestClient(create_app(make_app(url)), raise_server_exceptions=False)
    # when anything is read or written, then 503 names the store, never 500 or 422
    for answer in (client.get("/aitp/nodes"), client.get("/aitp/stats"),
                   client.get("/aitp/tasks/x"), client.post("/aitp/tasks", json=SINGLE)):
        assert answer.status_code == 503, answer.text
        assert "missing" in answer.json()["detail"]


def test_a_delegated_tasks_watch_and_its_escalation_are_shown(
        client: TestClient, store_url: str) -> None:
    from bidding.config import Settings
    from tests.unit.test_checking import delegated, watched

    # given a task delegated to a node, escalated by the watch
    task_id, t0 = delegated(Settings(database_url=store_url, auto_migrate=False))
    watched(Settings(database_url=store_url), task_id, check_attempts=10, check_since=t0,
            next_check_time=t0 + 1800, escalated_at=t0 + 9000,
            escalation="silent after 10 checks (node n1 alive, not running it)")
    # when its status is read
    shown = client.get(f"/aitp/tasks/{task_id}").json()
    # then its state is still its own, and the watch says it is escalated and why
    assert (shown["status"], shown["state"]) == ("PENDING", "ASSIGNED")
    assert shown["watch"] == {"check_attempts": 10, "next_check_time": t0 + 1800,
                              "escalated": True, "escalated_at": t0 + 9000,
                              "reason": "silent after 10 checks (node n1 alive, not running it)"}


def test_reset_clears_an_escalation_and_puts_the_task_back_under_watch(
        store_url: str) -> None:
    from bidding.config import Settings
    from tests.unit.test_checking import delegated, watched

    # given a task escalated by the watch, and an API with a write token
    task_id, t0 = delegated(Settings(database_url=store_url, auto_migrate=False))
    watched(Settings(database_url=store_url), task_id, check_attempts=10, check_since=t0,
            next_check_time=t0 + 1800, escalated_at=t0 + 9000, escalation="silent")
    client = TestClient(create_app(make_app(store_url, bidding_api_token="s3cret")))
    # when it is reset without the token, then 401 and nothing changes
    assert client.post(f"/aitp/tasks/{task_id}/reset").status_code == 401
    assert client.get(f"/aitp/tasks/{task_id}").json()["watch"]["escalated"] is True
    # when it is reset with the token
    done = client.post(f"/aitp/tasks/{task_id}/reset",
                       headers={"Authorization": "Bearer s3cret"})
    # then the answer says what was cleared, and the task is under watch again
    assert done.status_code == 200, done.text
    assert done.json() == {"task_id": task_id, "state": "ASSIGNED", "node": done.json()["node"],
                           "cleared_attempts": 10, "cleared_escalation": "silent",
                           "cleared_parked": None, "watched": True}
    watch = client.get(f"/aitp/tasks/{task_id}").json()["watch"]
    assert (watch["check_attempts"], watch["escalated"]) == (0, False)
    # and an unknown id is 404
    missing = client.post("/aitp/tasks/nope/reset", headers={"Authorization": "Bearer s3cret"})
    assert missing.status_code == 404 and "nope" in missing.json()["detail"]


def test_closed_auctions_are_listed_newest_first_with_their_bids_and_why(
        store_url: str) -> None:
    # given bluefin and sasass alive, and proxy bidding (the caller bids for them and awards)
    nodes_beat(store_url, "bluefin", "sasass")
    app = make_app(store_url, bidding_bid_mode="proxy")
    client = TestClient(create_app(app))
    # when a task both can do is called, then one that needs a skill nobody has
    won = app.tasks["t.extract"].delay("https://example.org/c.pdf").id
    lost = app.tasks["t.extract"].apply_async(
        ["x"], bidding={"required_skills": ["quantum_annealing"]}).id
    # then the auctions are listed newest first
    feed = client.get("/aitp/auctions").json()
    assert [a["task_id"] for a in feed["auctions"]] == [lost, won]
    newest, oldest = feed["auctions"]
    # ... the lost one without a winner, saying why
    assert newest["winner"] is None and newest["outcome"] == "failed"
    assert newest["why"][0].startswith("no award: No bidders registered")
    # ... the won one with both bids, their scores and breakdowns, the winner among them
    assert oldest["task_name"] == "t.extract" and oldest["strategy"] == "weighted"
    assert {b["node"] for b in oldest["bids"]} == {"bluefin", "sasass"}
    (winning,) = [b for b in oldest["bids"] if b["is_winner"]]
    assert winning["node"] == oldest["winner"]
    assert winning["score"] == oldest["winning_score"] == pytest.approx(1.0)
    assert winning["breakdown"]["terms"] == {"confidence": 0.6, "skill_match": 0.4}
    assert oldest["assignment_ms"] is not None and oldest["assignment_ms"] >= 0
    assert oldest["why"][0].startswith(f"{oldest['winner']} won a tie with ")
    # and the explain of the task says the same why
    assert client.get(f"/aitp/tasks/{won}/bids").json()["why"] == oldest["why"]
    # when asked for what closed after the newest, then nothing; and the limit holds
    assert client.get("/aitp/auctions", params={"after": feed["cursor"]}).json() == {
        "auctions": [], "cursor": feed["cursor"], "older": None}
    assert len(client.get("/aitp/auctions", params={"limit": 1}).json()["auctions"]) == 1
    # and paging back one at a time, then by outcome, reaches the same auctions
    first = client.get("/aitp/auctions", params={"limit": 1}).json()
    second = client.get("/aitp/auctions", params={"limit": 1, "before": first["older"]}).json()
    assert [first["auctions"][0]["task_id"], second["auctions"][0]["task_id"]] == [lost, won]
    assert second["older"] is None
    failed = client.get("/aitp/auctions", params={"outcome": "failed"}).json()["auctions"]
    assert [a["task_id"] for a in failed] == [lost]
    contested = client.get("/aitp/auctions", params={"contested": "true"}).json()["auctions"]
    assert [a["task_id"] for a in contested] == [won]


@pytest.mark.parametrize(("params", "named"), [
    ({"outcome": "won"}, "outcome"),
    ({"before": 0}, "before"),
    ({"contested": "maybe"}, "contested"),
    ({"since": "yesterday"}, "since"),
    ({"since": 100.0, "until": 50.0}, "until"),
    ({"since": "nan"}, "since"),
    ({"node": "x" * 33}, "node"),
    ({"task_type": ""}, "task_type"),
])
def test_a_bad_query_parameter_of_the_auction_feed_is_a_422_naming_it(
        client: TestClient, params: dict[str, Any], named: str) -> None:
    # when the feed is asked with a parameter it cannot use
    answer = client.get("/aitp/auctions", params=params)
    # then it says which, instead of guessing
    assert answer.status_code == 422, answer.text
    assert [e["loc"] for e in answer.json()["detail"]] == [["query", named]], answer.text


def test_a_subtasks_auction_names_its_graph_and_step(store_url: str) -> None:
    # given a live node and proxy bidding
    nodes_beat(store_url, "bluefin")
    client = TestClient(create_app(make_app(store_url, bidding_bid_mode="proxy")))
    # when a one-step definition is posted
    graph = client.post("/aitp/tasks", json=SINGLE).json()["task_id"]
    # then its step's auction is listed as a step of that graph
    (auction,) = client.get("/aitp/auctions").json()["auctions"]
    assert (auction["graph_id"], auction["step_id"], auction["winner"]) == (
        graph, "task", "bluefin")


def test_the_timeline_counts_assignments_per_node(store_url: str) -> None:
    # given three tasks awarded among bluefin and sasass
    nodes_beat(store_url, "bluefin", "sasass")
    app = make_app(store_url, bidding_bid_mode="proxy")
    client = TestClient(create_app(app))
    for n in range(3):
        app.tasks["t.extract"].delay(f"https://example.org/{n}.pdf")
    # when the timeline is read in 5 buckets
    timeline = client.get("/aitp/timeline", params={"buckets": 5}).json()
    # then it spans the assignments, and counts all three, by node
    assert len(timeline["buckets"]) == 5
    assert set(timeline["nodes"]) <= {"bluefin", "sasass"}
    assert sum(sum(b["counts"].values()) for b in timeline["buckets"]) == 3
    assert timeline["since"] <= timeline["until"] <= time.time()
    # and a window before them is empty
    before = client.get("/aitp/timeline", params={"since": 0, "until": 1}).json()
    assert before["nodes"] == [] and all(not b["counts"] for b in before["buckets"])


def test_the_dashboard_is_served_at_the_root_without_a_token(store_url: str) -> None:
    # given a read token
    client = TestClient(create_app(make_app(store_url, bidding_api_read_token="r")))
    # when the page and its files are fetched without it, then they are served
    page = client.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert 'src="dashboard/dashboard.js"' in page.text
    assert "#token=" in page.text  # how to give the token, on the page
    script = client.get("/dashboard/dashboard.js")
    assert script.status_code == 200 and "Authorization" in script.text
    assert client.get("/dashboard/dashboard.css").status_code == 200
    # but the data it reads needs the token
    assert client.get("/aitp/auctions").status_code == 401
    assert client.get("/aitp/auctions", headers={"Authorization": "Bearer r"}).status_code == 200
    # and the page is not an operation of the API's schema
    assert "/" not in client.get("/openapi.json").json()["paths"]


def test_the_dashboards_files_are_package_data() -> None:
    # given the files of the page and pyproject's package-data globs
    import fnmatch
    import tomllib

    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["bidding"]
    files = [p.relative_to(REPO / "bidding").as_posix()
             for p in (REPO / "bidding" / "api" / "static").iterdir()]
    # then every file goes into the wheel
    assert {"api/static/index.html", "api/static/dashboard.js"} <= set(files)
    for name in files:
        assert any(fnmatch.fnmatch(name, g) for g in globs), f"{name} is not package data"


# --- the boundary: body size, tokens, cross-site writes (issue: limits and safe defaults) ----


def announced(store_url: str) -> int:
    """How many announcements (tasks and graph steps) the store holds."""
    with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
        count = conn.execute("SELECT count(*) FROM bidding_announcements").fetchone()[0]
    conn.close()
    return int(count)


def test_a_body_over_the_limit_is_413_naming_the_setting_and_nothing_is_stored(
        client: TestClient, store_url: str) -> None:
    # given a live node, and a definition whose input holds 2 MiB (the limit is 1 MiB)
    bluefin_beats(store_url)
    big = json.dumps({**SINGLE, "input_values": {"paper_pdf_url": "x" * 2_097_152}}).encode()
    # when it is posted with its length
    declared = client.post("/aitp/tasks", content=big,
                           headers={"content-type": "application/json"})
    # then 413 names its size, the setting and the limit
    assert declared.status_code == 413, declared.text
    assert declared.json()["detail"] == (
        f"the request body ({len(big)} bytes) is over bidding_api_max_body_bytes "
        "(1048576 bytes)")
    # when it is posted chunked, without a length
    chunked = client.post("/aitp/tasks", content=iter([big[:1_000_000], big[1_000_000:]]),
                          headers={"content-type": "application/json"})
    # then 413 names the setting and the limit too
    assert chunked.status_code == 413, chunked.text
    assert "content-length" not in chunked.request.headers
    assert chunked.json()["detail"] == ("the request body is over bidding_api_max_body_bytes "
                                        "(1048576 bytes)")
    # and nothing was recorded or announced
    assert announced(store_url) == 0
    assert client.get("/aitp/stats").json()["announced"] == 0


def test_the_body_limit_is_a_setting(store_url: str) -> None:
    # given bidding_api_max_body_bytes raised to 4 MiB
    client = TestClient(create_app(make_app(store_url, bidding_api_max_body_bytes=4_194_304)))
    bluefin_beats(store_url)
    # when a 2 MiB definition is posted, then it is past the body limit, and refused by the
    # arguments' limit instead (422: bidding_max_arguments_bytes, 1 MiB by default)
    big = {**SINGLE, "input_values": {"paper_pdf_url": "x" * 2_097_152}}
    answer = client.post("/aitp/tasks", json=big)
    assert answer.status_code == 422, answer.text
    size = len(json.dumps(big["input_values"]))
    assert (f"input: {size} bytes of JSON, more than bidding_max_arguments_bytes (1048576)"
            in str(answer.json()["detail"]))
    assert announced(store_url) == 0


def test_with_only_a_read_token_writes_need_it_too(store_url: str) -> None:
    # given a read token and no write token
    client = TestClient(create_app(make_app(store_url, bidding_api_read_token="r")))
    bluefin_beats(store_url)
    # when a definition is posted, or a task reset, without a token
    for answer in (client.post("/aitp/tasks", json=SINGLE),
                   client.post("/aitp/tasks/nope/reset", headers={"X-Bidding-Request": "1"})):
        # then 401 says which token to send
        assert answer.status_code == 401, answer.text
        assert answer.json()["detail"] == (
            "missing or wrong bearer token: send Authorization: Bearer <bidding_api_read_token> "
            "(no bidding_api_token is set, so the read token guards writes too)")
    # when they are sent with the read token, then they are done
    auth = {"Authorization": "Bearer r"}
    assert client.post("/aitp/tasks", json=SINGLE, headers=auth).status_code == 201
    assert client.post("/aitp/tasks/nope/reset", headers=auth).status_code == 404
    assert announced(store_url) == 1


def test_a_401_says_which_token_to_send(store_url: str) -> None:
    # given both tokens
    client = TestClient(create_app(make_app(store_url, bidding_api_token="w",
                                            bidding_api_read_token="r")))
    # when a write and a read come without a token, then each 401 names its token
    write = client.post("/aitp/tasks/nope/reset")
    assert write.status_code == 401
    assert write.json()["detail"] == ("missing or wrong bearer token: send Authorization: "
                                      "Bearer <bidding_api_token>")
    read = client.get("/aitp/nodes")
    assert read.status_code == 401
    assert read.json()["detail"] == ("missing or wrong bearer token: send Authorization: "
                                     "Bearer <bidding_api_read_token> (or bidding_api_token)")


def test_a_write_a_page_on_another_site_could_send_is_refused(
        client: TestClient, store_url: str) -> None:
    # given an API without any token (on the loopback), a live node, and a task escalated by
    # the watch
    from bidding.config import Settings
    from tests.unit.test_checking import delegated, watched

    bluefin_beats(store_url)
    task_id, t0 = delegated(Settings(database_url=store_url, auto_migrate=False))
    watched(Settings(database_url=store_url), task_id, check_attempts=10, check_since=t0,
            next_check_time=t0 + 1800, escalated_at=t0 + 9000, escalation="silent")
    # when a page elsewhere POSTs the reset (no body, no header: no CORS preflight), or a
    # definition as text or without a content type
    refused = [client.post(f"/aitp/tasks/{task_id}/reset"),
               client.post("/aitp/tasks", content=json.dumps(SINGLE),
                           headers={"content-type": "text/plain"}),
               client.post("/aitp/tasks", content=json.dumps(SINGLE)),
               # Basic credentials the browser remembers for the API's address go with a form
               client.post(f"/aitp/tasks/{task_id}/reset",
                           headers={"Authorization": "Basic dXNlcjpwYXNz"})]
    # then each is 403, saying what a client sends instead
    for answer in refused:
        assert answer.status_code == 403, answer.text
        assert answer.json()["detail"] == (
            "a write needs the header X-Bidding-Request: 1 (or a JSON body, or a bearer "
            "token): a web page on another site can send neither without a CORS preflight, "
            "which this API does not answer")
    # and nothing changed
    assert client.get(f"/aitp/tasks/{task_id}").json()["watch"]["escalated"] is True
    assert announced(store_url) == 1
    # when a client sends the header, a JSON body or a bearer token, then it is done
    assert client.post(f"/aitp/tasks/{task_id}/reset",
                       headers={"X-Bidding-Request": "1"}).status_code == 200
    assert client.post(f"/aitp/tasks/{task_id}/reset",
                       headers={"Authorization": "Bearer any"}).status_code == 200
    assert client.post("/aitp/tasks", json=SINGLE).status_code == 201
    assert client.post("/aitp/tasks", content=json.dumps(SINGLE), headers={
        "content-type": "text/plain", "X-Bidding-Request": "1"}).status_code == 422
    assert client.get(f"/aitp/tasks/{task_id}").json()["watch"]["escalated"] is False


def test_the_openapi_schema_declares_the_boundarys_refusals(client: TestClient) -> None:
    # when the schema is read
    paths = client.get("/openapi.json").json()["paths"]
    # then both writes declare 403 (cross-site) and 413 (body too large), and the header
    for path in ("/aitp/tasks", "/aitp/tasks/{task_id}/reset"):
        assert {"401", "403", "413"} <= set(paths[path]["post"]["responses"]), path
        headers = {p["name"] for p in paths[path]["post"]["parameters"] if p["in"] == "header"}
        assert headers == {"X-Bidding-Request"}, path
