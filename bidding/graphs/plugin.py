"""Task graphs' advancement as a plug-in (``lifecycle.plugins``): a subtask that ended moves
its graph on at once (announcing what it made ready), and every node worker advances graphs
nobody moved for a while (a subtask failed outside any worker, a node died between a step's
end and announcing what it made ready)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from bidding.context import Context
from bidding.graphs.advance import advance_idle, task_ended
from bidding.lifecycle.plugins import Loop, Plugin

logger = logging.getLogger(__name__)


class GraphPlugin(Plugin):
    """Task graphs' hooks (see the module)."""

    def after_end(self, task_id: str, task: Any) -> None:
        """A subtask (a task with an AITP capability) moves its graph on; a sweeper does it
        later if this fails."""
        if not getattr(task, "capability", None):
            return
        try:
            task_ended(Context(self.settings, self.app), task_id)
        except Exception:
            logger.exception("task %s: advancing its task graph failed; a sweeper will",
                             task_id)

    def loops(self, sweep_every: Callable[[], float]) -> Sequence[Loop]:
        """Advance the graphs left alone, every sweep."""
        return [Loop("bidding-sweeper-advance_idle", sweep_every,
                     lambda: advance_idle(Context(self.settings, self.app)),
                     federation_wide=True, fallback_only=True)]
