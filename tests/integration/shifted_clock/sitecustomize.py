"""Shift this Python process's wall clock by ``BIDDING_TEST_CLOCK_SHIFT`` seconds, as if its
host's clock were that far off (tests/integration/test_clocks.py runs node workers with this
folder first on ``PYTHONPATH``; Python imports ``sitecustomize`` before anything else).

``time.time`` and ``time.time_ns`` move; the monotonic clock, which measures intervals, does
not, as on a real host. (Debian's libfaketime does this for every program, but under it
Python's ``time.sleep`` fails with EINVAL when the monotonic clock is left alone, and every
timed wait is off by the shift when it is not.)
"""

import os
import time

_SHIFT = float(os.environ.get("BIDDING_TEST_CLOCK_SHIFT", "0"))
_time, _time_ns = time.time, time.time_ns


def _shifted_time() -> float:
    return _time() + _SHIFT


def _shifted_time_ns() -> int:
    return _time_ns() + int(_SHIFT * 1e9)


time.time = _shifted_time
time.time_ns = _shifted_time_ns
