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
module's ``NEXT_*``), so the two cannot disagree on which rows they mean. A row whose time has
come and that stays (its phase fails on it, until it is parked) keeps its phase's earliest time
in the past: the phase is then woken at every look, and a later row of the same phase is
handled within a look of its time rather than on it. The watchdog (``watchdog.check_winners``)
is not among them: a lost winner is found by who stopped heartbeating, not by a time in its
row.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ScalarSelect, select

from bidding.auction.announce import NEXT_DUE_AT
from bidding.auction.close import NEXT_CLOSE
from bidding.auction.expiry import NEXT_EXPIRY
from bidding.context import Context
from bidding.execution.report import NEXT_REPORT
from bidding.store import read_session

#: Each looked-at phase (by its name in ``sweeper.PHASES``) and when it next has work.
EARLIEST: Mapping[str, ScalarSelect[Any]] = {
    "end_expired": NEXT_EXPIRY,
    "close_expired": NEXT_CLOSE,
    "announce_due": NEXT_DUE_AT,
    "report_results": NEXT_REPORT,
}
#: The phases an idle sweeper looks at together.
LOOKED = tuple(EARLIEST)

#: One statement: every phase's earliest time, one column each, in ``EARLIEST``'s order.
LOOK = select(*(expression.label(name) for name, expression in EARLIEST.items()))


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


def look(ctx: Context) -> Look:
    """Read when each looked-at phase next has work, in one statement."""
    with read_session(ctx.settings.database_url) as session:
        row = session.execute(LOOK).one()
    return Look({name: None if at is None else float(at)
                 for name, at in zip(LOOKED, row, strict=True)})
