"""Traces through real node workers, in a pytest process of their own.

The flow (``tracing_flow.py``) starts two ``bidding worker`` processes that send their spans
to a file, and installs a tracer provider and Celery's instrumentation in the process that
runs it, as the caller: process-wide state that the other modules of a shared test process
must neither see nor leave behind for it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REDIS_DB

pytestmark = pytest.mark.integration

FLOW = Path(__file__).with_name("tracing_flow.py")
ROOT = Path(__file__).resolve().parents[2]


def flow_environment() -> dict[str, str]:
    """This process's environment, less what would make the flow another process than this
    one: pytest-xdist's worker id (with it, the flow's conftest would count this worker's
    Redis dbs down once more, to dbs no one cleans) and any ``BIDDING_*`` setting a test
    left set. The flow gets this process's Redis dbs, which this process does not use while
    it waits."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "BIDDING_", "OTEL_"))}
    env["BIDDING_TEST_REDIS_DB"] = str(REDIS_DB)
    for key in ("BIDDING_TEST_REDIS", "BIDDING_TEST_POSTGRES"):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


@pytest.mark.timeout(180)
def test_each_task_gives_one_trace_through_real_workers() -> None:
    # given the flow's three cases (a proxied task, an asked one, a retried one)
    # when they run in a pytest process of their own, on this process's Redis databases
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
         "-o", "addopts=", str(FLOW)],
        capture_output=True, text=True, timeout=170, cwd=ROOT, env=flow_environment())
    # then every case passes: one trace per task, the execution under its award
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "3 passed" in done.stdout, done.stdout[-3000:]
