"""The ledger (AITP 7): one cost entry per attempt, charged at the node's price per unit, and a
task's spending against its budget.
"""

from __future__ import annotations

from typing import Any, Final, cast

from sqlalchemy import Table, bindparam, func, select
from sqlalchemy.orm import Session

from bidding.store.schema import LedgerEntry

_LEDGER: Final = cast(Table, LedgerEntry.__table__)
_SPENT: Final = select(func.coalesce(func.sum(_LEDGER.c.total), 0.0)).where(
    _LEDGER.c.task_id == bindparam("task_id"))


def entry(*, task_id: str, attempt: int, node: str, units: float, price_per_unit: float,
          at: float) -> dict[str, Any]:
    """An attempt's ledger row: its cost is the node's price times the units consumed (AITP
    7.1). Written once (``episodes.record_attempt``: a redelivered attempt is not charged
    twice)."""
    return {"task_id": task_id, "attempt": attempt, "node": node, "units": units,
            "price_per_unit": price_per_unit, "total": price_per_unit * units, "at": at}


def spent(session: Session, task_id: str) -> float:
    """The task's total cost so far (every attempt's ledger entry)."""
    return float(session.scalar(_SPENT, {"task_id": task_id}) or 0.0)
