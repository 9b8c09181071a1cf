"""What a failed task leaves in a worker process is collected before the next task."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from bidding.nodes import garbage


class Held:
    """Stands for a failed task's exception info, in a cycle with itself."""

    def __init__(self) -> None:
        self.me = self


@pytest.fixture
def no_automatic_collection() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def cycle() -> weakref.ref[Held]:
    return weakref.ref(Held())


def test_what_a_failure_left_in_a_cycle_is_gone_when_the_next_task_starts(
    no_automatic_collection: None,
) -> None:
    # given a task that failed, leaving its exception info in a reference cycle
    left = cycle()
    garbage.task_failed()
    # when the next task starts
    collected = garbage.before_task()
    # then the cycle was collected
    assert collected and left() is None


def test_without_a_failure_the_next_task_starts_without_a_collection(
    no_automatic_collection: None,
) -> None:
    # given a task that succeeded, leaving a cycle of its own
    garbage.before_task()  # nothing noted from an earlier test
    left = cycle()
    # when the next task starts, nothing is collected (a collection costs: only failures)
    assert not garbage.before_task()
    assert left() is not None
    gc.collect()


def test_start_up_is_frozen_out_of_later_collections() -> None:
    # given a worker process at the end of its start-up
    try:
        # when it freezes what start-up made
        garbage.freeze_start_up()
        # then the collector leaves those objects alone from now on
        assert gc.get_freeze_count() > 1000
    finally:
        gc.unfreeze()
