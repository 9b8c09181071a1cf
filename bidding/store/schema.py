"""The store's tables as typed SQLAlchemy 2 models.

Times are Unix seconds (float) so the same arithmetic works on SQLite and PostgreSQL and the
deadline and heartbeat comparisons need no timezone handling.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Boolean, Dialect, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy import false as sa_false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator, TypeEngine


class JSONDocument(TypeDecorator[Any]):
    """A JSON column: ``JSONB`` on PostgreSQL, ``JSON`` elsewhere.

    The same as ``JSON().with_variant(JSONB(), "postgresql")``, but PostgreSQL's dialect is
    imported only by a process that talks to PostgreSQL: a variant needs its type at import,
    and the dialect costs every node on SQLite 2 MB of memory (bench/RESULTS.md)."""

    impl = JSON
    cache_ok = True
    # JSON's own, which a TypeDecorator does not inherit: the ORM leaves an attribute left
    # unset out of its INSERT, so the column is SQL NULL, not JSON's 'null' (``result IS
    # NULL`` finds a task without a result; an explicit None is JSON's null, as with JSON),
    # and a JSON value is never used as a key.
    should_evaluate_none = True
    hashable = False

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        """``JSONB`` on PostgreSQL (imported here, on first use), ``JSON`` elsewhere."""
        if dialect.name == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            return dialect.type_descriptor(JSONB())
        return dialect.type_descriptor(JSON())


JSONType = JSONDocument()


class Base(DeclarativeBase):
    """Declarative base of every table of the store."""


class Node(Base):
    """A bidder, as last seen through its heartbeat."""

    __tablename__ = "bidding_nodes"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    capabilities: Mapped[list[str]] = mapped_column(JSONType, default=list)
    capacity: Mapped[int] = mapped_column(Integer, default=1)
    price_per_unit: Mapped[float] = mapped_column(Float, default=0.0)
    latency_ms: Mapped[float] = mapped_column(Float, default=0.0)
    trust: Mapped[float] = mapped_column(Float, default=50.0)
    description: Mapped[str] = mapped_column(Text, default="")
    hostname: Mapped[str] = mapped_column(String(255), default="")
    #: "online" while heartbeating, "offline" while its workers lost the broker (coming
    #: back), "stopped" after a clean shutdown.
    status: Mapped[str] = mapped_column(String(16), default="online")
    started_at: Mapped[float] = mapped_column(Float, default=0.0)
    last_heartbeat: Mapped[float] = mapped_column(Float, default=0.0, index=True)
    #: Its finished attempts and how many succeeded (kept with the episodes), so that a caller
    #: can rank candidates by learned trust without reading the episodes.
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    successes: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    #: Its profile's ``[checking]`` table (seed 002's agent-specific backoff), written with the
    #: profile at registration; None: the global ``bidding_*check*`` settings apply.
    checking: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    #: Its profile's own bidder ("package.module:function" or "llm"), None for the built-in
    #: one: announcers in "auto" bid mode bid for a node without one and ask the others.
    bidder: Mapped[str | None] = mapped_column(String(255), nullable=True)
    #: Its profile's ``[resources]`` table (``{"gpu_mem_gb": 24}``), None: it declares none.
    resources: Mapped[dict[str, float] | None] = mapped_column(JSONType, nullable=True)
    #: The items it holds warm: its profile's, and those its task bodies marked since it
    #: started (``bidding.mark_warm``); None: none.
    warm: Mapped[list[str] | None] = mapped_column(JSONType, nullable=True)


class Worker(Base):
    """One worker process serving a node: an incarnation of a Celery node name.

    A node may run several workers (on one host or several), each with its own Celery node name
    (``redfin@host-a``). A worker that starts again under the same name is a new incarnation
    (a new ``boot_id``): the attempts its earlier incarnation held are lost.
    """

    __tablename__ = "bidding_workers"

    #: The Celery node name (``-n``), e.g. ``redfin@host-a``.
    hostname: Mapped[str] = mapped_column(String(255), primary_key=True)
    node: Mapped[str] = mapped_column(String(32), index=True)
    #: This incarnation's id, new at every start of the worker.
    boot_id: Mapped[str] = mapped_column(String(32))
    pid: Mapped[int] = mapped_column(Integer, default=0)
    started_at: Mapped[float] = mapped_column(Float)
    last_heartbeat: Mapped[float] = mapped_column(Float)
    #: Pool processes: how many attempts it runs at once (None: not reported).
    slots: Mapped[int | None] = mapped_column(Integer, nullable=True)
    #: "starting" (registered, not yet beating), "online", "offline" (draining, or its broker
    #: connection lost), or "ended" once a watchdog has handled its end (dead for the TTL, or
    #: replaced by a new incarnation).
    status: Mapped[str] = mapped_column(String(16), default="online")
    #: Ids of the tasks its pool runs now, as of its last heartbeat (what a check of a
    #: delegated task asks the node: is it running that attempt?).
    running: Mapped[list[str] | None] = mapped_column(JSONType, nullable=True)


class AnnouncementRow(Base):
    """One task put up for bidding, and where its auction and execution stand."""

    __tablename__ = "bidding_announcements"

    task_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    task_name: Mapped[str] = mapped_column(String(255))
    task_type: Mapped[str] = mapped_column(String(64), index=True)
    content: Mapped[str] = mapped_column(Text, default="")
    required_skills: Mapped[list[str]] = mapped_column(JSONType, default=list)
    preferred_node: Mapped[str | None] = mapped_column(String(32), nullable=True)
    priority: Mapped[int] = mapped_column(Integer, default=5)
    deadline: Mapped[float | None] = mapped_column(Float, nullable=True)
    budget: Mapped[float | None] = mapped_column(Float, nullable=True)
    strategy: Mapped[str] = mapped_column(String(255))
    #: The announcement as sent to bidders (args, kwargs and every option), JSON.
    spec: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    #: PENDING, BIDDING, ASSIGNED, EXECUTING, SUCCESS, FAILED (see bidding.lifecycle.states).
    state: Mapped[str] = mapped_column(String(16), default="PENDING")
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    candidates: Mapped[list[str]] = mapped_column(JSONType, default=list)
    expected_bids: Mapped[int] = mapped_column(Integer, default=0)
    bids_received: Mapped[int] = mapped_column(Integer, default=0)
    announced_at: Mapped[float] = mapped_column(Float, index=True)
    #: When the bidding window ends; the sweepers close open auctions past it.
    closes_at: Mapped[float] = mapped_column(Float)
    #: When a PENDING (scheduled), RETRYING (backoff) or DEFERRED task is announced again.
    due_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    awarded_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    assigned_node: Mapped[str | None] = mapped_column(String(32), nullable=True)
    winning_bid_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    winning_score: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: "awarded", "fallback" or "failed"; and what closed the auction.
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)
    closed_by: Mapped[str | None] = mapped_column(String(32), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: The latest progress report of the running attempt (AITP 5.3).
    progress: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    #: The worker (Celery node name) and its incarnation that began the current attempt.
    worker: Mapped[str | None] = mapped_column(String(255), nullable=True)
    boot_id: Mapped[str | None] = mapped_column(String(32), nullable=True)
    #: The final outcome as the caller must see it: ``{"value": ...}`` (the task's JSON
    #: result) or ``{"exception": {...}}`` (Celery's JSON form of the error).
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    #: When set, the result backend may lack the final state (its write failed, or the worker
    #: died before it): a sweeper writes it again from the store at this time.
    report_due: Mapped[float | None] = mapped_column(Float, nullable=True, index=True)
    #: Seed 002's watch of an ASSIGNED or EXECUTING task (``bidding.observe.watch``): checks
    #: that found no news since ``check_since`` (the latest award, start, progress report or
    #: reset the watch has seen), and when the next one is due (None: to be scheduled).
    check_attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    next_check_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    check_since: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: Set when the watch escalated the task (a flag for a human, not a state): when and why.
    escalated_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    escalation: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: Passes in a row of a sweeper's scan (closer, announcer, watchdog, watch) that failed on
    #: this task, and, once there were too many, why it is parked: no scan looks at it until
    #: it moves on (any transition clears both) or ``bidding reset`` (``lifecycle.parking``).
    scan_failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    parked: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: When a task that has not started by then never starts (Celery's ``expires``; None:
    #: never). The task's, not an attempt's: a retry due after it does not run.
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: Who created it (AITP ``created_by``): the API's caller, or the call's option.
    created_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    #: What one attempt holds on its node (``{"gpu_mem_gb": 20}``), None: nothing. Summed
    #: over a node's ASSIGNED and RUNNING tasks, it is what the node has reserved.
    resources: Mapped[dict[str, float] | None] = mapped_column(JSONType, nullable=True)
    #: The cost the winning bid estimated (AITP ``estimated_cost``); the actual cost is the
    #: sum of its ledger entries.
    estimated_cost: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        Index("ix_bidding_announcements_node_state", "assigned_node", "state"),
        Index("ix_bidding_announcements_state_closes", "state", "closes_at"),
        Index("ix_bidding_announcements_state_due", "state", "due_at"),
        # Retention: the finished tasks of a final state, oldest first.
        Index("ix_bidding_announcements_state_finished", "state", "finished_at"),
    )


class BidRow(Base):
    """A bid or refusal, with the score the strategy gave it."""

    __tablename__ = "bidding_bids"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("bidding_announcements.task_id", ondelete="CASCADE"), index=True
    )
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    node: Mapped[str] = mapped_column(String(32))
    will_bid: Mapped[bool] = mapped_column(Boolean, default=True)
    reason: Mapped[str] = mapped_column(Text, default="")
    capability: Mapped[float | None] = mapped_column(Float, nullable=True)
    experience: Mapped[float | None] = mapped_column(Float, nullable=True)
    load: Mapped[float | None] = mapped_column(Float, nullable=True)
    confidence: Mapped[float | None] = mapped_column(Float, nullable=True)
    cost: Mapped[float | None] = mapped_column(Float, nullable=True)
    latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    trust: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: The full bid as the node sent it (pydantic JSON).
    payload: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    #: The strategy's total for this bid and its breakdown (terms, multipliers, eligibility).
    score: Mapped[float | None] = mapped_column(Float, nullable=True)
    breakdown: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    is_winner: Mapped[bool] = mapped_column(Boolean, default=False)
    #: True when the bid arrived after its auction had closed.
    late: Mapped[bool] = mapped_column(Boolean, default=False)
    bid_at: Mapped[float] = mapped_column(Float)
    #: What the bidder expects the attempt to cost and take (None: it did not say).
    estimated_cost: Mapped[float | None] = mapped_column(Float, nullable=True)
    estimated_duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class Episode(Base):
    """The outcome of one attempt: where experience and learned trust come from."""

    __tablename__ = "bidding_episodes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(64), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    node: Mapped[str] = mapped_column(String(32))
    task_type: Mapped[str] = mapped_column(String(64))
    skills: Mapped[list[str]] = mapped_column(JSONType, default=list)
    success: Mapped[bool] = mapped_column(Boolean)
    duration_s: Mapped[float] = mapped_column(Float, default=0.0)
    cost: Mapped[float] = mapped_column(Float, default=0.0)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    finished_at: Mapped[float] = mapped_column(Float)
    #: Lost with its node or worker (killed, restarted, silent, never started it), not failed
    #: by the body: it counts in the node's record (trust), not in its experience of the type.
    lost: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sa_false())
    #: What the winning bid claimed (kept here: bids are pruned sooner than episodes), so that
    #: a node's claims can be compared with what then happened (None: no claim was made).
    claimed_confidence: Mapped[float | None] = mapped_column(Float, nullable=True)
    estimated_cost: Mapped[float | None] = mapped_column(Float, nullable=True)
    estimated_duration_s: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (
        Index("ix_bidding_episodes_node_type", "node", "task_type", "finished_at"),
        Index("uq_bidding_episodes_attempt", "task_id", "attempt", "node", unique=True),
    )


class NodeRecord(Base):
    """A node's record on one task type: its finished attempts of that type and how many
    succeeded (lost ones left out, as in its experience), kept with its episodes, so that an
    announcer can rank many nodes by what they did on the type at hand with one read."""

    __tablename__ = "bidding_node_records"

    node: Mapped[str] = mapped_column(String(32), primary_key=True)
    task_type: Mapped[str] = mapped_column(String(64), primary_key=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    successes: Mapped[int] = mapped_column(Integer, default=0)


class Tag(Base):
    """One tag of a task (AITP ``metadata.tags``): a row per tag, so that tasks are found by
    tag with an index on every database."""

    __tablename__ = "bidding_tags"

    task_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("bidding_announcements.task_id", ondelete="CASCADE"),
        primary_key=True)
    tag: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)


class Message(Base):
    """One protocol event (ANNOUNCED, BID, REFUSED, AWARDED, TASK_ACCEPTED, ...)."""

    __tablename__ = "bidding_messages"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(64), index=True)
    kind: Mapped[str] = mapped_column(String(32), index=True)
    node: Mapped[str | None] = mapped_column(String(32), nullable=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    detail: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    at: Mapped[float] = mapped_column(Float)


class LedgerEntry(Base):
    """One attempt's cost against the task's budget (AITP 7.2)."""

    __tablename__ = "bidding_ledger"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(64), index=True)
    attempt: Mapped[int] = mapped_column(Integer, default=1)
    node: Mapped[str] = mapped_column(String(32))
    units: Mapped[float] = mapped_column(Float, default=0.0)
    price_per_unit: Mapped[float] = mapped_column(Float, default=0.0)
    total: Mapped[float] = mapped_column(Float, default=0.0)
    at: Mapped[float] = mapped_column(Float)

    __table_args__ = (
        Index("uq_bidding_ledger_attempt", "task_id", "attempt", "node", unique=True),
    )


class Graph(Base):
    """An AITP task decomposed into subtasks (``bidding.graphs``): its definition and outcome."""

    __tablename__ = "bidding_graphs"

    graph_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    name: Mapped[str] = mapped_column(String(255))
    #: The validated task definition (``bidding.graphs.spec.TaskDefinition``), JSON.
    spec: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    #: The input values it runs with (the input schema's defaults filled in).
    input: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    #: PENDING (waiting for the tasks it depends on), EXECUTING, COMPLETED or FAILED.
    state: Mapped[str] = mapped_column(String(16), default="EXECUTING")
    cost_limit: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[float] = mapped_column(Float)
    #: Last time a step of it moved (a sweeper looks at graphs left alone for a while).
    touched_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: The task's result (JSON object) once COMPLETED.
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: The subtask whose failure failed the task.
    failed_step: Mapped[str | None] = mapped_column(String(64), nullable=True)

    __table_args__ = (Index("ix_bidding_graphs_state_touched", "state", "touched_at"),)


class GraphStep(Base):
    """One subtask of a graph; ``task_id`` is its bidding task (an announcement once started)."""

    __tablename__ = "bidding_graph_steps"

    graph_id: Mapped[str] = mapped_column(
        String(64), ForeignKey("bidding_graphs.graph_id", ondelete="CASCADE"), primary_key=True)
    step_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, default=0)
    name: Mapped[str] = mapped_column(String(255), default="")
    capability: Mapped[str] = mapped_column(String(255))
    task_name: Mapped[str] = mapped_column(String(255))
    task_id: Mapped[str] = mapped_column(String(64), unique=True)
    #: PENDING (not started), RUNNING (announced), SUCCESS, FAILED or CANCELLED (never started:
    #: the task failed).
    state: Mapped[str] = mapped_column(String(16), default="PENDING")
    #: The resolved input it was announced with.
    input: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    #: Its output as downstream sees it (after its output_mapping).
    output: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    announced_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    #: The budget it was announced with: its share of the task's cost_limit (None: no limit).
    budget: Mapped[float | None] = mapped_column(Float, nullable=True)


class Job(Base):
    """A federation-wide periodic job (the retention prune): when it is next due, and who
    ran it last. One node runs each time: the one whose compare-and-set on ``due_at`` moves
    it on first."""

    __tablename__ = "bidding_jobs"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    due_at: Mapped[float] = mapped_column(Float)
    #: The worker (Celery node name) that ran it last, when it started and what it did.
    last_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    last_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_result: Mapped[dict[str, Any] | None] = mapped_column(JSONType, nullable=True)
    #: How many times it ran.
    runs: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class MetricTotal(Base):
    """A counter's part that retention pruned from the message log (``lifecycle.tallies``):
    the counter is this plus what the log still holds."""

    __tablename__ = "bidding_metric_totals"

    #: The sample's name, e.g. ``bidding_awards_total``.
    sample: Mapped[str] = mapped_column(String(96), primary_key=True)
    #: Its labels as sorted ``name=value`` pairs joined by commas (``node=north``).
    labels: Mapped[str] = mapped_column(String(255), primary_key=True)
    value: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
