"""End-to-end test of ``bidding api``: a real API process with real node workers behind it.

An embedded Redis (broker and result backend), a SQLite store, three ``bidding worker`` nodes
of the demo app (bluefin extracts text, redfin analyses it, tpm aggregates) and ``bidding api``
on a free port, each started from the repository root as an operator would. The test talks to
the API over HTTP only: it posts seed 004's research-paper definition and follows it.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from bench.common.processes import stop_process
from bidding.config import load_settings
from bidding.nodes.embedded import free_port
from bidding.nodes.federation import Federation
from tests.e2e.test_flower import Services, clean_env, services, wait_until

__all__ = ["services"]  # the fixture, shared with test_flower

pytestmark = pytest.mark.e2e

REPO_ROOT = Path(__file__).resolve().parents[2]
NODES = ("bluefin", "redfin", "tpm")
TOKEN = "e2e-token"


@pytest.fixture
def federation(services: Services, tmp_path: Path) -> Iterator[Federation]:
    """The demo's nodes that cover the paper's three capabilities, heartbeating."""
    nodes = Federation(app="bidding.demo.app", env=services.env(), log_dir=tmp_path / "logs",
                       concurrency=1, cwd=REPO_ROOT)
    try:
        nodes.start([REPO_ROOT / "workers" / f"{n}.toml" for n in NODES])
        nodes.wait_live(load_settings({"bidding_database_url": services.database}, environ={}))
        yield nodes
    finally:
        nodes.stop()
        from bidding.nodes.registry import invalidate_cache
        from bidding.store import dispose_all

        dispose_all()
        invalidate_cache()


@pytest.fixture
def api_url(services: Services, federation: Federation, tmp_path: Path) -> Iterator[str]:
    """``bidding api -A bidding.demo.app`` on a free loopback port, writes behind a token."""
    port = free_port()
    log = tmp_path / "logs" / "api.log"
    env = clean_env(**services.env(), BIDDING_API_TOKEN=TOKEN)
    with log.open("ab") as handle:
        process = subprocess.Popen(
            [sys.executable, "-m", "bidding.cli", "api", "-A", "bidding.demo.app",
             "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO_ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT,
            start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        if process.poll() is not None:
            pytest.fail(f"bidding api exited with {process.returncode}:\n{log.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            return httpx.get(f"{url}/openapi.json", timeout=2).status_code == 200
        return False

    try:
        if not wait_until(answers, timeout=30):
            pytest.fail(f"bidding api did not answer within 30 s:\n{log.read_text()}")
        yield url
    finally:
        stop_process(process)


def test_a_posted_definition_runs_on_the_nodes_and_its_result_is_read(
        api_url: str, tmp_path: Path) -> None:
    paper: dict[str, Any] = yaml.safe_load(
        (REPO_ROOT / "examples" / "graphs" / "research_paper.yaml").read_text())
    with httpx.Client(base_url=api_url, timeout=10) as http:
        # given the API lists the three live nodes
        nodes = {n["name"]: n for n in http.get("/aitp/nodes").json()}
        assert all(nodes[n]["live"] for n in NODES), nodes

        # when the paper's definition is posted without the token, then it is refused
        assert http.post("/aitp/tasks", json=paper).status_code == 401

        # when it is posted with the token
        created = http.post("/aitp/tasks", json=paper,
                            headers={"Authorization": f"Bearer {TOKEN}"})
        # then it is created
        assert created.status_code == 201, created.text
        task_id = created.json()["task_id"]

        # and its status, polled, reaches COMPLETED
        seen: list[str] = []

        def completed() -> bool:
            state = http.get(f"/aitp/tasks/{task_id}").json()
            seen.append(state["status"])
            assert state["status"] != "FAILED", state
            return bool(state["status"] == "COMPLETED")

        assert wait_until(completed, timeout=60), (
            seen[-1], http.get(f"/aitp/tasks/{task_id}").json()["progress"],
            http.get(f"/aitp/tasks/{task_id}/bids").json())
        final = http.get(f"/aitp/tasks/{task_id}").json()
        assert final["current_step"] == 3 and final["progress"]["percent_complete"] == 100

        # when its result is read
        result = http.get(f"/aitp/tasks/{task_id}/result")
        # then it has the aggregated output, its cost and how long it took
        assert result.status_code == 200, result.text
        body = result.json()
        assert body["status"] == "COMPLETED" and body["error"] is None
        assert set(body["result"]) >= {"hypothesis", "methodology", "results"}
        assert body["cost"] > 0
        assert body["execution_time_ms"] > 0

        # and each subtask's auction shows its winner among the bids
        bids = http.get(f"/aitp/tasks/{task_id}/bids").json()["subtasks"]
        assert {step: auction["winner"] for step, auction in bids.items()} == {
            "subtask_1": "bluefin", "subtask_2": "redfin", "subtask_3": "tpm"}

        # and the stats and nodes count the three awards
        stats = http.get("/aitp/stats").json()
        assert stats["succeeded"] == 3
        won = {n["name"]: n["tasks_won"] for n in http.get("/aitp/nodes").json()}
        assert won == {"bluefin": 1, "redfin": 1, "tpm": 1}
        metrics = http.get("/metrics")
        assert metrics.status_code == 200 and "bidding_awards_total" in metrics.text

        # and the definition's tags find its three subtasks, each naming the task
        tagged = http.get("/aitp/tasks", params={"tag": "nlp"})
        assert tagged.status_code == 200, tagged.text
        assert sorted(t["graph_id"] for t in tagged.json()) == [task_id] * 3
        assert all(t["tags"] == ["analysis", "nlp", "research"] for t in tagged.json())
        assert http.get("/aitp/tasks", params={"tag": "not-a-tag"}).json() == []
        # and the task shows its ledger: each subtask's entry, with the budget left after it
        ledger = final["ledger"]
        assert [e["step_id"] for e in ledger] == ["subtask_1", "subtask_2", "subtask_3"]
        assert ledger[-1]["remaining_budget"] == pytest.approx(10.0 - body["cost"])
        assert final["actual_cost"] == pytest.approx(body["cost"])
        assert final["estimated_cost"] == pytest.approx(body["cost"])  # the built-in bids'
        # and each node's record compares the confidence it claimed with its one success
        calibration = {n["name"]: n["calibration"] for n in http.get("/aitp/nodes").json()}
        assert all(calibration[n]["confidence_attempts"] == 1
                   and calibration[n]["success_rate"] == 1.0 for n in NODES), calibration

    # and a real Prometheus scraping the API answers the awards per node
    _prometheus_scrapes(api_url, tmp_path, {"bluefin": 1.0, "redfin": 1.0, "tpm": 1.0})


def test_an_api_on_every_interface_without_a_token_starts_only_when_allowed_open(
        tmp_path: Path) -> None:
    # given the demo app on a SQLite store, and no bidding_api_token
    port = free_port()
    env = clean_env(CELERY_BROKER_URL="memory://", CELERY_RESULT_BACKEND="cache+memory://",
                    BIDDING_DATABASE_URL=f"sqlite:///{tmp_path / 'store.db'}",
                    PYTHONPATH=str(REPO_ROOT))
    command = [sys.executable, "-m", "bidding.cli", "api", "-A", "bidding.demo.app",
               "--host", "0.0.0.0", "--port", str(port)]
    # when `bidding api --host 0.0.0.0` is started
    refused = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                             timeout=30, check=False)
    # then it refuses to start, in one line naming the setting, its variable and the flag
    assert refused.returncode == 1, (refused.stdout, refused.stderr)
    said = refused.stderr.strip()
    assert said.startswith("Error: --host 0.0.0.0 is not the loopback"), said
    assert "bidding_api_token" in said and "BIDDING_API_TOKEN" in said, said
    assert "--allow-open" in said and "\n" not in said, said

    # when it is started with --allow-open
    log = tmp_path / "api.log"
    with log.open("ab") as handle:
        process = subprocess.Popen([*command, "--allow-open"], cwd=REPO_ROOT, env=env,
                                   stdout=handle, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def answers() -> bool:
            if process.poll() is not None:
                pytest.fail(f"bidding api exited with {process.returncode}:\n{log.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/openapi.json", timeout=2).status_code == 200
            return False

        # then it serves, and says its writes are open
        assert wait_until(answers, timeout=30), log.read_text()
        assert "--allow-open: writes need no token: anyone who reaches 0.0.0.0" in log.read_text()
        with httpx.Client(base_url=url, timeout=30) as http:
            # and a 20 MB definition is refused by its length, and a chunked one of 2 MiB as
            # it is read, each naming the setting
            big = b'{"name": "x", "input_values": {"blob": "' + b"x" * 20_000_000 + b'"}}'
            declared = http.post("/aitp/tasks", content=big,
                                 headers={"content-type": "application/json"})
            assert declared.status_code == 413, declared.text
            assert "bidding_api_max_body_bytes (1048576 bytes)" in declared.json()["detail"]
            chunked = http.post("/aitp/tasks", content=iter([b"x" * 65_536] * 32),
                                headers={"content-type": "application/json"})
            assert chunked.status_code == 413, chunked.text
            assert chunked.json()["detail"] == (
                "the request body is over bidding_api_max_body_bytes (1048576 bytes)")
            # and a reset a web page could send cross-site is refused; with the header, done
            forged = http.post("/aitp/tasks/some-id/reset")
            assert forged.status_code == 403 and "X-Bidding-Request" in forged.text
            asked = http.post("/aitp/tasks/some-id/reset", headers={"X-Bidding-Request": "1"})
            assert asked.status_code == 404, asked.text
            # and nothing was stored
            assert http.get("/aitp/stats").json()["announced"] == 0
    finally:
        stop_process(process)


def _prometheus_scrapes(api_url: str, tmp_path: Path, winners: dict[str, float]) -> None:
    """A real Prometheus scrapes the API every second; a PromQL query over its HTTP API then
    gives ``winners``, the awards per node. (A step of the test above, on its federation and
    API: starting them again for this alone cost 20 s of every run.) Without Prometheus, the
    test stops here, skipped with the reason, except under CI=true, where it fails."""
    import shutil

    from tests.conftest import require

    prometheus = shutil.which("prometheus")
    require("Prometheus", prometheus is not None,
            "no prometheus on PATH (Debian's package: apt-get install prometheus)")
    assert prometheus is not None
    port = free_port()
    target = api_url.removeprefix("http://")
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: bidding\n    metrics_path: /metrics\n"
        f"    static_configs:\n      - targets: ['{target}']\n")
    log = tmp_path / "logs" / "prometheus.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as handle:
        process = subprocess.Popen(
            [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=handle, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        query = f"http://127.0.0.1:{port}/api/v1/query"

        def awards() -> dict[str, float]:
            if process.poll() is not None:
                pytest.fail(f"prometheus exited with {process.returncode}:\n{log.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                response = httpx.get(query, params={
                    "query": "sum by (node) (bidding_awards_total)"}, timeout=2)
                if response.status_code != 200:
                    return {}  # starting up: "Service Unavailable" until its storage is ready
                return {r["metric"]["node"]: float(r["value"][1])
                        for r in response.json()["data"]["result"] if float(r["value"][1])}
            return {}

        found = wait_until(awards, timeout=60)
        assert found == winners, log.read_text()
        # and it sees the API as a healthy target
        health = httpx.get(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5).json()
        assert [t["health"] for t in health["data"]["activeTargets"]] == ["up"]
    finally:
        stop_process(process)
