"""Writing the journal behind: the node workers' writers store its entries in batches, a winner
stores its own before it starts, and entries the store refuses or cannot read are set apart."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from celery import Celery
from sqlalchemy import bindparam, select

from bidding.auction.bind import write_award
from bidding.auction.opening import record_new
from bidding.auction.refused import Failed, fail_unrecorded, reason_of, refuses
from bidding.auction.writebehind.journal import (
    BLOCK_MS,
    GONE_AFTER_RECLAIMS,
    UNREADABLE_GRACE,
    Entry,
    Journal,
    Unreadable,
    get_journal,
)
from bidding.config import Settings
from bidding.context import Context
from bidding.store import read_session, write_session
from bidding.store.schema import AnnouncementRow

logger = logging.getLogger(__name__)

_PRESENT = select(AnnouncementRow.task_id).where(
    AnnouncementRow.task_id.in_(bindparam("ids", expanding=True)))


@dataclass(frozen=True)
class Written:
    """What ``write_isolated`` did."""

    #: Entries written here (not those in the store already).
    count: int
    #: The entries the store refused, each with its reason.
    refused: list[tuple[Entry, str]]


def write_isolated(settings: Settings, entries: Sequence[Entry]) -> Written:
    """Write ``entries`` as ``write_entries`` does, in one transaction; if the store refuses
    it (a value of one entry: the same write would fail every time), write them one by one, so
    that only the entries the store refuses are left out (returned, with its reason). Raises
    when the store cannot be reached (``refused.refuses``): the batch is tried again later.

    One transaction per entry only after a refused batch: the common batch costs nothing more
    (a savepoint per entry would cost two statements each, every time)."""
    try:
        return Written(write_entries(settings, entries), [])
    except Exception as exc:
        if not refuses(exc):
            raise
        if len(entries) == 1:
            return Written(0, [(entries[0], reason_of(exc))])
    written, refused = 0, []
    for entry in entries:
        try:
            written += write_entries(settings, [entry])
        except Exception as exc:
            if not refuses(exc):
                raise
            refused.append((entry, reason_of(exc)))
    return Written(written, refused)


def write_entries(settings: Settings, entries: Sequence[Entry]) -> int:
    """Write ``entries`` to the store in one transaction, skipping those there already
    (idempotent: each one's announcement is inserted once, ``store.once``, and the rest only
    with it); returns how many were written here."""
    if not entries:
        return 0
    with write_session(settings.database_url) as session:
        seen: set[str] = set()
        written = 0
        for entry in entries:
            if entry.announcement.task_id in seen:
                continue
            seen.add(entry.announcement.task_id)
            # Once: written before (a replay), or by a winner writing its own (settle).
            if not record_new(session, entry.announcement, entry.candidates, once=True):
                continue
            if not write_award(session, settings, entry.announcement, entry.answers, entry.award,
                               entry.counts, write=True):
                raise AssertionError(
                    f"{entry.announcement.task_id}: a new announcement was not open"
                )
            written += 1
    return written


def settle(ctx: Context, task_id: str, *, wait: float = 0.0) -> bool:
    """Write ``task_id``'s entry now if it is still only in the journal (its winner, before it
    starts; ``explain``, so that it shows the award). True when it was written here.

    ``wait``: seconds to give a writer that is writing it first. A writer takes an entry the
    moment it is appended, while the execution is still on its way to the winner, so the
    winner usually finds it written, or being written, and waits rather than writing it too.
    """
    journal = get_journal(ctx)
    if journal is None:
        return False
    deadline = time.monotonic() + wait
    pause = 0.0005
    while journal.client.hexists(journal.pending, task_id):
        if time.monotonic() >= deadline:
            break
        time.sleep(pause)
        pause = min(pause * 1.5, 0.005)
    else:
        return False  # not (or no longer) in the journal: in the store
    (entry,) = journal.entries([task_id])
    if not isinstance(entry, Entry):
        return False  # written meanwhile; or unreadable here: left to the writers
    if write_isolated(ctx.settings, [entry]).refused:
        return False  # the writer that holds it fails its task (it can acknowledge it)
    journal.forget([entry])
    return True


def wait_written(ctx: Context, task_id: str, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``task_id``'s row, writing its entry if it appears
    in the journal (a winner whose execution outran the award's append). False if it never
    does: the award was lost with a Redis that kept nothing on disk."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(redis.RedisError):  # Redis back later: look again
            settle(ctx, task_id)
        with read_session(ctx.settings.database_url) as session:
            if session.execute(_PRESENT, {"ids": [task_id]}).first() is not None:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


class Writer:
    """A node worker's journal writer: one pass takes a batch (its own unacknowledged
    entries first, then a dead writer's, then new ones), writes it and acknowledges it.

    An entry the store refuses is failed (``refused.fail_unrecorded``) and acknowledged with
    the rest; one this version cannot read stays unacknowledged for a writer that can (another
    takes it over after the reclaim time), for ``UNREADABLE_GRACE`` at most. Writers gone for
    ``GONE_AFTER_RECLAIMS`` reclaim times and holding nothing are deleted from the group."""

    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.app = app
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self._own = True  # after a failed batch, or at start: its own unacknowledged first
        self._next_reclaim = 0.0

    def run(self) -> int:
        """One pass; returns the number of entries written to the store."""
        journal = get_journal(Context(self.settings, self.app))
        if journal is None:
            time.sleep(BLOCK_MS / 1000)
            return 0
        journal.ensure_group()
        batch: list[tuple[str, str]] = []
        if self._own:
            batch = journal.read(self.consumer, own=True)
            self._own = bool(batch)
        if not batch and time.monotonic() >= self._next_reclaim:
            reclaim = self.settings.journal_reclaim_seconds
            self._next_reclaim = time.monotonic() + reclaim / 2
            batch = journal.reclaim(self.consumer, int(reclaim * 1000))
            if batch:
                logger.warning(
                    "journal: took over %d entries of a writer that went silent", len(batch)
                )
            self._drop_gone(journal, reclaim)
        if not batch:
            batch = journal.read(self.consumer)
        if not batch:
            return 0
        self._own = True  # if this batch fails, it is read again next pass
        found = journal.entries([task for _, task in batch])
        entries = [e for e in found if isinstance(e, Entry)]
        unreadable = [
            (sid, e) for (sid, _), e in zip(batch, found, strict=True) if isinstance(e, Unreadable)
        ]
        written = write_isolated(self.settings, entries)
        for entry, reason in written.refused:
            fail_unrecorded(
                Context(self.settings, self.app),
                entry.announcement,
                entry.candidates,
                f"the store refused its award ({reason})",
            )
        expired = self._expired(journal, unreadable)
        journal.forget(entries)
        journal.release([(task, winner) for _, task, winner in expired])
        left = {sid for sid, _ in unreadable} - {sid for sid, _, _ in expired}
        journal.ack([sid for sid, _ in batch if sid not in left])
        self._own = False
        return written.count

    def _drop_gone(self, journal: Journal, reclaim: float) -> None:
        """Delete the writers gone from the group (housekeeping: a failure is only logged)."""
        try:
            gone = journal.drop_gone(self.consumer, int(GONE_AFTER_RECLAIMS * reclaim * 1000))
        except redis.RedisError as exc:
            logger.warning("journal: deleting the writers that are gone failed (%s)", exc)
            return
        if gone:
            logger.info(
                "journal: writers %s are gone (silent, holding nothing): deleted", ", ".join(gone)
            )

    def _expired(
        self, journal: Journal, unreadable: Sequence[tuple[str, Unreadable]]
    ) -> list[tuple[str, str, str | None]]:
        """Of the entries this version cannot read, those past ``UNREADABLE_GRACE`` since
        their append, failed now: (stream id, task id, winner). The others are left
        unacknowledged, for a writer that can read them (a newer version's takes them over)."""
        if not unreadable:
            return []
        now_ms = journal.now_ms()
        expired = []
        for sid, entry in unreadable:
            if now_ms - int(sid.split("-")[0]) < UNREADABLE_GRACE * 1000:
                logger.warning(
                    "journal: task %s's entry cannot be read here (%s); left for a "
                    "writer that can (a newer version's)",
                    entry.task_id,
                    entry.error,
                )
                continue
            announcement, candidates, winner = entry.salvage()
            reason = (
                f"the journal's writers cannot read its entry ({entry.error}), none for "
                f"{UNREADABLE_GRACE:g}s since it was made (a newer version's?)"
            )
            if (
                fail_unrecorded(Context(self.settings, self.app), announcement, candidates, reason)
                is Failed.RECORDED
            ):
                logger.info(
                    "journal: task %s's unreadable entry is in the store already", entry.task_id
                )
            expired.append((sid, entry.task_id, winner))
        return expired
