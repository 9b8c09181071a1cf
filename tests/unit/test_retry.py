"""Backoff delays, retry decisions and the budget rule of retries (pure, no broker)."""

from __future__ import annotations

import random

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from bidding.auction.decision import ineligibility
from bidding.errors import ConfigurationError
from bidding.execution.retry import compute_delay, is_retryable, plan_retry, schedule
from bidding.models import Announcement, Bid, Fallbacks, RetryPolicy

NOW = 1_000_000.0


def announcement(**fields: object) -> Announcement:
    values: dict[str, object] = {"task_id": "t", "task_name": "x.y", "task_type": "y"}
    values.update(fields)
    return Announcement(**values)  # type: ignore[arg-type]


def test_aitp_example_schedule() -> None:
    # given AITP 6.1's policy: 3 retries, exponential, base 1000 ms
    policy = RetryPolicy(max_retries=3, backoff="exponential", base_ms=1000)
    # then attempt 1 is immediate, and the retries wait 1000, 2000 and 4000 ms, then give up
    assert schedule(policy) == [1.0, 2.0, 4.0]


@pytest.mark.parametrize(
    ("backoff", "expected"),
    [("exponential", [0.25, 0.5, 1.0, 2.0]), ("linear", [0.25, 0.5, 0.75, 1.0]),
     ("fixed", [0.25, 0.25, 0.25, 0.25])],
)
def test_each_backoff_strategy_in_float_seconds(backoff: str, expected: list[float]) -> None:
    # given a base of 250 ms (Celery's retry_backoff would round it to whole seconds)
    policy = RetryPolicy(max_retries=4, backoff=backoff, base_ms=250)  # type: ignore[arg-type]
    assert schedule(policy) == expected


def test_delays_are_capped_at_max_ms() -> None:
    policy = RetryPolicy(max_retries=6, backoff="exponential", base_ms=1000, max_ms=5000)
    assert schedule(policy) == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_jitter_stays_within_its_bounds_and_varies() -> None:
    # given 20% jitter on a 1 s fixed delay
    policy = RetryPolicy(max_retries=1, backoff="fixed", base_ms=1000, jitter=0.2)
    rng = random.Random(3)
    delays = [compute_delay(policy, 1, rng) for _ in range(500)]
    # then every delay is within +-20%, and they are spread over the range
    assert all(0.8 <= d <= 1.2 for d in delays)
    assert min(delays) < 0.85 and max(delays) > 1.15


def test_retry_number_starts_at_one() -> None:
    with pytest.raises(ValueError, match="retry: must be >= 1"):
        compute_delay(RetryPolicy(), 0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_retries", -1), ("backoff", "quadratic"), ("base_ms", -5), ("jitter", 1.5)],
)
def test_bad_policies_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ConfigurationError, match=f"retry_policy.{field}"):
        RetryPolicy(**{field: value})  # type: ignore[arg-type]


def test_non_retryable_matches_class_names_bases_and_dotted_paths() -> None:
    policy = RetryPolicy(non_retryable=("LookupError", "builtins.ZeroDivisionError"))
    assert is_retryable(policy, KeyError("k")) is False  # a LookupError
    assert is_retryable(policy, ZeroDivisionError()) is False
    assert is_retryable(policy, RuntimeError()) is True


def test_a_failure_with_retries_left_plans_a_new_auction_without_the_node() -> None:
    # given attempt 1 failed on north with 3 retries allowed (base 500 ms)
    task = announcement(retry_policy=RetryPolicy(max_retries=3, base_ms=500))
    plan = plan_retry(task, "north", RuntimeError("x"), NOW)
    # then attempt 2 is announced after 0.5 s, without north
    assert plan.next is not None and plan.delay == 0.5
    assert plan.next.attempt == 2 and plan.next.failures == 1
    assert plan.next.exclude_nodes == ["north"]
    assert plan.next.announced_at == NOW


def test_retry_same_node_keeps_the_node() -> None:
    task = announcement(retry_policy=RetryPolicy(max_retries=1), retry_same_node=True)
    plan = plan_retry(task, "north", RuntimeError("x"), NOW)
    assert plan.next is not None and plan.next.exclude_nodes == []


def test_no_retries_left_no_policy_or_deadline_passed_mean_failure() -> None:
    used_up = announcement(retry_policy=RetryPolicy(max_retries=2), failures=2)
    assert plan_retry(used_up, "n", RuntimeError(), NOW).next is None
    assert "no retries left" in plan_retry(used_up, "n", RuntimeError(), NOW).why
    assert plan_retry(announcement(), "n", RuntimeError(), NOW).next is None
    late = announcement(retry_policy=RetryPolicy(max_retries=3), deadline=NOW - 1)
    plan = plan_retry(late, "n", RuntimeError(), NOW)
    assert plan.next is None and plan.expired and plan.why.startswith("expired:")


def test_a_retry_due_after_the_tasks_expiry_is_not_planned() -> None:
    # given a task that expires in 1.5 s, whose retries wait 1, then 2 seconds
    task = announcement(retry_policy=RetryPolicy(max_retries=3, base_ms=1000),
                        expires_at=NOW + 1.5)
    # when its first attempt fails: the retry, due in 1 s, is before the expiry
    first = plan_retry(task, "n", RuntimeError(), NOW)
    assert first.next is not None and first.delay == 1.0 and not first.expired
    # when its second attempt fails: the retry would be due in 2 s, after the expiry
    second = plan_retry(first.next, "n", RuntimeError(), NOW)
    # then none is planned, and the plan says the task expired
    assert second.next is None and second.expired
    assert second.why == "expired: retry 2 would be due in 2s, after the task's start-by time"


def test_a_timeout_is_retried_once_with_the_extended_limit_on_any_node() -> None:
    # given a 10 s soft limit and the default fallback (extend to 60 s)
    task = announcement(timeout_seconds=10, fallbacks=Fallbacks(extended_timeout_seconds=60))
    plan = plan_retry(task, "north", SoftTimeLimitExceeded(), NOW, timed_out=True)
    # then the next attempt has 60 s, starts at once, and may go to any node
    assert plan.next is not None and plan.delay == 0.0
    assert plan.next.timeout_seconds == 60 and plan.next.exclude_nodes == []
    # and timing out again with the extended limit fails
    again = plan_retry(plan.next, "south", SoftTimeLimitExceeded(), NOW, timed_out=True)
    assert again.next is None and "extended timeout" in again.why


def test_on_timeout_fail_and_retry() -> None:
    fail = announcement(timeout_seconds=1, fallbacks=Fallbacks(on_timeout="fail"),
               retry_policy=RetryPolicy(max_retries=3))
    assert plan_retry(fail, "n", SoftTimeLimitExceeded(), NOW, timed_out=True).next is None
    retry = fail.model_copy(update={"fallbacks": Fallbacks(on_timeout="retry")})
    plan = plan_retry(retry, "n", SoftTimeLimitExceeded(), NOW, timed_out=True)
    assert plan.next is not None and plan.next.timeout_seconds == 1 and plan.delay == 1.0


def test_bids_are_measured_against_the_budget_left_after_earlier_attempts() -> None:
    # given a budget of 1.0 of which 0.8 is spent
    task = announcement(budget=1.0, spent=0.8)
    bid = Bid(task_id="t", node="n", capability=1, experience=1, load=1, confidence=1,
              cost=0.3)
    # then a 0.3 bid is not eligible, a 0.2 bid is
    assert ineligibility(bid, task) == (
        "cost 0.3000 exceeds remaining budget 0.2000 (0.8000 already spent)")
    assert ineligibility(bid.model_copy(update={"cost": 0.2}), task) is None
