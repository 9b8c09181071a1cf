"""The write-behind journal as a plug-in (``lifecycle.plugins``): on when
``bidding_award_journal`` is. A winner writes its task's entry before it starts (or waits for
the writer that holds it), a reader writes a pending one before it shows the task, and every
node worker runs a writer."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from bidding.auction.writebehind.journal import WINNER_WAIT, WRITER_PAUSE
from bidding.auction.writebehind.writer import Writer, settle, wait_written
from bidding.config import Settings
from bidding.context import Context
from bidding.lifecycle.plugins import Loop, Plugin

logger = logging.getLogger(__name__)


class JournalPlugin(Plugin):
    """The write-behind journal's hooks (see the module)."""

    @classmethod
    def wanted(cls, settings: Settings) -> bool:
        """On with ``bidding_award_journal``."""
        return settings.award_journal

    def before_start(self, task_id: str) -> None:
        """Write the task's award if it is still only in the journal (a writer that took it
        is given ``WINNER_WAIT`` seconds first)."""
        try:
            settle(Context(self.settings, self.app), task_id, wait=WINNER_WAIT)
        except Exception as exc:  # begin then waits for a writer (row_coming)
            logger.warning("task %s: writing its journaled award failed (%s)", task_id, exc)

    def row_coming(self, task_id: str) -> bool:
        """Wait for a writer that holds the task's entry (one taken over after a writer died
        takes up to the reclaim time): True once its row is in the store."""
        return wait_written(Context(self.settings, self.app), task_id,
                            2 * self.settings.journal_reclaim_seconds)

    def before_read(self, task_id: str) -> None:
        """Write a pending award now, so that the reader shows it."""
        try:
            settle(Context(self.settings, self.app), task_id)
        except Exception as exc:  # the store's state is still worth showing
            logger.warning("task %s: its journal entry could not be written (%s)", task_id,
                           exc)

    def loops(self, sweep_every: Callable[[], float]) -> Sequence[Loop]:
        """The writer: its read blocks until entries come."""
        return [Loop("bidding-journal-writer", WRITER_PAUSE,
                     Writer(self.settings, self.app).run)]
