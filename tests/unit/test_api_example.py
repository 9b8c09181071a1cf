"""The example body of ``POST /aitp/tasks`` (examples/api/definition.json): it is the one the
OpenAPI schema shows, and the demo's app accepts it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml

from bidding.graphs.spec import DEFINITION_EXAMPLE
from tests.e2e.test_flower import clean_env
from tests.unit.test_api import nodes_beat

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "api" / "definition.json"

#: Posts the example to the demo's app (bidding.demo.app, its tasks and celeryconfig.py) through
#: FastAPI's TestClient, in a process of its own: importing the demo's app makes it Celery's
#: current app, which no other test of this process should see.
POST = textwrap.dedent("""
    import json, sys
    from fastapi.testclient import TestClient
    from bidding.api.app import create_app
    from bidding.demo.app import app
    client = TestClient(create_app(app))
    schema = client.get("/openapi.json").json()
    with open(sys.argv[1], "rb") as body:
        answer = client.post("/aitp/tasks", content=body.read(),
                             headers={"Content-Type": "application/json"})
    print(json.dumps({"status": answer.status_code, "body": answer.json(),
                      "examples": schema["components"]["schemas"]["TaskDefinition"]
                      .get("examples")}))
""")


def test_the_example_file_is_the_schemas_and_the_graph_examples() -> None:
    # given the example file, then it is the schema's example and the YAML example's definition
    shown = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    assert shown == DEFINITION_EXAMPLE
    assert shown == yaml.safe_load((REPO / "examples/graphs/research_paper.yaml").read_text())


def test_the_demos_app_accepts_the_example_body(store_url: str) -> None:
    # given the demo's nodes alive on a store, and the demo's app on an in-memory broker
    nodes_beat(store_url, "bluefin", "greenfin", "tpm")
    env = clean_env(CELERY_BROKER_URL="memory://", CELERY_RESULT_BACKEND="cache+memory://",
                    BIDDING_DATABASE_URL=store_url, PYTHONPATH=str(REPO))
    # when examples/api/definition.json is posted as the docs' curl command posts it
    run = subprocess.run([sys.executable, "-c", POST, str(EXAMPLE)], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    # then the task graph is created, its first step announced, and the schema shows the body
    assert answer["status"] == 201, answer
    assert answer["body"]["status"] == "EXECUTING", answer
    assert answer["examples"] == [DEFINITION_EXAMPLE]
