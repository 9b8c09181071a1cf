"""Episodes: the outcome record of each attempt (node, task type, success, duration, cost), and
each node's running record of attempts and successes; the source of experience and learned
trust. An attempt's episode also keeps what its node's bid claimed (confidence, estimated cost
and duration), copied from the bid as the attempt ends, so that claims and outcomes can be
compared after the bids are pruned.
"""

from __future__ import annotations

from functools import cache
from typing import Any, Final, cast

from sqlalchemy import (
    Insert,
    Integer,
    ScalarSelect,
    Table,
    Update,
    bindparam,
    case,
    literal,
    select,
    true,
    update,
)
from sqlalchemy.orm import Session
from sqlalchemy.sql.schema import ScalarElementColumnDefault

from bidding.lifecycle.transition import Also
from bidding.store.direct import execute
from bidding.store.engine import core
from bidding.store.once import insert_once
from bidding.store.schema import BidRow, Episode, LedgerEntry, Node, NodeRecord

_NODES: Final = cast(Table, Node.__table__)
_EPISODES: Final = cast(Table, Episode.__table__)
_LEDGER: Final = cast(Table, LedgerEntry.__table__)
_RECORDS: Final = cast(Table, NodeRecord.__table__)
# Core, not ORM: an ORM UPDATE first works out which loaded objects to refresh.
_RECORD = (update(_NODES).where(_NODES.c.name == bindparam("node"))
           .values(attempts=_NODES.c.attempts + 1,
                   successes=_NODES.c.successes + bindparam("won", type_=Integer)))


def _adding_to_record(stmt: Any) -> Any:
    """``stmt`` (a dialect's ``INSERT`` into the records per type, for its ``ON CONFLICT``)
    adding to a node's row on the type when there is one."""
    return stmt.on_conflict_do_update(
        index_elements=[_RECORDS.c.node, _RECORDS.c.task_type],
        set_={"attempts": _RECORDS.c.attempts + stmt.excluded.attempts,
              "successes": _RECORDS.c.successes + stmt.excluded.successes})


_RECORD_COLUMNS: Final = {name: bindparam(name, type_=_RECORDS.c[name].type)
                          for name in ("node", "task_type", "attempts", "successes")}


@cache
def _typed(dialect: str) -> Any:
    """The dialect's statement adding an episode to a node's record on its type (the dialect's
    own ``INSERT``, imported here: a process on SQLite never loads PostgreSQL's, 2 MB)."""
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert as postgresql_insert

        return _adding_to_record(postgresql_insert(_RECORDS).values(_RECORD_COLUMNS))
    if dialect != "sqlite":
        raise ValueError(f"no record statement for the {dialect!r} dialect")
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return _adding_to_record(sqlite_insert(_RECORDS).values(_RECORD_COLUMNS))


def count_episode(session: Session, node: str, success: bool, task_type: str | None = None,
                  lost: bool = False) -> None:
    """Add one finished attempt to ``node``'s record, and (``task_type`` given, the attempt
    not lost with its worker) to its record on that type (call once per new episode row)."""
    conn = core(session)
    # On the driver's cursor (``store.direct``): an attempt's completion runs them.
    execute(conn, _RECORD, {"node": node, "won": int(success)})
    if task_type is not None and not lost:
        typed = {"node": node, "task_type": task_type, "attempts": 1, "successes": int(success)}
        execute(conn, _typed(conn.dialect.name), typed)


def record_episode(session: Session, values: dict[str, Any]) -> None:
    """Store an attempt's episode once (a redelivery, or a sweep racing the node, keeps the
    first) and count a new one in its node's records."""
    if insert_once(session, _EPISODES, values, report=True):
        count_episode(session, values["node"], bool(values["success"]), values["task_type"],
                      bool(values.get("lost", False)))


#: The episode's columns copied from its node's bid, and the bid's column each comes from.
CLAIMS: Final = {"claimed_confidence": BidRow.confidence,
                 "estimated_cost": BidRow.estimated_cost,
                 "estimated_duration_s": BidRow.estimated_duration_s}


def _claim_of(column: Any, task_id: Any, attempt: Any, node: Any) -> ScalarSelect[Any]:
    """The node's bid of the attempt's auction, one ``column`` of it (the winner's bid; after
    a move to the next-best bidder, that bidder's own)."""
    return (select(column)
            .where(BidRow.task_id == task_id, BidRow.attempt == attempt, BidRow.node == node,
                   BidRow.will_bid.is_(True), BidRow.late.is_(False))
            .order_by(BidRow.id.desc()).limit(1).scalar_subquery())


_CLAIMS_OF = select(*(
    _claim_of(column, bindparam("task_id"), bindparam("attempt"), bindparam("node")).label(name)
    for name, column in CLAIMS.items()))


def claims(session: Session, task_id: str, attempt: int, node: str) -> dict[str, Any]:
    """What ``node``'s bid for ``task_id``'s ``attempt`` claimed, as episode columns (each
    None when there is no such bid, or it did not say)."""
    row = core(session).execute(_CLAIMS_OF, {"task_id": task_id, "attempt": attempt,
                                       "node": node}).one()
    return dict(row._mapping)


