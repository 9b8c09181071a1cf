"""Applying a state transition to the store: a compare-and-set, logged as a message.

Every change of a task's state goes through ``transition`` (or ``apply``, which also takes a
path of steps and returns columns). It moves the task only from the states
``states.ALLOWED`` permits (optionally narrowed), and only for the expected attempt and node;
a refused transition is logged as ILLEGAL_TRANSITION with the state it found (STALE_UPDATE when
the task has moved on to another attempt or node meanwhile), never applied.

The statements are Core statements built once per shape (which columns are set, which
conditions apply) and cached, and run on the session's connection (``store.engine.core``):
building an ORM ``update()``, synchronizing the session and the ORM's execution path cost more
than the database work itself.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import pairwise
from typing import Any, Final, cast

from sqlalchemy import (
    ColumnElement,
    Insert,
    Select,
    Table,
    Update,
    bindparam,
    func,
    insert,
    literal,
    select,
    union_all,
    update,
)
from sqlalchemy.orm import Session

from bidding import clock
from bidding.lifecycle import journal, parking, states
from bidding.store.direct import execute
from bidding.store.engine import core
from bidding.store.schema import AnnouncementRow

_TABLE: Final = cast(Table, AnnouncementRow.__table__)
#: What a refused transition reports it found (then the caller's ``returning`` columns).
_FOUND: Final = ("state", "attempt", "assigned_node")

#: What a transition may read back: a column's name, or a labelled expression over the task's
#: row (a scalar subquery, say), so that what goes with the row comes in the same round trip.
Returned = str | ColumnElement[Any]


@dataclass(frozen=True)
class Log:
    """The message a transition logs: its kind, node (default: the expected node), detail and
    time (default: now)."""

    kind: str
    node: str | None = None
    detail: Mapping[str, Any] | None = None
    at: float | None = None


@dataclass(frozen=True)
class Expect:
    """What a transition holds the task to, beyond the source states ``states.ALLOWED``
    permits: narrower source ``states``, its current ``attempt`` and assigned ``node``, and
    its ``due_at`` having come by ``due_by`` (a watchdog's condition: another sweeper may have
    dealt with it meanwhile)."""

    states: Iterable[str] | None = None
    attempt: int | None = None
    node: str | None = None
    due_by: float | None = None


#: No condition beyond the allowed source states.
ANY: Final = Expect()


@dataclass(frozen=True)
class Step:
    """One transition of a path: the target state, its message and the columns it sets."""

    target: str
    log: Log
    values: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Also:
    """A write that rides in a one-statement transition (``apply_alone``): a data-modifying
    statement with RETURNING (it becomes one of the statement's ``WITH`` parts, run whether or
    not the task moves) and its parameters, named apart from the transition's own (``v_``,
    ``t_``, ``m<n>_``)."""

    statement: Update | Insert
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Outcome:
    """What ``apply`` did."""

    moved: bool
    #: Moved: the ``returning`` columns as updated. Refused: the task's state, attempt,
    #: assigned_node and then the ``returning`` columns, as found; None when no such task.
    row: Sequence[Any] | None = None


#: The columns of a task's checking state (``observe.checking``) as a new delegation has them.
WATCH_CLEARED: Final[dict[str, Any]] = {"check_attempts": 0, "next_check_time": None,
                                        "check_since": None, "escalated_at": None,
                                        "escalation": None}


def transition(session: Session, task_id: str, target: str, log: Log, expect: Expect = ANY,
               **values: Any) -> bool:
    """Move ``task_id`` to ``target`` and ``log`` it; False (and logged) when refused.

    ``expect`` narrows when it may move (see :class:`Expect`); ``values`` are the columns to
    set (``attempt=`` included).
    """
    return apply(session, task_id, (Step(target, log, values),), expect, at=log.at).moved


def apply(session: Session, task_id: str, steps: Sequence[Step], expect: Expect = ANY, *,
          at: float | None = None, returning: Sequence[Returned] = ()) -> Outcome:
    """Move ``task_id`` along ``steps`` with one UPDATE, logging one message per step (at
    ``at``, default now).

    ``expect`` holds the first step, exactly as ``transition`` applies it. Each later step
    must be allowed from the one before it (else ValueError): in the same transaction, right
    after the first step, it could not be refused, so the path is what the transitions one
    after the other would do. A refused path is logged as one ILLEGAL_TRANSITION of its first
    step (``returning`` then names columns to read back, see ``Outcome.row``).
    """
    prepared = _prepare(session, task_id, steps, expect, at, returning)
    stmt, params, with_returning = prepared.stmt, prepared.params, prepared.with_returning
    first = steps[0]
    conn = core(session)
    result = execute(conn, stmt, params)  # (on the driver's cursor where it can)
    row: Sequence[Any] | None
    if with_returning:
        row = result.one_or_none()
        moved = row is not None
    else:
        moved = result.rowcount == 1
        row = None
    if moved:
        _expire_loaded(session, task_id)
        if returning and not with_returning:
            row = conn.execute(_select(tuple(returning)), {"t_task_id": task_id}).one()
        journal.write(session, prepared.messages)
        return Outcome(True, row)
    found = conn.execute(_select(_FOUND + tuple(returning)),
                            {"t_task_id": task_id}).one_or_none()
    # Found in another attempt, or with another node, than the caller held: the task moved on
    # (a re-award, a retry), so the caller's change is stale rather than illegal.
    stale = found is not None and (
        (expect.attempt is not None and found[1] != expect.attempt)
        or (expect.node is not None and found[2] != expect.node))
    journal.record(
        session, task_id, journal.STALE_UPDATE if stale else journal.ILLEGAL_TRANSITION,
        node=first.log.node or expect.node,
        attempt=first.values.get("attempt", expect.attempt) or 1, at=prepared.at,
        target=first.target,
        wanted=first.log.kind,
        current=None if found is None else found[0],
        current_attempt=None if found is None else found[1],
        current_node=None if found is None else found[2],
        expected_attempt=expect.attempt, expected_node=expect.node,
    )
    return Outcome(False, found)


def apply_alone(session: Session, task_id: str, steps: Sequence[Step], expect: Expect = ANY, *,
                at: float | None = None, returning: Sequence[Returned] = (),
                also: Sequence[Also] = ()) -> Outcome | None:
    """``apply`` in one statement, for a change with nothing else to write but ``also``, on a
    session whose statements commit on their own (``store.statement_session`` on PostgreSQL):
    the UPDATE and, only if it moved the task, its messages, in one round trip where a
    transaction took four (BEGIN, the UPDATE, the messages' INSERT with the COMMIT). The
    ``also`` writes run in the same statement whether or not the task moves.

    Returns the moved ``Outcome`` (its row: the ``returning`` columns as updated), or None when
    the task did not move: the caller then runs ``apply`` in a transaction, which finds why
    and logs the refusal (its UPDATE is refused again; the refused path is the rare one).
    """
    keys = tuple(returning) or ("task_id",)
    prepared = _prepare(session, task_id, steps, expect, at, keys)
    stmt = _with_messages(prepared.stmt, len(prepared.messages), keys,
                          tuple(write.statement for write in also))
    params = dict(prepared.params)
    for n, message in enumerate(prepared.messages):
        params.update({f"m{n}_{name}": value for name, value in message.items()})
    for write in also:
        params.update(write.params)
    row = execute(core(session), stmt, params).one_or_none()
    if row is None:
        return None
    return Outcome(True, row if returning else None)


@lru_cache(maxsize=64)
def _with_messages(update_stmt: Update, count: int, returning: tuple[Returned, ...],
                   also: tuple[Update | Insert, ...] = ()) -> Select[Any]:
    """``WITH [also_<n> AS (each of ``also``),] moved AS (the UPDATE ... RETURNING), logged AS
    (INSERT the messages, one row each per moved row, in order) SELECT the returning columns
    FROM moved``. (PostgreSQL runs a WITH's statements together, each to its end whether or
    not it is read: the messages are one INSERT, ordered.)

    The ``also`` writes run before the task's row is locked: the UPDATE's condition reads
    each of them (a count, always true), so PostgreSQL runs them first, where an unread one
    would run after the main statement. An award locks its nodes' rows before the task's; an
    attempt's end that counts its node's record must take them in the same order, or the two
    can deadlock."""
    table = journal.MESSAGES
    writes = [write.cte(f"also_{n}") for n, write in enumerate(also)]
    for write in writes:
        update_stmt = update_stmt.where(
            select(func.count()).select_from(write).scalar_subquery() >= 0)
    moved = update_stmt.cte("moved")
    columns = ("task_id", "kind", "node", "attempt", "detail", "at")
    given = union_all(*(
        select(*(bindparam(f"m{n}_{name}", type_=table.c[name].type).label(name)
                 for name in columns), literal(n).label("n")).select_from(moved)
        for n in range(count))).subquery("given")
    logged = insert(table).from_select(
        list(columns), select(*(given.c[name] for name in columns)).order_by(given.c.n))
    return select(*(moved.c[_name(item)] for item in returning)).add_cte(logged.cte("logged"))


@dataclass(frozen=True)
class _Prepared:
    """A transition's UPDATE, its parameters and the messages it logs if it moves the task."""

    stmt: Update
    params: dict[str, Any]
    with_returning: bool
    messages: list[dict[str, Any]]
    at: float


def _prepare(session: Session, task_id: str, steps: Sequence[Step], expect: Expect,
             at: float | None, returning: Sequence[Returned]) -> _Prepared:
    """Check ``steps`` and build their UPDATE (``apply``'s rules)."""
    if not steps:
        raise ValueError("a transition needs at least one step")
    first = steps[0]
    allowed = states.sources(first.target)
    if expect.states is not None:
        narrowed = frozenset(expect.states)
        if not narrowed <= allowed:
            raise ValueError(f"{sorted(narrowed - allowed)} -> {first.target} is not a transition")
        allowed = narrowed
    values: dict[str, Any] = dict(first.values)
    for before, step in pairwise(steps):
        if not states.can_transition(before.target, step.target):
            raise ValueError(f"{before.target} -> {step.target} is not a transition")
        values.update(step.values)
    if steps[-1].target == states.ASSIGNED:
        # A new delegation (an award, a move to the next-best bidder): seed 002's checking
        # state belongs to the delegation, so its watch starts again from this award (an
        # escalation of the node that lost it must not hold the new one back for 30 minutes).
        values = {**WATCH_CLEARED, **values}
    # The task moves on: what a sweeper's scan failed on was about where it was (parking).
    values = {**parking.CLEARED, **values}
    at = clock.now() if at is None else at
    # (Pending ORM rows are flushed by ``core`` as the statement runs: its autoflush.)
    dialect = session.get_bind().dialect
    with_returning = bool(returning) and dialect.update_returning
    stmt = _update(tuple(sorted(allowed)), steps[-1].target,
                   (expect.attempt is not None, expect.node is not None,
                    expect.due_by is not None),
                   tuple(sorted(k for k, v in values.items() if v is not None)),
                   tuple(sorted(k for k, v in values.items() if v is None)),
                   tuple(returning) if with_returning else ())
    params: dict[str, Any] = {f"v_{k}": v for k, v in values.items() if v is not None}
    params["t_task_id"] = task_id
    if expect.attempt is not None:
        params["t_attempt"] = expect.attempt
    if expect.node is not None:
        params["t_node"] = expect.node
    if expect.due_by is not None:
        params["t_due"] = expect.due_by
    messages = []
    attempt = expect.attempt
    for step in steps:
        attempt = step.values.get("attempt", attempt)
        messages.append(journal.message(task_id, step.log.kind,
                                        node=step.log.node or expect.node,
                                        attempt=attempt or 1, at=at, **(step.log.detail or {})))
    return _Prepared(stmt, params, with_returning, messages, at)


@lru_cache(maxsize=256)
def _update(allowed: tuple[str, ...], target: str, conditions: tuple[bool, bool, bool],
            keys: tuple[str, ...], nulls: tuple[str, ...],
            returning: tuple[Returned, ...]) -> Update:
    """The UPDATE of one shape: from ``allowed`` to ``target``, held to the task's attempt,
    node and due time as ``conditions`` say, setting ``keys`` (and ``nulls`` to NULL)."""
    by_attempt, by_node, by_due = conditions
    c = _TABLE.c
    # One source state (the usual case) is a plain comparison: an IN is expanded per execution.
    state = c.state == allowed[0] if len(allowed) == 1 else c.state.in_(allowed)
    stmt = update(_TABLE).where(c.task_id == bindparam("t_task_id"), state)
    if by_attempt:
        stmt = stmt.where(c.attempt == bindparam("t_attempt"))
    if by_node:
        stmt = stmt.where(c.assigned_node == bindparam("t_node"))
    if by_due:  # NULL (nothing due) fails it too
        stmt = stmt.where(c.due_at <= bindparam("t_due"))
    # None is SQL NULL (as a literal None in ``values()`` is), also for JSON columns.
    stmt = stmt.values(state=target, **{k: bindparam(f"v_{k}") for k in keys},
                       **dict.fromkeys(nulls))
    if returning:
        stmt = stmt.returning(*(_column(item) for item in returning))
    return stmt


def _column(item: Returned) -> ColumnElement[Any]:
    """A ``returning`` item as a column of the task's row (an expression as it is)."""
    return _TABLE.c[item] if isinstance(item, str) else item


def _name(item: Returned) -> str:
    """A ``returning`` item's name (an expression's label)."""
    return item if isinstance(item, str) else str(getattr(item, "name", item))


@lru_cache(maxsize=64)
def _select(columns: tuple[Returned, ...]) -> Select[Any]:
    return select(*(_column(item) for item in columns)).where(
        _TABLE.c.task_id == bindparam("t_task_id"))


def _expire_loaded(session: Session, task_id: str) -> None:
    """A row of this task loaded in the session reloads the columns the UPDATE changed (what
    an ORM update's session synchronization did)."""
    if session.identity_map:
        loaded = session.identity_map.get(session.identity_key(AnnouncementRow, task_id))
        if loaded is not None:
            session.expire(loaded)
