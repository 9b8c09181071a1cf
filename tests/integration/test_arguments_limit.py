"""``bidding_max_arguments_bytes`` on real node workers: a call, or a task's
``self.retry(args=...)``, whose arguments' JSON is over the limit is refused, naming the task
and the size, and nothing is announced for it."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import func, select

from bidding.errors import ConfigurationError
from bidding.store import read_session
from bidding.store.schema import AnnouncementRow
from tests.integration.app import swelling
from tests.integration.conftest import Cluster

pytestmark = pytest.mark.integration

#: The default limit, 1 MiB, and an argument of twice that.
LIMIT = 1_048_576
BIG = 2 * LIMIT


def announced(cluster: Cluster) -> int:
    """How many tasks the store holds."""
    with read_session(cluster.settings.database_url) as session:
        return int(session.scalar(select(func.count()).select_from(AnnouncementRow)) or 0)


def test_a_call_with_2_mib_of_arguments_is_refused_and_nothing_is_announced(
        cluster: Cluster) -> None:
    # given live nodes, and the store's tasks so far
    before = announced(cluster)
    # when a task is called with an argument of 2 MiB
    with pytest.raises(ConfigurationError) as info:
        swelling.delay("k", 0, "x" * BIG)
    # then the call is refused, naming the task, the size and the setting
    assert str(info.value).startswith(
        f"args/kwargs of {swelling.name}: {BIG + 18} bytes of JSON, more than "
        f"bidding_max_arguments_bytes ({LIMIT})")
    # and nothing was announced
    assert announced(cluster) == before


def test_a_retry_with_arguments_over_the_limit_fails_the_task_naming_it(
        cluster: Cluster) -> None:
    # given a task whose first attempt retries itself with an argument of 1 KiB: that works
    key = f"swelling-{uuid.uuid4().hex[:8]}"
    assert swelling.apply_async((key, 1024)).get(timeout=30) == 1024
    # when its first attempt retries itself with an argument of 2 MiB
    key = f"swelling-{uuid.uuid4().hex[:8]}"
    result = swelling.apply_async((key, BIG))
    # then the task fails, naming the task, the size and the setting (Celery's retry() wraps
    # what apply_async raised in a Reject)
    with pytest.raises(Exception) as info:
        result.get(timeout=30)
    assert (f"args/kwargs of {swelling.name}: {BIG + len(key) + 23} bytes of JSON, more "
            f"than bidding_max_arguments_bytes ({LIMIT})") in str(info.value), info.value
    # and its body ran once: the retry was not announced
    assert cluster.counters.get(f"attempts:{key}") == b"1"
