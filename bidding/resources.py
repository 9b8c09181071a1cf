"""What a task needs and what a node has, as pure functions: resources and warm items.

A task may declare the resources one attempt holds while it runs (``{"gpu_mem_gb": 20,
"cpu": 2}``: free-form names, positive amounts) and the items it would like warm on its node
(``["model:llama-3-8b"]``). A node declares its totals in its profile's ``[resources]`` table
(a resource it does not declare is 0 there) and the items it holds warm.

A node's reserved resources are the needs of the attempts awarded to it that have not ended
(ASSIGNED or RUNNING), as its slots are: what is free is its totals less that. Three uses:

- a node whose totals cannot cover a task's needs refuses it, naming the resource
  (``shortfall``), and a task no live node covers fails at once;
- an award weighs a node's fit (``fit_multiplier``): a node the task fits now scores a little
  higher or lower by what would be left free, as ``bidding_fit`` says ("spread" keeps work
  apart, "pack" fills a node's resources before the next node's, keeping big nodes free for big
  tasks); a node the task fits only once its current work ends scores half, so it wins only
  when it is clearly better;
- a node starts an attempt only while its running attempts leave room (``fits``): the award
  steers, the start guarantees, so no node ever holds more than it declares.

Nothing here touches a broker or a database.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: A resource's name: an identifier (``gpu_mem_gb``, ``cpu``, ``ram_gb``, ``license.matlab``).
NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]{0,63}$"
#: The most resources a task or a node may name, and the largest amount (bounded so that no sum
#: of them can overflow).
MOST_NAMES, LARGEST = 32, 1e12
#: A warm item: a model, a data set, anything a node holds loaded (``model:llama-3-8b``).
WARM_PATTERN = r"^[^\s]{1,200}$"
MOST_WARM = 256
#: How an award places a task among the nodes it fits: apart, or packed (best fit).
FIT_MODES = ("spread", "pack")
#: A node the task fits only once its running work ends: its score's multiplier.
WAIT_MULTIPLIER = 0.5
#: The spread between the best and the worst placement among nodes the task fits now: enough
#: to decide among bids that are about as good, not to overrule a clearly better one.
PLACEMENT_RANGE = 0.1
#: A node holding every warm item the task asks for scores this much more (a share for some).
WARM_BONUS = 0.15

Amounts = Mapping[str, float]


def _amounts(value: Any, field: str, *, positive: bool) -> dict[str, float]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{field}: expected a table of resource names and amounts, "
                         f"e.g. {{\"gpu_mem_gb\": 20, \"cpu\": 2}} (got {type(value).__name__})")
    if len(value) > MOST_NAMES:
        raise ValueError(f"{field}: at most {MOST_NAMES} resources (got {len(value)})")
    out: dict[str, float] = {}
    for name, amount in value.items():
        if not isinstance(name, str) or not re.match(NAME_PATTERN, name):
            raise ValueError(f"{field}: {name!r} is not a resource name (letters, digits, _ . -"
                             ", starting with a letter or _)")
        if isinstance(amount, bool) or not isinstance(amount, (int, float)):
            raise ValueError(f"{field}.{name}: expected a number (got {amount!r})")
        number = float(amount)
        low_ok = number > 0 if positive else number >= 0
        if not (low_ok and math.isfinite(number) and number <= LARGEST):
            bound = "more than 0" if positive else "0 or more"
            raise ValueError(f"{field}.{name}: must be {bound} and at most {LARGEST:g} "
                             f"(got {amount!r})")
        out[name] = number
    return out


def needs_of(value: Any, field: str = "resources") -> dict[str, float]:
    """A task's needs, checked: ValueError naming ``field`` and the reason otherwise."""
    return _amounts(value, field, positive=True)


def totals_of(value: Any, field: str = "resources") -> dict[str, float]:
    """A node's declared totals, checked (0 is allowed: declared and none)."""
    return _amounts(value, field, positive=False)


