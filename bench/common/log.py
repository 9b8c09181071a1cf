"""Progress lines on stderr."""

from __future__ import annotations

import sys
import time


def log(message: str) -> None:
    """Progress on stderr, so stdout is only the report."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
