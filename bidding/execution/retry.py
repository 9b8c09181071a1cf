"""Backoff delays and retry decisions (AITP 2.2, 6.1 and 6.2's on_timeout), as pure functions.

Delays are float seconds, passed on as they are: Celery's own ``retry_backoff`` rounds to
whole seconds, which would turn AITP's 1000/2000/4000 ms schedule into something else.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from bidding.models import Announcement, RetryPolicy


def compute_delay(policy: RetryPolicy, retry: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before retry number ``retry`` (1 = the first retry, i.e. attempt 2).

    exponential: base * 2**(retry-1); linear: base * retry; fixed: base; capped at ``max_ms``;
    then +-``jitter`` (a fraction) at random, never below zero. AITP's example with base 1000 ms:
    attempt 1 immediate, then 1.0, 2.0 and 4.0 seconds.
    """
    if retry < 1:
        raise ValueError(f"retry: must be >= 1 (got {retry})")
    if policy.backoff == "exponential":
        ms = policy.base_ms * 2.0 ** (retry - 1)
    elif policy.backoff == "linear":
        ms = policy.base_ms * retry
    else:
        ms = policy.base_ms
    ms = min(ms, policy.max_ms)
    if policy.jitter:
        rng = rng or random.Random()
        ms *= 1 + rng.uniform(-policy.jitter, policy.jitter)
    return max(0.0, ms / 1000.0)


def schedule(policy: RetryPolicy) -> list[float]:
    """Every delay of the policy without jitter: ``[d1, d2, ...]`` for its ``max_retries``."""
    plain = policy.model_copy(update={"jitter": 0.0})
    return [compute_delay(plain, n) for n in range(1, policy.max_retries + 1)]


def is_retryable(policy: RetryPolicy, exc: BaseException) -> bool:
    """False when ``exc``'s class (or a base class) is named in ``non_retryable``.

    Names match the class name (``"ValueError"``) or its dotted path (``"pkg.mod.Error"``).
    """
    for cls in type(exc).__mro__:
        if cls.__name__ in policy.non_retryable:
            return False
        if f"{cls.__module__}.{cls.__qualname__}" in policy.non_retryable:
            return False
    return True


@dataclass(frozen=True)
class RetryPlan:
    """The next attempt of a failed task, when to announce it, and why (or why not)."""

    next: Announcement | None
    delay: float | None
    why: str
    #: No retry because the task's start-by time (its expiry or deadline) has passed, or would
    #: have by the time the retry is due: the task ends expired.
    expired: bool = False


def plan_retry(announcement: Announcement, node: str, exc: BaseException, now: float,
               rng: random.Random | None = None, *, timed_out: bool = False) -> RetryPlan:
    """Decide what follows a failed attempt (pure): AITP 6.1 retries and 6.2 on_timeout.

    ``timed_out``: the attempt hit its soft time limit (the worker passes
    ``isinstance(exc, SoftTimeLimitExceeded)``; this module imports no Celery).
    """
    failures = announcement.failures + 1
    base = {"attempt": announcement.attempt + 1, "failures": failures, "silent_rounds": 0,
            "exclude_nodes": retry_exclusions(announcement, node), "announced_at": now,
            "last_error": error_text(exc)}
    if announcement.expired(now):
        return RetryPlan(None, None, "expired: its start-by time passed before a retry could "
                         "start", expired=True)
    if timed_out:
        fb = announcement.fallbacks
        if fb.on_timeout == "fail":
            return RetryPlan(None, None, "timed out (on_timeout=fail)")
        if fb.on_timeout == "extend":
            extended = fb.extended_timeout_seconds
            if (
                announcement.timeout_seconds is not None
                and announcement.timeout_seconds >= extended
            ):
                return RetryPlan(None, None, "timed out again with the extended timeout")
            # A timeout is not the node's fault alone: any node may take the longer attempt.
            nxt = announcement.model_copy(
                update={
                    **base,
                    "exclude_nodes": announcement.exclude_nodes,
                    "timeout_seconds": fb.extended_timeout_seconds,
                }
            )
            return RetryPlan(
                nxt, 0.0, f"timed out; retrying with {fb.extended_timeout_seconds:g}s"
            )
    policy = announcement.retry_policy
    if policy is None or policy.max_retries == 0:
        return RetryPlan(None, None, "")
    if not is_retryable(policy, exc):
        return RetryPlan(None, None, f"{type(exc).__name__} is not retryable")
    if failures > policy.max_retries:
        return RetryPlan(None, None, f"no retries left ({policy.max_retries} used)")
    delay = compute_delay(policy, failures, rng)
    if announcement.expired(now + delay):
        # The expiry is the task's, not an attempt's: a retry due after it would never start.
        return RetryPlan(None, None, f"expired: retry {failures} would be due in {delay:g}s, "
                         "after the task's start-by time", expired=True)
    return RetryPlan(
        announcement.model_copy(update=base), delay, f"retry {failures} of {policy.max_retries}"
    )


def error_text(exc: BaseException) -> str:
    """How an attempt's error is recorded: ``"ValueError: boom"`` (the class alone when the
    error has no message)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def retry_exclusions(announcement: Announcement, node: str) -> list[str]:
    """The nodes a retry should avoid, the one that just failed (``node``) last, unless the task
    may retry on the same node (``auction.candidates.not_excluded`` says how they are used)."""
    exclude = [n for n in announcement.exclude_nodes if n != node]
    if not announcement.retry_same_node:
        exclude.append(node)
    elif node in announcement.exclude_nodes:
        exclude = list(announcement.exclude_nodes)
    return exclude