def record_attempt(session: Session, charge: dict[str, Any] | None,
                   episode: dict[str, Any]) -> None:
    """An attempt's ledger entry (``charge``, if any) and episode, each stored once, and the
    episode counted in its node's record if it is new: ``insert_once`` of the entry and
    ``record_episode``, in one statement on PostgreSQL (three round trips were most of an
    attempt's completion there; bench/latency.py's phase table)."""
    dialect = session.get_bind().dialect.name
    if dialect == "sqlite":
        if charge is not None:
            insert_once(session, _LEDGER, charge)
        # The episode and the bid's claims copied into it in one statement, stored once.
        episode = {**_DEFAULTS[_EPISODES.name], **episode}
        stored = execute(core(session), _episode_with_claims(tuple(episode)),
                         {f"e_{k}": v for k, v in episode.items()}).one_or_none()
        if stored is not None:
            count_episode(session, episode["node"], bool(episode["success"]),
                          episode["task_type"], bool(episode.get("lost", False)))
        return
    if dialect != "postgresql":
        if charge is not None:
            insert_once(session, _LEDGER, charge)
        record_episode(session, {**episode, **claims(session, episode["task_id"],
                                                     episode["attempt"], episode["node"])})
        return
    execute(core(session), *_recorded(charge, episode))


def attempt_writes(charge: dict[str, Any] | None, episode: dict[str, Any]) -> Also:
    """``record_attempt``'s writes on PostgreSQL (the entry and the episode each once, the
    node's records counting a new episode), as a part of a larger statement: an attempt's end
    in one round trip with its transition (``transition.apply_alone``)."""
    stmt, params = _recorded(charge, episode)
    return Also(_returning_node(stmt), params)


def _recorded(charge: dict[str, Any] | None,
              episode: dict[str, Any]) -> tuple[Update, dict[str, Any]]:
    """PostgreSQL's ``record_attempt`` statement, and its parameters."""
    # Every column is given: SQLAlchemy fills Python-side defaults in a top-level INSERT only.
    episode = {**_DEFAULTS[_EPISODES.name], **episode}
    params = {f"e_{k}": v for k, v in episode.items()}
    if charge is not None:
        charge = {**_DEFAULTS[_LEDGER.name], **charge}
        params.update({f"l_{k}": v for k, v in charge.items()})
    return _record_attempt(tuple(episode), tuple(charge or ())), params


@cache
def _returning_node(stmt: Update) -> Update:
    # (A WITH's part is a statement with RETURNING.)
    return stmt.returning(_NODES.c.name)


def _scalar_defaults(table: Table) -> dict[str, Any]:
    return {c.name: c.default.arg for c in table.columns
            if isinstance(c.default, ScalarElementColumnDefault)}


_DEFAULTS: Final = {t.name: _scalar_defaults(t) for t in (_EPISODES, _LEDGER)}


@cache
def _episode_with_claims(episode: tuple[str, ...]) -> Insert:
    """SQLite's ``INSERT INTO episodes SELECT <the episode>, <the bid's claims> ON CONFLICT DO
    NOTHING RETURNING id``: the claims need no read of their own, and the key comes back only
    when the episode is new (a redelivery, or a sweep racing the node, keeps the first)."""
    claimed = {name: _claim_of(column, bindparam("e_task_id"), bindparam("e_attempt"),
                               bindparam("e_node"))
               for name, column in CLAIMS.items() if name not in episode}
    given = select(*(bindparam(f"e_{c}", type_=_EPISODES.c[c].type).label(c) for c in episode),
                   *(value.label(name) for name, value in claimed.items()))
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    # SQLite reads "ON CONFLICT" after a SELECT without a WHERE as a join's ON.
    return (sqlite_insert(_EPISODES)
            .from_select([*episode, *claimed], given.where(true()))
            .on_conflict_do_nothing()
            .returning(*_EPISODES.primary_key.columns))


@cache
def _record_attempt(episode: tuple[str, ...], charge: tuple[str, ...]) -> Update:
    """``WITH charged AS (INSERT ledger ... ON CONFLICT DO NOTHING), recorded AS (INSERT
    episode ... ON CONFLICT DO NOTHING RETURNING node, success) UPDATE nodes ...``: the
    record counts the episode only if ``recorded`` has it (it was not stored before)."""
    from sqlalchemy.dialects.postgresql import insert as postgresql_insert

    # The bid's claims are copied by the same statement (no round trip of their own).
    claimed = {name: _claim_of(column, bindparam("e_task_id"), bindparam("e_attempt"),
                               bindparam("e_node"))
               for name, column in CLAIMS.items() if name not in episode}
    recorded = (postgresql_insert(_EPISODES)
                .values({**{c: bindparam(f"e_{c}", type_=_EPISODES.c[c].type)
                            for c in episode}, **claimed})
                .on_conflict_do_nothing()
                .returning(_EPISODES.c.node, _EPISODES.c.success, _EPISODES.c.task_type,
                           _EPISODES.c.lost)
                .cte("recorded"))
    won = select(case((recorded.c.success, 1), else_=0)).scalar_subquery()
    # The node's record on the task type, in the same statement (lost attempts left out).
    typed = _adding_to_record(postgresql_insert(_RECORDS).from_select(
        ["node", "task_type", "attempts", "successes"],
        select(recorded.c.node, recorded.c.task_type, literal(1),
               case((recorded.c.success, 1), else_=0)).where(recorded.c.lost.is_(False))
    )).cte("typed")
    stmt = (update(_NODES).where(_NODES.c.name == select(recorded.c.node).scalar_subquery())
            .values(attempts=_NODES.c.attempts + 1, successes=_NODES.c.successes + won)
            .add_cte(typed))
    if charge:
        charged = (postgresql_insert(_LEDGER)
                   .values({c: bindparam(f"l_{c}", type_=_LEDGER.c[c].type) for c in charge})
                   .on_conflict_do_nothing()
                   .cte("charged"))
        stmt = stmt.add_cte(charged)
    return stmt
