"""Reading the speed benchmark's list options."""

from __future__ import annotations

#: The caller's bid modes (``bidding_bid_mode``).
BID_MODES = ("ask", "proxy")


def int_list(text: str) -> list[int]:
    """Parse "1,4,16" (empty: no values)."""
    return [int(x) for x in text.split(",") if x.strip()]


def bid_modes(text: str) -> list[str]:
    """``--bid-modes``: "ask", "proxy" or both, in the order given."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in BID_MODES]
    if not modes or bad:
        raise SystemExit(f"--bid-modes: expected ask and/or proxy, got {text!r}")
    return list(dict.fromkeys(modes))