def warm_items(value: Any, field: str = "affinity") -> list[str]:
    """A list of warm items, checked and without repeats (order kept)."""
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"{field}: expected a list of items, e.g. [\"model:llama-3-8b\"] "
                         f"(got {type(value).__name__})")
    if len(value) > MOST_WARM:
        raise ValueError(f"{field}: at most {MOST_WARM} items (got {len(value)})")
    out: list[str] = []
    for item in value:
        if not isinstance(item, str) or not re.match(WARM_PATTERN, item):
            raise ValueError(f"{field}: {item!r} is not an item (1-200 characters, no spaces)")
        if item not in out:
            out.append(item)
    return out


def _amount(amount: float) -> str:
    return f"{amount:g}"


def shortfall(needs: Amounts, totals: Amounts) -> str | None:
    """Why a node with ``totals`` could never run a task with ``needs`` (``"needs gpu_mem_gb
    20, has 16"``), or None when its totals cover them."""
    short = [f"needs {name} {_amount(need)}, has {_amount(totals.get(name, 0.0))}"
             for name, need in sorted(needs.items()) if need > totals.get(name, 0.0)]
    return "; ".join(short) if short else None


def total(all_needs: Iterable[Amounts]) -> dict[str, float]:
    """The sum of several attempts' needs: what they hold together."""
    out: dict[str, float] = {}
    for needs in all_needs:
        for name, amount in needs.items():
            out[name] = out.get(name, 0.0) + amount
    return out


def free(totals: Amounts, reserved: Amounts) -> dict[str, float]:
    """What is left of ``totals`` with ``reserved`` held (never below 0)."""
    return {name: max(0.0, amount - reserved.get(name, 0.0)) for name, amount in totals.items()}


def fits(needs: Amounts, totals: Amounts, reserved: Amounts) -> bool:
    """Whether ``needs`` fit in what ``reserved`` leaves of ``totals`` now."""
    return all(reserved.get(name, 0.0) + need <= totals.get(name, 0.0) + 1e-9
               for name, need in needs.items())


def left_after(needs: Amounts, totals: Amounts, reserved: Amounts) -> float:
    """The smallest share of a needed resource left free once ``needs`` are placed (0: the
    task fills a resource; 1: it takes nothing of any)."""
    shares = [max(0.0, totals.get(name, 0.0) - reserved.get(name, 0.0) - need)
              / totals[name] for name, need in needs.items() if totals.get(name, 0.0) > 0]
    return min(shares) if shares else 0.0


def fit_multiplier(needs: Amounts, totals: Amounts, reserved: Amounts,
                   mode: str = "spread") -> float | None:
    """A node's placement multiplier for a task with ``needs`` (None: the task needs nothing).

    Fits now: between ``1 - PLACEMENT_RANGE`` and 1, higher the more it leaves free
    ("spread") or the less ("pack", best fit). Fits only later: ``WAIT_MULTIPLIER``."""
    if not needs:
        return None
    if mode not in FIT_MODES:
        raise ValueError(f"fit: expected one of {', '.join(FIT_MODES)} (got {mode!r})")
    if not fits(needs, totals, reserved):
        return WAIT_MULTIPLIER
    left = left_after(needs, totals, reserved)
    placement = left if mode == "spread" else 1.0 - left
    return 1.0 - PLACEMENT_RANGE + PLACEMENT_RANGE * placement


def warm_share(affinity: Sequence[str], warm: Iterable[str]) -> float:
    """The share of the task's ``affinity`` the node holds warm (0 when it asks for none)."""
    if not affinity:
        return 0.0
    held = set(warm)
    return sum(1 for item in affinity if item in held) / len(affinity)


def warm_multiplier(affinity: Sequence[str], warm: Iterable[str]) -> float | None:
    """A node's warm multiplier: ``1 + WARM_BONUS`` times the share it holds (None: none)."""
    share = warm_share(affinity, warm)
    return 1.0 + WARM_BONUS * share if share > 0 else None
