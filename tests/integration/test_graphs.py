"""Task graphs (issue 12) through real node workers: seed 004's research-paper example end to
end, a diamond whose middle steps run at once on two nodes, a failing middle step, and a graph
whose submitter exits at once."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest

import bidding
from bidding.graphs.submit import GraphHandle
from tests.integration.conftest import ROOT, Cluster

#: Seed 004's example (sections 2.1 and 3.1), capabilities served by tests.integration.app.
PAPER: dict[str, Any] = {
    "name": "Research Paper Analysis",
    "description": "Analyze a research paper and extract key findings",
    "input": {"type": "object", "required": ["paper_pdf_url"],
              "properties": {"paper_pdf_url": {"type": "string"},
                             "max_pages": {"type": "integer", "default": 50}}},
    "output": {"type": "object", "required": ["hypothesis", "results"],
               "properties": {"hypothesis": {"type": "string"},
                              "results": {"type": "array", "items": {"type": "string"}}}},
    "priority": "HIGH",
    "metadata": {"timeout_seconds": 60, "cost_limit": 10.0,
                 "retry_policy": {"max_retries": 1, "backoff_strategy": "fixed",
                                  "backoff_base_ms": 100}},
    "subtasks": [
        {"subtask_id": "subtask_1", "name": "Extract Text from PDF",
         "agent_capability": "pdf_text_extraction",
         "input": {"paper_pdf_url": "${parent.input.paper_pdf_url}",
                   "max_pages": "${parent.input.max_pages}"},
         "output_mapping": {"extracted_text": "raw_text", "max_pages_type": "pages_type"},
         "priority": 1},
        {"subtask_id": "subtask_2", "name": "Analyze Text with NLP",
         "agent_capability": "nlp_analysis", "depends_on": ["subtask_1"],
         "input": {"text": "${subtask_1.output.raw_text}"},
         "output_mapping": {"analysis": "nlp_results"}, "priority": 2},
        {"subtask_id": "subtask_3", "name": "Aggregate Results",
         "agent_capability": "orchestration", "depends_on": ["subtask_1", "subtask_2"],
         "input": {"raw_text": "${subtask_1.output.raw_text}",
                   "nlp_results": "${subtask_2.output.nlp_results}"},
         "output_mapping": {}, "priority": 3},
    ],
}

DIAMOND: dict[str, Any] = {
    "name": "diamond",
    "subtasks": [
        {"subtask_id": "start", "agent_capability": "it_echo", "input": {"value": 1}},
        {"subtask_id": "left", "agent_capability": "it_sleep", "depends_on": ["start"],
         "input": {"seconds": 2.0, "label": "left ${start.output.value}"},
         "output_mapping": {"label": "left"}},
        {"subtask_id": "right", "agent_capability": "it_sleep", "depends_on": ["start"],
         "input": {"seconds": 2.0, "label": "right ${start.output.value}"},
         "output_mapping": {"label": "right"}},
        {"subtask_id": "join", "agent_capability": "it_echo", "depends_on": ["left", "right"],
         "input": {"value": ["${left.output.left}", "${right.output.right}"]},
         "output_mapping": {"value": "both"}},
    ],
}


def test_the_seed_example_runs_end_to_end(cluster: Cluster) -> None:
    # given seed 004's three-step research-paper task and a paper URL
    spec = copy.deepcopy(PAPER)
    handle = bidding.submit(spec, app=cluster.app,
                            input={"paper_pdf_url": "https://example.org/quantum/paper.pdf"})
    # when it runs on the nodes
    result = handle.result(timeout=60)
    # then the data flowed through the templates: the text extracted in step 1 (renamed by
    # its output_mapping) was analysed in step 2, and both were aggregated in step 3
    assert result["hypothesis"] == "example matters"
    assert result["results"] == ["example", "quantum", "https:"]
    assert result["methodology"] == "read 6 words"
    progress = handle.progress()
    assert handle.status() == "COMPLETED"
    assert (progress.current_step, progress.total_steps, progress.percent_complete) == (3, 3, 100)
    assert [s.status for s in progress.steps] == ["COMPLETED"] * 3
    # and each step ran after the one it depends on, on a node, at a cost
    one, two, three = progress.steps
    assert one.completed_at <= two.started_at and two.completed_at <= three.started_at
    assert all(s.agent_id in ("north", "south", "east") and s.cost > 0 for s in progress.steps)
    assert progress.cost == pytest.approx(sum(s.cost for s in progress.steps))
    # and max_pages, a whole-value template of the schema's default 50, stayed an integer
    assert cluster.app.backend.get_task_meta(one.task_id)["result"]["max_pages_type"] == "int"
    # and each subtask is an ordinary auction that `bidding explain` shows
    assert bidding.explain(two.task_id, database_url=cluster.settings.database_url).winner


def test_a_diamond_runs_its_middle_steps_at_once_on_two_nodes(cluster: Cluster) -> None:
    # given start -> (left, right) -> join, left and right taking 2 s each
    handle = bidding.submit(copy.deepcopy(DIAMOND), app=cluster.app)
    # when it runs
    result = handle.result(timeout=60)
    # then join got both middle outputs through its templates
    assert result == {"both": ["left 1", "right 1"]}
    steps = {s.step_id: s for s in handle.progress().steps}
    left, right = steps["left"], steps["right"]
    # and the two middle steps overlapped in time, on two different nodes
    assert left.started_at < right.completed_at and right.started_at < left.completed_at
    assert left.agent_id != right.agent_id
    # and join started only after both ended
    assert steps["join"].started_at >= max(left.completed_at, right.completed_at)


def test_a_failing_middle_step_fails_the_task_and_never_starts_the_last(
        cluster: Cluster) -> None:
    # given first -> broken -> last, where the middle step always fails
    key = uuid.uuid4().hex
    spec = {"name": "fails in the middle", "subtasks": [
        {"subtask_id": "first", "agent_capability": "it_echo", "input": {"value": 1}},
        {"subtask_id": "middle", "agent_capability": "it_fail", "depends_on": ["first"],
         "input": {"message": "the middle step breaks"}},
        {"subtask_id": "last", "agent_capability": "it_echo", "depends_on": ["middle"],
         "input": {"value": 2, "key": key}},
    ]}
    handle = bidding.submit(spec, app=cluster.app)
    # when its result is asked for
    with pytest.raises(bidding.SubtaskFailedError, match="subtask middle failed") as caught:
        handle.result(timeout=60)
    # then the error names the failed subtask and its reason
    assert caught.value.subtask == "middle"
    assert "the middle step breaks" in str(caught.value)
    # and the task is FAILED, the last step CANCELLED, never announced nor run
    progress = handle.progress()
    assert progress.status == "FAILED" and progress.failed_subtask == "middle"
    status = {s.step_id: s for s in progress.steps}
    assert [status[s].status for s in ("first", "middle", "last")] == [
        "COMPLETED", "FAILED", "CANCELLED"]
    assert status["last"].agent_id is None and status["last"].started_at is None
    assert "depends on middle, which failed" in (status["last"].error or "")
    assert cluster.counters.get(f"ran:{key}") is None


def test_a_graph_submitted_by_a_process_that_exits_at_once_completes(
        cluster: Cluster) -> None:
    # given a process that submits the diamond and exits without waiting
    code = ("import json, sys, bidding\n"
            "from tests.integration.app import app\n"
            "print(bidding.submit(json.loads(sys.argv[1]), app=app).id)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "BIDDING_DATABASE_URL": cluster.settings.database_url,
           "BIDDING_IT_BROKER": cluster.app.conf.broker_url,
           "BIDDING_IT_BACKEND": cluster.app.conf.result_backend}
    done = subprocess.run([sys.executable, "-c", code, json.dumps(DIAMOND)], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    graph_id = done.stdout.strip().splitlines()[-1]
    # when we look for it later from another process (this one)
    handle = GraphHandle(graph_id, cluster.app)
    # then the nodes ran it to the end
    assert handle.result(timeout=60) == {"both": ["left 1", "right 1"]}
    assert handle.status() == "COMPLETED"


def test_the_command_line_submits_a_graph_waits_for_it_and_shows_its_status(
        cluster: Cluster, tmp_path: Any) -> None:
    # given the diamond as a YAML file, as an operator would write it
    import yaml

    path = tmp_path / "diamond.yaml"
    path.write_text(yaml.safe_dump(DIAMOND))
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "BIDDING_DATABASE_URL": cluster.settings.database_url,
           "BIDDING_IT_BROKER": cluster.app.conf.broker_url,
           "BIDDING_IT_BACKEND": cluster.app.conf.result_backend}
    # when it is submitted with `bidding submit FILE -A APP --wait`
    done = subprocess.run([sys.executable, "-m", "bidding.cli", "submit", str(path), "-A",
                           "tests.integration.app", "--wait", "--timeout", "60"], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=90)
    # then it prints the task id and, once done, the result
    assert done.returncode == 0, done.stdout + done.stderr
    assert "left 1" in done.stdout and "right 1" in done.stdout, done.stdout
    graph_id = next(word for line in done.stdout.splitlines() for word in line.split()
                    if len(word) == 36 and word.count("-") == 4)
    # and `bidding status ID` shows every step, completed, with its node
    shown = subprocess.run([sys.executable, "-m", "bidding.cli", "status", graph_id,
                            "--database-url", cluster.settings.database_url], env=env,
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    for step in ("start", "left", "right", "join"):
        assert step in shown.stdout, shown.stdout
    assert "COMPLETED" in shown.stdout, shown.stdout


def test_a_failing_step_stops_the_steps_still_running_beside_it(cluster: Cluster) -> None:
    # given first -> (slow: 6 s, broken), the broken step failing at once
    key = uuid.uuid4().hex
    spec = {"name": "stops its siblings", "subtasks": [
        {"subtask_id": "first", "agent_capability": "it_echo", "input": {"value": 1}},
        {"subtask_id": "slow", "agent_capability": "it_sleep", "depends_on": ["first"],
         "input": {"seconds": 6.0, "label": "slow", "key": key}},
        {"subtask_id": "broken", "agent_capability": "it_fail", "depends_on": ["first"],
         "input": {"message": "broken at once"}},
    ]}
    handle = bidding.submit(spec, app=cluster.app)
    # when the broken step fails the task
    with pytest.raises(bidding.SubtaskFailedError, match="subtask broken failed"):
        handle.result(timeout=60)
    # then the slow step, whose work can no longer be used, is stopped: never finished
    steps = {s.step_id: s for s in handle.progress().steps}
    assert steps["slow"].status == "CANCELLED"
    assert "stopped: the task failed (broken failed)" in (steps["slow"].error or "")
    time.sleep(7.0)
    assert cluster.counters.get(f"napped:{key}") is None


def test_a_task_that_depends_on_another_waits_for_it_and_fails_with_it(
        cluster: Cluster) -> None:
    # given a diamond (about 2 s) and a second task that depends on it (metadata.dependencies)
    first = bidding.submit(copy.deepcopy(DIAMOND), app=cluster.app)
    later = copy.deepcopy(DIAMOND)
    later["name"] = "after the diamond"
    later["metadata"] = {"dependencies": [first.id]}
    second = bidding.submit(later, app=cluster.app)
    # then the second waits, PENDING, while the first runs
    assert second.status() == "PENDING"
    # and starts only once the first has completed, then completes too
    assert second.result(timeout=60) == {"both": ["left 1", "right 1"]}
    first_done = first.progress().finished_at
    assert first_done is not None
    assert min(s.started_at for s in second.progress().steps if s.started_at) >= first_done
    # given a task that depends on one that fails
    broken = bidding.submit({"name": "broken", "subtasks": [
        {"subtask_id": "only", "agent_capability": "it_fail",
         "input": {"message": "no luck"}}]}, app=cluster.app)
    dependent = copy.deepcopy(DIAMOND)
    dependent["name"] = "after the broken one"
    dependent["metadata"] = {"dependencies": [broken.id]}
    third = bidding.submit(dependent, app=cluster.app)
    # then it fails without running a step, saying which dependency failed
    with pytest.raises(bidding.BiddingError, match=f"dependency {broken.id} failed"):
        third.result(timeout=60)
    assert all(s.status == "CANCELLED" for s in third.progress().steps)
