"""Awarding into the journal: the caller bids for every candidate, decides, and appends the award
with its winner's reservation in one compare-and-set."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace

import redis

from bidding.auction.award import PROXY_CLOSE, Closing, decide_award, strategy_of
from bidding.auction.history import lock_states, read_rooms
from bidding.auction.placement import placed
from bidding.auction.proxy import answers_inside
from bidding.auction.refused import reason_of
from bidding.auction.reserve import AGAIN, Again, reserve
from bidding.auction.writebehind.journal import (
    STALE,
    AlreadyJournaled,
    AppendUnknown,
    Entry,
    Journal,
    get_journal,
)
from bidding.context import Context
from bidding.models import Announcement, Award
from bidding.nodes.registry import LiveNode
from bidding.store import read_session

logger = logging.getLogger(__name__)

def award_behind(ctx: Context, announcement: Announcement,
                 nodes: Sequence[LiveNode]) -> Award | None:
    """Bid for ``nodes`` and award the announcement (a new task with a fresh id) into the
    journal; the caller routes the award. None when the journal is off.

    The bidders' state is read outside any transaction, with their reservations, and the
    award's append compare-and-sets the version of the winner's reservations, so two
    concurrent awards do not both take a node's last slot; the last try appends as decided (as
    the store's path does).

    An append that fails, or finds the task in the journal already (redis-py sent it again
    after a lost reply), may have been taken: the award the journal holds is returned if it
    holds one; else ``AppendUnknown`` says that only the store can tell.
    """
    journal = get_journal(ctx)
    if journal is None:
        return None
    strategy = strategy_of(ctx.settings, announcement)
    inside = answers_inside(ctx.settings, announcement, nodes)
    bidders = sorted(set(inside.nodes))
    candidates = [node.name for node in nodes]

    def append_once(last: bool) -> Award | Again:
        # Reservations before the store: a reservation written meanwhile is then counted
        # twice (in the store and the set) for a moment, never missed.
        seen = journal.reservations(bidders)
        held = {name: r.count for name, r in seen.items()}
        with read_session(ctx.settings.database_url) as session:
            known = lock_states(
                session,
                bidders,
                lock=False,
                task_type=announcement.task_type,
                since=inside.now - ctx.settings.recent_failure_seconds,
            )
            known = {
                name: replace(state, in_flight=state.in_flight + held.get(name, 0))
                for name, state in known.items()
            }
            answers = list(inside.make(session, known))
            # Without the journal's own reservations: they carry no resources (a node's
            # start still never over-commits, ``execution.room``).
            rooms = read_rooms(session, bidders) if placed(announcement) else None
        counts = {name: state.in_flight for name, state in known.items()}
        award = decide_award(
            ctx.settings,
            announcement,
            strategy,
            answers,
            counts,
            Closing(PROXY_CLOSE, len(nodes)),
            extra_load=held,
            rooms=rooms,
        )
        expect = None
        if award.winner is not None and not last:
            # A fallback winner is no bidder: its reservations are read now.
            found = (
                seen[award.winner]
                if award.winner in seen
                else journal.reservations([award.winner])[award.winner]
            )
            expect = found.version
        entry = Entry(
            announcement=announcement,
            candidates=candidates,
            answers=answers,
            award=award,
            counts=counts,
        )
        try:
            if journal.append(entry, expect) == STALE:
                return AGAIN
            return award
        except (redis.RedisError, AlreadyJournaled) as exc:
            return _taken(journal, announcement.task_id, exc)

    return reserve(append_once)


def _taken(journal: Journal, task_id: str, exc: Exception) -> Award:
    """The award the journal holds for ``task_id`` after its append failed with ``exc``; raises
    ``AppendUnknown`` when Redis cannot be asked, or the entry is not there (never taken, or
    written to the store and dropped already: the store tells those apart)."""
    try:
        (held,) = journal.entries([task_id])
    except redis.RedisError as again:
        raise AppendUnknown(
            f"journaling the award of {task_id} failed ({reason_of(exc)}) and "
            f"Redis cannot say whether it took it ({reason_of(again)})"
        ) from exc
    if isinstance(held, Entry):
        logger.warning(
            "journaling the award of %s reported %s, but the journal took it",
            task_id,
            reason_of(exc),
        )
        return held.award
    raise AppendUnknown(
        f"journaling the award of {task_id} failed ({reason_of(exc)}) and the "
        "journal does not hold it (never taken, or written already)"
    ) from exc
