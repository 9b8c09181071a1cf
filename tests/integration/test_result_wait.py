"""A caller's ``.get()`` when its Redis result connection comes back (execution/result_wait.py):
a result stored between Celery's read of the awaited results and its resubscription still
reaches the caller (the chaos soak found one that did not). Real Redis, no workers."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, states
from celery.result import AsyncResult

import bidding
from tests.conftest import REDIS_DB, REDIS_URL, require

pytestmark = pytest.mark.integration

URL = f"{REDIS_URL}/{REDIS_DB + 2}"


@pytest.fixture
def app() -> Iterator[Celery]:
    try:
        redis.Redis.from_url(URL, socket_connect_timeout=2).ping()
        up, reason = True, ""
    except Exception as exc:
        up, reason = False, str(exc)
    require("Redis", up, f"{URL}: {reason}")
    app = Celery("result_wait", broker=URL, backend=URL)
    bidding.install(app)
    yield app
    app.backend.result_consumer.stop()


def test_a_result_stored_while_the_caller_resubscribes_still_reaches_it(app: Celery) -> None:
    # given a caller in .get() for a task's result, waiting on the backend's pub/sub
    task_id = str(uuid.uuid4())
    result = AsyncResult(task_id, app=app)
    backend: Any = app.backend
    backend.result_consumer.consume_from(task_id)
    # and a node whose result write lands right after the caller's reconnect has read the
    # stored results, before it has subscribed again (what a broker restart makes likely)
    client = backend.client
    read = client.mget
    landed: list[bool] = []

    def mget_then_result_lands(keys: Any, *args: Any) -> Any:
        found = read(keys, *args)
        if not landed:
            landed.append(True)
            backend.store_result(task_id, {"square": 49}, states.SUCCESS)
        return found

    client.mget = mget_then_result_lands
    # when Redis drops the caller's pub/sub connection while it waits (as a restart does)
    sock = backend.result_consumer._pubsub.connection._sock
    host, port = sock.getsockname()[:2]
    admin = redis.Redis.from_url(URL)
    drop = threading.Timer(0.5, lambda: admin.client_kill_filter(_type=None,
                                                                  addr=f"{host}:{port}"))
    drop.start()
    try:
        value = result.get(timeout=5)
    finally:
        drop.cancel()
        del client.mget
    # then the caller gets the result, instead of waiting until its timeout
    assert landed
    assert value == {"square": 49}


@pytest.mark.parametrize("late", [states.RETRY, states.STARTED, "PROGRESS"])
def test_a_late_interim_state_never_replaces_a_tasks_final_result(app: Celery, late: str) -> None:
    # given a task whose last attempt failed, its failure stored for the caller
    task_id = str(uuid.uuid4())
    backend: Any = app.backend
    backend.store_result(task_id, ValueError("task 39 fails on purpose"), states.FAILURE)
    # when an earlier attempt's RETRY (or a start, or a progress report) lands only now (its
    # write was held up by a broker restart: the soak found a caller waiting for ever so)
    if late == states.RETRY:
        backend.mark_as_retry(task_id, ValueError("task 39 fails on purpose"))
    else:
        backend.store_result(task_id, {"note": "late"}, late)
    # then the caller still gets the final result
    result = AsyncResult(task_id, app=app)
    assert result.state == states.FAILURE
    with pytest.raises(ValueError, match="fails on purpose"):
        result.get(timeout=5)
