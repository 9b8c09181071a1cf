"""Reading the speed benchmark's list options."""

from __future__ import annotations

#: The caller's bid modes (``bidding_bid_mode``), and "mixed": "auto" with one node among
#: the candidates that names a bidder of its own, so that it is asked while the others are
#: bid for by the caller (bench/speed/backend.py, ``ASKED_NODE``).
BID_MODES = ("auto", "ask", "proxy", "mixed")
#: The label of "mixed" in the report.
MODE_LABELS = {"mixed": "auto, 1 asked"}


def int_list(text: str) -> list[int]:
    """Parse "1,4,16" (empty: no values)."""
    return [int(x) for x in text.split(",") if x.strip()]


def bid_modes(text: str) -> list[str]:
    """``--bid-modes``: some of ``BID_MODES``, in the order given."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in BID_MODES]
    if not modes or bad:
        raise SystemExit(f"--bid-modes: expected some of {', '.join(BID_MODES)}, got {text!r}")
    return list(dict.fromkeys(modes))
