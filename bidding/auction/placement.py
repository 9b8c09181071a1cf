"""Where a task fits: each bidder's room for it (declared resources, what its unfinished
attempts reserve, what it holds warm) and the multipliers an award applies to its score.

The strategies rank bids on what the bids say (confidence, skills, load); placement is what
the award knows of the nodes at that moment, under its lock. An award of a task that needs
resources or asks for warm items multiplies each scored bid by its node's placement
(``resources.fit_multiplier``: x0.9-1.0 when the task fits now, as ``bidding_fit`` places it,
x0.5 when it fits only once the node's work ends; ``resources.warm_multiplier``: up to x1.15
for a node holding the task's warm items), so that every scoring strategy places it alike.
Pure: ``bind`` reads the rooms in its transaction (``history.read_rooms``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from bidding import resources
from bidding.models import Announcement


@dataclass(frozen=True)
class Room:
    """What a node has for a task's placement now."""

    #: Its declared resources (its profile's ``[resources]`` table).
    totals: Mapping[str, float] = field(default_factory=dict)
    #: What the attempts awarded to it and not ended (ASSIGNED or RUNNING) hold.
    reserved: Mapping[str, float] = field(default_factory=dict)
    #: The items it holds warm (its profile's ``warm``, and what its task bodies marked).
    warm: frozenset[str] = frozenset()

    @property
    def free(self) -> dict[str, float]:
        """What is left of its totals with its reservations held."""
        return resources.free(self.totals, self.reserved)


def placed(announcement: Announcement) -> bool:
    """Whether ``announcement``'s award weighs placement (it needs resources or warm items)."""
    return bool(announcement.resources or announcement.affinity)


def multipliers(announcement: Announcement, room: Room | None, fit: str,
                free_slot: bool = True) -> dict[str, float]:
    """The placement multipliers of a node with ``room`` for ``announcement`` (``fit``:
    "spread" or "pack"), by name as ``explain`` shows them; none when it weighs nothing.

    ``free_slot``: whether the node has a slot free for the task now. A node whose slots are
    all busy gets no warm bonus: the task would wait for a slot, and what the node holds warm
    then is not what it holds now, so a free cold node wins over an otherwise equal full warm
    one."""
    out: dict[str, float] = {}
    if room is None:
        return out
    fit_by = resources.fit_multiplier(announcement.resources, room.totals, room.reserved, fit)
    if fit_by is not None:
        out["fit"] = round(fit_by, 6)
    warm_by = resources.warm_multiplier(announcement.affinity, room.warm) if free_slot else None
    if warm_by is not None:
        out["warm"] = round(warm_by, 6)
    return out
