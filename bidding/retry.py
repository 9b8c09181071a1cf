"""Backoff delays and retry decisions (AITP 2.2 and 6.1), as pure functions.

Delays are float seconds, passed on as they are: Celery's own ``retry_backoff`` rounds to
whole seconds, which would turn AITP's 1000/2000/4000 ms schedule into something else.
"""

from __future__ import annotations

import random

from bidding.models import RetryPolicy


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


def retries_left(policy: RetryPolicy, attempts_done: int) -> bool:
    """True when another attempt is allowed after ``attempts_done`` failed attempts."""
    return attempts_done <= policy.max_retries
