"""What an idle sweeper reads, once a second, instead of running its phases: when each next
has work.

A sweeping node's phases each read the store once a second while they find nothing, a
statement each (bench/idle.py --threads: on an idle federation they were a sixth of the
nodes' CPU, with the sweeping node's lease). Four of them look for rows whose time has come:
tasks past their start-by time (``expiry.end_expired``), auctions past their window
(``close.close_expired``), tasks due to be announced (``announce.announce_due``), outcomes due
for the result backend (``report.report_results``). One statement reads the earliest such
time of each (``LOOK``): the sweeper wakes a phase whose time has come, and times its next look
for the earliest one still ahead, so that a task scheduled to start in half a second, or an
auction whose window ends, is handled on time rather than at the next whole idle pause.

Each phase's earliest time is built from the same conditions as its own query (the phase
module's ``NEXT_*``), so the two cannot disagree on which rows they mean. The watchdog
(``watchdog.check_winners``) is not among them: a lost winner is found by who stopped
heartbeating, not by a time in its row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ScalarSelect, select

from bidding.auction.announce import NEXT_DUE_AT
from bidding.auction.close import NEXT_CLOSE
from bidding.auction.expiry import NEXT_EXPIRIES
from bidding.context import Context
from bidding.execution.report import NEXT_REPORT
from bidding.store import read_session

#: Each looked-at phase (by its name in ``sweeper.PHASES``) and the times that say when it next
#: has work: the earliest of them.
EARLIEST: Mapping[str, tuple[ScalarSelect[Any], ...]] = {
    "end_expired": NEXT_EXPIRIES,
    "close_expired": (NEXT_CLOSE,),
    "announce_due": (NEXT_DUE_AT,),
    "report_results": (NEXT_REPORT,),
}
#: The phases an idle sweeper looks at together.
LOOKED = tuple(EARLIEST)

#: One statement: every phase's earliest times, one column each, in ``EARLIEST``'s order.
LOOK = select(*(expression.label(f"{name}_{n}") for name, expressions in EARLIEST.items()
                for n, expression in enumerate(expressions)))


@dataclass(frozen=True)
class Look:
    """When each looked-at phase next has work (None: it has none)."""

    earliest: Mapping[str, float | None]

    def due(self, now: float) -> list[str]:
        """The phases whose work has come by ``now``."""
        return [name for name, at in self.earliest.items() if at is not None and at <= now]

    def next_at(self, now: float, among: tuple[str, ...] = LOOKED) -> float | None:
        """The earliest time still ahead of ``now`` at which one of ``among`` has work."""
        ahead = [at for name, at in self.earliest.items()
                 if name in among and at is not None and at > now]
        return min(ahead, default=None)


def earliest_of(row: tuple[Any, ...]) -> Look:
    """The ``Look`` of one row of ``LOOK``: each phase's earliest of its columns."""
    values = iter(row)
    earliest: dict[str, float | None] = {}
    for name, expressions in EARLIEST.items():
        times = [float(at) for at in (next(values) for _ in expressions) if at is not None]
        earliest[name] = min(times, default=None)
    return Look(earliest)


def look(ctx: Context) -> Look:
    """Read when each looked-at phase next has work, in one statement."""
    with read_session(ctx.settings.database_url) as session:
        row = session.execute(LOOK).one()
    return earliest_of(tuple(row))
