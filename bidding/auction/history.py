"""What the store knows about a node when it bids: its latest episodes of a task type, its
recent failures, its in-flight work and its record; read for one node or several together, and
cached while the node's history version (``nodes.history_version``) holds.

``place_bid`` is the node's built-in bidder: it reads this history and calls the pure
``bid.compute_bid``. ``history_changed`` and ``history_versions`` raise and read the versions
in the bid board's Redis (there are none when the board is the store).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Final, cast

from sqlalchemy import ARRAY, Select, String, any_, bindparam, func, select, union_all
from sqlalchemy.orm import Session

from bidding import clock, resources
from bidding.auction.bid import NodeHistory, compute_bid, refusal_reason
from bidding.auction.board import get_board
from bidding.auction.placement import Room
from bidding.config import Settings
from bidding.context import Context
from bidding.lifecycle import states
from bidding.models import Announcement, Bid, Refusal
from bidding.nodes import history_version
from bidding.nodes.kin import KinRecord, kin_records
from bidding.nodes.profile import NodeProfile
from bidding.nodes.records import Record, records_of
from bidding.store import read_session
from bidding.store.direct import execute
from bidding.store.engine import core
from bidding.store.forkguard import child_safe_lock
from bidding.store.schema import AnnouncementRow, Episode, Node

logger = logging.getLogger(__name__)

_IN_FLIGHT = (
    select(AnnouncementRow.assigned_node, func.count())
    .where(AnnouncementRow.assigned_node.in_(bindparam("nodes", expanding=True)),
           AnnouncementRow.state.in_(sorted(states.IN_FLIGHT_STATES)))
    .group_by(AnnouncementRow.assigned_node)
)


def count_in_flight(session: Session, nodes: Sequence[str]) -> dict[str, int]:
    """Tasks awarded and unfinished, per node (derived from announcement states, never leaked)."""
    if not nodes:
        return {}
    rows = core(session).execute(_IN_FLIGHT, {"nodes": list(nodes)}).all()
    return {str(node): int(n) for node, n in rows}


#: A node's in-flight work, for ``_STATES_OF``: the same count as ``_IN_FLIGHT``'s.
_IN_FLIGHT_OF_ROW = (
    select(func.count())
    .where(AnnouncementRow.assigned_node == Node.name,
           AnnouncementRow.state.in_(sorted(states.IN_FLIGHT_STATES)))
    .scalar_subquery()
)
#: A node's recent failures of a task type, for ``_STATES_OF``.
_FAILURES_OF_ROW = (
    select(func.count())
    .where(Episode.node == Node.name, Episode.task_type == bindparam("task_type"),
           Episode.success.is_(False), Episode.finished_at >= bindparam("since"))
    .scalar_subquery()
)
#: Nodes' records, in-flight work and recent failures in one statement (one round trip: on
#: PostgreSQL a statement costs about 0.2 ms of the caller's CPU, whatever it reads).
_STATES_OF = (
    select(Node.name, Node.attempts, Node.successes, _IN_FLIGHT_OF_ROW, _FAILURES_OF_ROW)
    .where(Node.name.in_(bindparam("nodes", expanding=True)))
    .order_by(Node.name)
)
_LOCK = (select(Node.name).where(Node.name.in_(bindparam("nodes", expanding=True)))
         .order_by(Node.name).with_for_update())
#: PostgreSQL's: the names as one array parameter (``= ANY``), so that the statement's text is
#: the same for any number of nodes and it runs on psycopg's cursor (``store.direct``); an IN
#: list is expanded by SQLAlchemy at every execution.
_NAMES: Final = any_(bindparam("nodes", type_=ARRAY(String)))
_IN_FLIGHT_OF_ROW_ARRAY = (
    select(func.count())
    .where(AnnouncementRow.assigned_node == Node.name,
           AnnouncementRow.state == any_(bindparam(
               "in_flight", sorted(states.IN_FLIGHT_STATES), type_=ARRAY(String))))
    .scalar_subquery()
)
_STATES_OF_ARRAY = (
    select(Node.name, Node.attempts, Node.successes, _IN_FLIGHT_OF_ROW_ARRAY, _FAILURES_OF_ROW)
    .where(Node.name == _NAMES)
    .order_by(Node.name)
)
_LOCK_ARRAY = select(Node.name).where(Node.name == _NAMES).order_by(Node.name).with_for_update()


def lock_states(session: Session, nodes: Sequence[str], *, lock: bool, task_type: str,
                since: float) -> dict[str, NodeHistory]:
    """The nodes' histories but their latest outcomes (``read_histories`` adds those), read
    with one statement; ``lock``: their rows are locked first, until the transaction ends
    (an award's reservation; in name order, so that two awards never wait on each other).
    A node without a row (never registered) is missing.

    The lock is a statement of its own: PostgreSQL computes a ``SELECT ... FOR UPDATE``'s
    columns on the snapshot its statement began with, before it waited for the lock, so an
    award that held the lock and committed would be missing from the counts (and two
    concurrent awards would not spread). The read after it sees that award.
    """
    if not nodes:
        return {}
    names = sorted(set(nodes))
    conn = core(session)
    arrays = conn.dialect.name == "postgresql"
    if lock:
        execute(conn, _LOCK_ARRAY if arrays else _LOCK, {"nodes": names})
    rows = execute(conn, _STATES_OF_ARRAY if arrays else _STATES_OF, {
        "nodes": names, "task_type": task_type, "since": since}).all()
    return {str(row[0]): NodeHistory(in_flight=int(row[3]), recent_failures=int(row[4]),
                                     attempts=int(row[1]), successes=int(row[2]))
            for row in rows}


def in_flight_counts(settings: Settings, nodes: Sequence[str]) -> dict[str, int]:
    """``count_in_flight`` in a read session of its own."""
    with read_session(settings.database_url) as session:
        return count_in_flight(session, nodes)


def gather_history(
    settings: Settings, node: str, task_type: str, now: float | None = None
) -> NodeHistory:
    """Read ``node``'s history from the store: recent episodes, in-flight work, trust inputs."""
    return gather_histories(settings, [node], task_type, now)[node]


# Built once: constructing these statements cost more than running them (bench/latency.py).
_RECENT_FAILURES_OF = (select(Episode.node, func.count())
                       .where(Episode.node.in_(bindparam("nodes", expanding=True)),
                              Episode.task_type == bindparam("task_type"),
                              Episode.success.is_(False),
                              Episode.finished_at >= bindparam("since"))
                       .group_by(Episode.node))


# The nodes' records, kept with their episodes (counting them grew with a node's age).
_TOTALS_OF = (select(Node.name, Node.attempts, Node.successes)
              .where(Node.name.in_(bindparam("nodes", expanding=True))))


_latest_of: dict[int, Select[tuple[str, bool, float, float]]] = {}


def _latest_of_nodes(count: int) -> Select[tuple[str, bool, float, float]]:
    """The latest episodes of ``count`` nodes in one statement: one index range scan each
    (``ix_bidding_episodes_node_type``), however long a node's history is. Built once per
    count: building a statement costs more than running it."""
    statement = _latest_of.get(count)
    if statement is None:
        parts = [select(Episode.node, Episode.success, Episode.finished_at, Episode.duration_s)
                 .where(Episode.node == bindparam(f"node_{i}"),
                        Episode.task_type == bindparam("task_type"),
                        # An attempt lost with its worker says nothing of the task type
                        # (it counts against the node's trust only).
                        Episode.lost.is_(False))
                 .order_by(Episode.finished_at.desc())
                 .limit(bindparam("limit")).subquery(f"latest_{i}")
                 for i in range(count)]
        statement = cast(Select[tuple[str, bool, float, float]],
                         union_all(*(select(part) for part in parts)))
        _latest_of[count] = statement
    return statement


def gather_histories(
    settings: Settings, nodes: Sequence[str], task_type: str, now: float | None = None
) -> dict[str, NodeHistory]:
    """The histories of ``nodes`` (``gather_history``), read together: four statements in
    all, not four per node (a proxy bidder reads every candidate's for one auction)."""
    if not nodes:
        return {}
    with read_session(settings.database_url) as session:
        return read_histories(session, settings, nodes, task_type, now)


def read_histories(
    session: Session, settings: Settings, nodes: Sequence[str], task_type: str,
    now: float | None = None, known: Mapping[str, NodeHistory] | None = None,
) -> dict[str, NodeHistory]:
    """``gather_histories`` in the caller's transaction. ``known``: the nodes' states read
    already (``lock_states``, the award's, under its lock): only their latest outcomes are
    read then, one statement instead of four."""
    now = clock.now() if now is None else now
    if not nodes:
        return {}
    names = list(dict.fromkeys(nodes))
    params = {f"node_{i}": name for i, name in enumerate(names)}
    conn = core(session)
    latest = execute(conn, _latest_of_nodes(len(names)),
                     {**params, "task_type": task_type, "limit": settings.episodes_read}).all()
    outcomes: dict[str, list[tuple[float, bool, float]]] = {name: [] for name in names}
    for node, success, finished_at, duration_s in latest:
        outcomes[node].append((finished_at, bool(success), float(duration_s or 0.0)))
    if known is None:
        failures = {row[0]: row[1] for row in conn.execute(_RECENT_FAILURES_OF, {
            "nodes": names, "task_type": task_type,
            "since": now - settings.recent_failure_seconds})}
        totals = {row.name: (row.attempts, row.successes)
                  for row in conn.execute(_TOTALS_OF, {"nodes": names})}
        in_flight = count_in_flight(session, names)
        known = {name: NodeHistory(recent_failures=int(failures.get(name, 0)),
                                   in_flight=int(in_flight.get(name, 0)),
                                   attempts=int(totals.get(name, (0, 0))[0]),
                                   successes=int(totals.get(name, (0, 0))[1]))
                 for name in names}
    window = settings.experience_window
    latest_first = {name: sorted(outcomes[name], key=lambda p: p[0], reverse=True)
                    for name in names}
    return {name: dataclasses.replace(
                known.get(name, NodeHistory()),
                outcomes=tuple(ok for _, ok, _ in latest_first[name][:window]),
                earlier=tuple(ok for _, ok, _ in latest_first[name][window:]),
                # What the built-in bidder's duration estimate is made of.
                durations=tuple(took for _, ok, took in latest_first[name][:window] if ok))
            for name in names}


#: The most histories a process keeps: one per (store, node, task type). Task types are the
#: callers' to choose, so nothing else bounds them; the least recently used entry goes first,
#: and an evicted one only costs its next bid a read of the store.
HISTORY_CACHE_LIMIT = 2048

_history: OrderedDict[tuple[str, str, str], tuple[float, object, NodeHistory]] = (
    OrderedDict())
#: Bid threads read and fill the cache at once: an LRU's reordering is not atomic.
_history_lock = child_safe_lock()


def history_cache_size() -> int:
    """How many histories this process has cached."""
    return len(_history)


def cached_history(settings: Settings, node: str, task_type: str, now: float | None = None,
                   version: int | None = None) -> NodeHistory:
    """``gather_history``, reused while ``version`` is unchanged, for at most
    ``bidding_history_cache_seconds``.

    Four queries per bid were most of a bid's cost (bench/latency.py). ``version`` (the
    node's history version) changes whenever the node finishes an attempt, so a finished
    attempt counts in the very next bid; work awarded meanwhile is re-counted by the award
    under its lock.
    """
    return cached_histories(settings, [node], task_type, {node: version}, now)[node]


def cached_histories(settings: Settings, nodes: Sequence[str], task_type: str,
                     versions: Mapping[str, int | None], now: float | None = None
                     ) -> dict[str, NodeHistory]:
    """``cached_history`` of several nodes: the ones not cached (or changed) are read together
    (``gather_histories``); ``versions`` are their history versions."""
    seen = time.monotonic()
    out, stale = _cached(settings, nodes, task_type, versions, seen)
    if stale:
        read = gather_histories(settings, stale, task_type, now)
        _remember(settings, task_type, versions, read, seen)
        out.update(read)
    return out


def histories_inside(session: Session, settings: Settings, nodes: Sequence[str],
                     task_type: str, known: Mapping[str, NodeHistory],
                     now: float | None = None) -> dict[str, NodeHistory]:
    """``read_histories`` in the award's transaction, with each node's states as ``known``
    (read under its lock), and its latest outcomes from the cache while its record holds:
    only the nodes whose record counts another finished attempt since their outcomes were
    read (or whose entry is older than ``bidding_history_cache_seconds``) are read.

    The announcer's proxy bids read every candidate's latest episodes of the type (up to
    ``episodes_read`` rows each), most of the award's reading at eight candidates; between two
    auctions most candidates have finished nothing. A node's record (``known``'s attempts,
    counted with each episode in the episode's own transaction) is read under the award's
    lock, in its snapshot: it cannot say "unchanged" of outcomes that changed."""
    seen = time.monotonic()
    versions: dict[str, object] = {
        name: (_RECORD_VERSION, known[name].attempts) for name in nodes if name in known}
    hits, stale = _cached(settings, nodes, task_type, versions, seen)
    read = read_histories(session, settings, stale, task_type, now, known=known) if stale else {}
    _remember(settings, task_type, versions, read, seen)
    out = {name: dataclasses.replace(known.get(name, NodeHistory()), outcomes=hit.outcomes,
                                     earlier=hit.earlier, durations=hit.durations)
           for name, hit in hits.items()}
    out.update(read)
    return {name: out[name] for name in dict.fromkeys(nodes)}


#: Tags the version of an entry cached by ``histories_inside`` (a node's record), so that it
#: is never taken for a history version on the bid board, or the other way round.
_RECORD_VERSION = "record"


def _cached(settings: Settings, nodes: Sequence[str], task_type: str,
            versions: Mapping[str, object], seen: float
            ) -> tuple[dict[str, NodeHistory], list[str]]:
    """The cached histories of ``nodes`` still valid at ``seen`` (monotonic), and the nodes
    to read."""
    ttl = settings.history_cache_seconds
    out: dict[str, NodeHistory] = {}
    stale: list[str] = []
    with _history_lock:
        for node in nodes:
            version = versions.get(node)
            key = (settings.database_url, node, task_type)
            hit = _history.get(key)
            # Without a version (the store board, e.g. on RabbitMQ) nothing says when the
            # record changed: read it every time rather than bid on a stale one.
            if (ttl > 0 and version is not None and hit is not None and seen - hit[0] < ttl
                    and hit[1] == version):
                out[node] = hit[2]
                _history.move_to_end(key)
            else:
                stale.append(node)
    return out, stale


def _remember(settings: Settings, task_type: str, versions: Mapping[str, object],
              read: Mapping[str, NodeHistory], seen: float) -> None:
    """Cache histories ``read`` at ``seen`` under the versions they were read at."""
    if not read:
        return
    with _history_lock:
        for node, history in read.items():
            key = (settings.database_url, node, task_type)
            _history[key] = (seen, versions.get(node), history)
            _history.move_to_end(key)
        while len(_history) > HISTORY_CACHE_LIMIT:
            _history.popitem(last=False)


def forget_history() -> None:
    """Drop cached histories (tests, and after this process changed a node's record)."""
    with _history_lock:
        _history.clear()


def with_kin(histories: dict[str, NodeHistory],
             kin: Mapping[str, KinRecord]) -> dict[str, NodeHistory]:
    """The histories, each with its node's kin's pooled records, on the type and overall
    (``nodes.kin``)."""
    if not kin:
        return histories
    return {name: dataclasses.replace(h, kin=kin[name].on_type, kin_overall=kin[name].overall)
            if name in kin else h
            for name, h in histories.items()}


def with_records(histories: dict[str, NodeHistory],
                 records: Mapping[str, Record]) -> dict[str, NodeHistory]:
    """The histories, each with its node's whole record on the task type
    (``nodes.records``), the measure of its confidence while its latest episodes agree."""
    if not records:
        return histories
    return {name: dataclasses.replace(h, record=records[name]) if name in records else h
            for name, h in histories.items()}


def place_bid(settings: Settings, announcement: Announcement, profile: NodeProfile,
              version: int | None = None) -> Bid | Refusal:
    """Compute this node's answer to ``announcement`` from its profile and (cached) store history;
    ``version`` is the node's history version (see ``cached_history``)."""
    now = clock.now()
    if refusal_reason(announcement, profile, now) is None:
        kin = kin_records(settings, announcement.task_type, [profile.name])
        history = with_records(with_kin(
            {profile.name: cached_history(settings, profile.name, announcement.task_type, now,
                                          version)}, kin),
            records_of(settings, announcement.task_type, list(kin)))[profile.name]
    else:
        history = NodeHistory()
    return compute_bid(announcement, profile, history, now)


def history_versions(ctx: Context, nodes: Sequence[str]
                     ) -> dict[str, int | None]:
    """The nodes' history versions, in one round trip to the bid board's Redis (None for
    each when the board is the store)."""
    shared = get_board(ctx).redis
    return history_version.read(shared.client if shared is not None else None, nodes)


def history_changed(ctx: Context, node: str) -> None:
    """``node`` finished an attempt: its next bid must read its record afresh. Called before
    Celery stores the result, so a caller that waits on it and announces again is not bid on
    with the record from before. Never raises (a cached history also expires by age)."""
    try:
        shared = get_board(ctx).redis
        history_version.bump(shared.client if shared is not None else None, node)
    except Exception:
        logger.warning("could not mark the history of %s changed", node, exc_info=True)


_ROOMS_OF = (select(Node.name, Node.resources, Node.warm)
             .where(Node.name.in_(bindparam("nodes", expanding=True))))
#: What the nodes' unfinished attempts hold (only rows that hold something have resources).
_RESERVED_OF = (select(AnnouncementRow.assigned_node, AnnouncementRow.resources)
                .where(AnnouncementRow.assigned_node.in_(bindparam("nodes", expanding=True)),
                       AnnouncementRow.state.in_(sorted(states.IN_FLIGHT_STATES)),
                       AnnouncementRow.resources.is_not(None)))


def read_rooms(session: Session, nodes: Sequence[str]) -> dict[str, Room]:
    """Each node's room for a placement (``auction.placement``): its declared resources,
    what its unfinished attempts (ASSIGNED or EXECUTING) reserve, and what it holds warm.
    Read in the award's transaction, after its lock, so that two awards never count the same
    free resources."""
    if not nodes:
        return {}
    names = sorted(set(nodes))
    conn = core(session)
    held: dict[str, list[Mapping[str, float]]] = {}
    for node, needs in conn.execute(_RESERVED_OF, {"nodes": names}).all():
        held.setdefault(str(node), []).append(needs or {})
    return {str(name): Room(totals=dict(totals or {}),
                            reserved=resources.total(held.get(str(name), [])),
                            warm=frozenset(warm or ()))
            for name, totals, warm in conn.execute(_ROOMS_OF, {"nodes": names}).all()}


def rooms_of(settings: Settings, nodes: Sequence[str]) -> dict[str, Room]:
    """``read_rooms`` in a read session of its own."""
    with read_session(settings.database_url) as session:
        return read_rooms(session, nodes)
