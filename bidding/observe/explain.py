"""``bidding.explain(task_id)``: every bid of a task's auction, its score breakdown, the winner."""

from __future__ import annotations

import logging
from typing import Any

from celery import Celery
from pydantic import BaseModel
from sqlalchemy import func, select

from bidding import clock
from bidding.auction.board import get_board
from bidding.auction.history import read_rooms
from bidding.auction.placement import Room
from bidding.config import get_settings
from bidding.context import Context
from bidding.errors import ConfigurationError, UnknownTaskError
from bidding.lifecycle import journal, states
from bidding.lifecycle.plugins import plugins_of
from bidding.models import DEFAULT_PRIORITY, Bid, priority_label
from bidding.observe.attempts import AttemptView, attempt_history, exclusion_reason
from bidding.observe.status import watch_of
from bidding.observe.watch import WatchView
from bidding.observe.why import why_won
from bidding.store import ensure_schema, read_session, store_label
from bidding.store.schema import AnnouncementRow, BidRow, LedgerEntry, Message

logger = logging.getLogger(__name__)


class BidView(BaseModel):
    """One bid or refusal as the award saw it."""

    node: str
    attempt: int
    will_bid: bool
    reason: str = ""
    capability: float | None = None
    experience: float | None = None
    load: float | None = None
    confidence: float | None = None
    cost: float | None = None
    latency_ms: float | None = None
    trust: float | None = None
    score: float | None = None
    breakdown: dict[str, Any] = {}
    is_winner: bool = False
    late: bool = False
    #: Milliseconds from the announcement to this answer.
    answered_after_ms: float
    #: How the node would do the task (its bidder's, or the built-in summary of its offer).
    proposal: str = ""
    #: Why its own bidder bid so (a refusal's is its ``reason``).
    reasoning: str = ""
    #: The node's own bidder that judged this answer (None: the built-in bidder alone).
    bidder: str | None = None
    #: Tokens, requests, cost the bidder's model reported (an LLM bidder).
    usage: dict[str, float] = {}
    #: What the bid claims the attempt will cost and take (None: it did not say), and its
    #: free-form figures (a bidder's ``metadata``, e.g. ``estimated_tokens``).
    estimated_cost: float | None = None
    estimated_duration_s: float | None = None
    metadata: dict[str, Any] = {}


class MessageView(BaseModel):
    """One entry of the task's message log."""

    kind: str
    node: str | None
    attempt: int
    at: float
    detail: dict[str, Any]


class Explanation(BaseModel):
    """Why a task went where it went."""

    task_id: str
    task_name: str
    task_type: str
    state: str
    strategy: str
    required_skills: list[str]
    preferred_node: str | None
    #: 0-9, higher is more urgent.
    priority: int = DEFAULT_PRIORITY
    candidates: list[str]
    winner: str | None
    winning_score: float | None
    outcome: str | None
    closed_by: str | None
    error: str | None
    announced_at: float
    awarded_at: float | None
    #: Milliseconds from announcement to award (seed 000's assignment latency).
    assignment_ms: float | None
    bids: list[BidView]
    messages: list[MessageView]
    #: Each attempt: its node(s), how it ended and why.
    attempts: list[AttemptView] = []
    #: The attempt the task is in (or ended in); ``winner``, ``error`` and the bid table of
    #: the text report are this attempt's.
    attempt: int = 1
    #: Seed 002's watch while the task is delegated: checks without news, an escalation.
    watch: WatchView | None = None
    #: Why the winner won and what kept each other candidate out, in sentences (this
    #: attempt's auction; ``observe.why``).
    why: list[str] = []
    #: The proposal of the bid the task's node won it with (this attempt's): the approach the
    #: body ran under (``bidding.current_award().proposal``); None without a winning bid.
    proposal: str | None = None
    #: What the body did, as stored: ``{"value": ...}`` (returned) or ``{"exception":
    #: {"exc_type", "exc_module", "exc_message"}}`` (raised); None while it has not ended.
    result: dict[str, Any] | None = None
    #: Options the coordinator's rules set because the call did not, each with why
    #: (``bidding_skill_keywords``, ``bidding_preferred_nodes``).
    inferred: dict[str, str] = {}
    #: The cost the winning bid estimated (None: no award, or it did not say) and the actual
    #: cost so far (the ledger's sum over every attempt).
    estimated_cost: float | None = None
    actual_cost: float = 0.0
    #: What one attempt holds on its node, and the items it asked to find warm; each bid's
    #: ``fit`` and ``warm`` multipliers say how its node's room weighed (``auction.placement``).
    resources: dict[str, float] = {}
    affinity: list[str] = []
    #: For a task that needs resources or warm items: each of this attempt's bidders' room
    #: now (``declared``, ``reserved``, ``free`` and ``warm``), read when explain runs.
    rooms: dict[str, dict[str, Any]] = {}

    def render(self) -> str:
        """A plain-text report for terminals."""
        lines = [
            f"task {self.task_id}  {self.task_name}  type={self.task_type}  state={self.state}"
            f"  priority {priority_label(self.priority)}",
            f"  required skills: {', '.join(self.required_skills) or '-'}"
            f"   preferred node: {self.preferred_node or '-'}   strategy: {self.strategy}",
            *(f"  {option.replace('_', ' ')} inferred: {why}"
              for option, why in self.inferred.items()),
            *([f"  needs: {', '.join(f'{k} {v:g}' for k, v in sorted(self.resources.items()))}"]
              if self.resources else []),
            *([f"  warm wanted: {', '.join(self.affinity)}"] if self.affinity else []),
            *(f"  {node} now: {_room_line(room)}" for node, room in sorted(self.rooms.items())),
            f"  candidates: {', '.join(self.candidates) or '(none)'}",
        ]
        if len(self.attempts) > 1 or (self.attempts and self.attempts[0].error):
            lines.append("  attempts:")
            for a in self.attempts:
                lines.append(f"    {a.line()}")
                lines += [f"      left out {node}: {why}" for node, why in a.excluded.items()]
        # A retried or re-announced task: say which attempt the winner and bids are of.
        label = f"attempt {self.attempt} " if self.attempt > 1 else ""
        if self.winner:
            lines.append(
                f"  {label}winner: {self.winner} ({self.outcome}, score "
                f"{_num(self.winning_score)}) closed by {self.closed_by} after "
                f"{_num(self.assignment_ms, 1)} ms"
            )
        elif self.closed_by:
            lines.append(f"  {label}no winner ({self.closed_by}): {self.error}")
        elif self.error:
            lines.append(f"  {label}error: {self.error}")
        lines += _award_lines(self)
        lines += [f"  why: {w}" for w in self.why]
        if self.estimated_cost is not None or self.actual_cost:
            estimated = "-" if self.estimated_cost is None else f"{self.estimated_cost:.4f}"
            lines.append(f"  cost: estimated {estimated} by the winning bid, actual "
                         f"{self.actual_cost:.4f} (the ledger)")
        if self.watch is not None and (self.watch.escalated or self.watch.check_attempts):
            lines.append(f"  watch: {self.watch.line(clock.now())}")
        shown = [b for b in self.bids if b.attempt == self.attempt]
        earlier = len(self.bids) - len(shown)
        if self.attempt > 1:
            lines.append(
                f"  bids of attempt {self.attempt}"
                + (f" ({earlier} of earlier attempts in --json)" if earlier else "") + ":")
        lines.append(
            f"  {'node':<10} {'score':>6} {'cap':>5} {'exp':>5} {'load':>5} {'conf':>5} "
            f"{'cost':>7} {'lat':>5} {'trust':>5}  breakdown / reason"
        )
        for b in sorted(shown, key=lambda b: (not b.is_winner, -(b.score or -1), b.node)):
            mark = "*" if b.is_winner else " "
            if not b.will_bid:
                late = "late (after close) " if b.late else ""
                lines.append(f" {mark}{b.node:<10} refused: {late}{b.reason}")
                lines += _bidder_lines(b)
                continue
            detail = _breakdown_text(b.breakdown)
            if b.late:
                detail = "late (after close) " + detail
            lines.append(
                f" {mark}{b.node:<10} {_num(b.score):>6} {_num(b.capability, 2):>5} "
                f"{_num(b.experience, 2):>5} {_num(b.load, 2):>5} {_num(b.confidence, 2):>5} "
                f"{_num(b.cost, 4):>7} {_num(b.latency_ms, 0):>5} {_num(b.trust, 0):>5}  {detail}"
            )
            lines += _bidder_lines(b)
        return "\n".join(lines)


#: Characters of a result shown in the text report (all of it is in --json).
_SHOWN = 200


def _award_lines(e: Explanation) -> list[str]:
    """The winner's proposal next to what the body did with it."""
    if not e.winner or e.proposal is None:
        return []
    lines = [f"  proposal: {e.proposal or '(none)'}"]
    if e.result is not None and "value" in e.result:
        shown = repr(e.result["value"])
        cut = f"... ({len(shown)} characters)" if len(shown) > _SHOWN else ""
        lines.append(f"  result: returned {shown[:_SHOWN]}{cut}")
    elif e.result is not None and isinstance(e.result.get("exception"), dict):
        raised = e.result["exception"]
        message = " ".join(str(m) for m in raised.get("exc_message") or [])
        lines.append(f"  result: raised {raised.get('exc_type')}: {message}")
    elif e.state == states.EXECUTING:
        lines.append("  result: (the body is running)")
    return lines


def _bidder_lines(b: BidView) -> list[str]:
    """What a node's own bidder said, under its bid or refusal (nothing for built-in ones)."""
    if b.bidder is None:
        return []
    lines = [f"{'':13}by its bidder {b.bidder}"
             + (f" ({_usage_text(b.usage)})" if b.usage else "")]
    if b.will_bid:
        if b.proposal:
            lines.append(f"{'':13}proposal: {b.proposal}")
        if b.reasoning:
            lines.append(f"{'':13}reasoning: {b.reasoning}")
        claims = [f"cost {b.estimated_cost:g}" if b.estimated_cost is not None else "",
                  f"{b.estimated_duration_s:g} s" if b.estimated_duration_s is not None else ""]
        if any(claims):
            lines.append(f"{'':13}estimates: {', '.join(c for c in claims if c)}")
    return lines


def _usage_text(usage: dict[str, float]) -> str:
    return ", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in usage.items())


def _num(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _breakdown_text(breakdown: dict[str, Any]) -> str:
    if not breakdown:
        return ""
    if not breakdown.get("eligible", True):
        return f"ineligible: {breakdown.get('reason', '')}"
    # A term that takes from the score (the busy slots' share) reads "- slot_share 0.114".
    terms = " ".join(f"{'-' if v < 0 else '+' if i else ''} {k} {abs(v):.3f}".strip()
                     for i, (k, v) in enumerate(breakdown.get("terms", {}).items()))
    mult = " ".join(f"x{v:g} {k}" for k, v in breakdown.get("multipliers", {}).items())
    reason = breakdown.get("reason") or ""
    return " ".join(p for p in (terms, mult, f"({reason})" if reason else "") if p)


def _before_read(app: Celery, database_url: str, task_id: str) -> None:
    """Let the app's plug-ins bring the task's rows up to date before they are read (the
    write-behind journal writes a pending award, so that explain shows it)."""
    settings = get_settings(app)
    if settings.database_url != database_url:
        return
    for plugin in plugins_of(Context(settings, app)):
        plugin.before_read(task_id)


def explain(task_id: str, app: Celery | None = None, *,
            database_url: str | None = None) -> Explanation:
    """The award of ``task_id``: all bids with their scores, the winner, the strategy, timings.

    Pass the Celery ``app`` (its ``bidding_database_url`` is used) or a ``database_url``.
    """
    if database_url is None:
        if app is None:
            raise ConfigurationError("explain: pass app= or database_url=")
        database_url = get_settings(app).database_url
    ensure_schema(database_url)
    if app is not None:
        _before_read(app, database_url, task_id)
    with read_session(database_url) as session:
        row = session.get(AnnouncementRow, task_id)
        if row is None:
            raise UnknownTaskError(
                f"task {task_id}: no such announcement in the store {store_label(database_url)}"
                " (a finished task is pruned after bidding_retention_days)")
        bids = session.scalars(
            select(BidRow).where(BidRow.task_id == task_id).order_by(BidRow.id)
        ).all()
        messages = session.scalars(
            select(Message).where(Message.task_id == task_id).order_by(Message.id)
        ).all()
        spent = session.scalar(select(func.sum(LedgerEntry.total))
                               .where(LedgerEntry.task_id == task_id))
        # Each attempt's auction starts at its own ANNOUNCED message (a retry's much later
        # than the row's first announcement): answer times and latency count from there.
        starts = {m.attempt: m.at for m in messages if m.kind == journal.ANNOUNCED}
        started = starts.get(row.attempt, row.announced_at)
        views = [bid_view(b, starts.get(b.attempt, row.announced_at)) for b in bids]
        if row.state == states.BIDDING and app is not None:
            views.extend(_pending(app, task_id, row.attempt, started))
        current = [v for v in views if v.attempt == row.attempt]
        moved = [m for m in messages if m.kind == journal.REAWARDED and m.attempt == row.attempt]
        attempts = attempt_history(messages)
        needs, affinity = dict(row.resources or {}), list((row.spec or {}).get("affinity") or [])
        rooms = ({node: _room_view(room) for node, room in read_rooms(
            session, sorted({v.node for v in current})).items()}
            if needs or affinity else {})
        excluded = _excluded(attempts, row)
        why = why_won(current, winner=row.assigned_node, outcome=row.outcome, error=row.error,
                      candidates=list(row.candidates), state=row.state,
                      moved_from=_moved_from(moved[-1].detail) if moved else None,
                      excluded=excluded)
        return Explanation(
            task_id=row.task_id,
            task_name=row.task_name,
            task_type=row.task_type,
            state=row.state,
            strategy=row.strategy,
            required_skills=list(row.required_skills),
            preferred_node=row.preferred_node,
            priority=row.priority,
            resources=needs,
            affinity=affinity,
            rooms=rooms,
            candidates=list(row.candidates),
            winner=row.assigned_node,
            winning_score=row.winning_score,
            outcome=row.outcome,
            closed_by=row.closed_by,
            error=row.error,
            announced_at=row.announced_at,
            awarded_at=row.awarded_at,
            assignment_ms=(row.awarded_at - started) * 1000 if row.awarded_at else None,
            bids=views,
            messages=[
                MessageView(kind=m.kind, node=m.node, attempt=m.attempt, at=m.at,
                            detail=dict(m.detail or {}))
                for m in messages
            ],
            attempts=attempts,
            attempt=row.attempt,
            watch=watch_of(row),
            why=why,
            proposal=_proposal_of(current, row.assigned_node),
            result=dict(row.result) if row.result is not None else None,
            inferred={str(k): str(v)
                      for k, v in ((row.spec or {}).get("inferred") or {}).items()},
            estimated_cost=row.estimated_cost,
            actual_cost=float(spent or 0.0),
        )


def _excluded(attempts: list[AttemptView], row: AnnouncementRow) -> dict[str, str]:
    """The nodes the current attempt's auction was to leave out, each with why. From its
    ANNOUNCED message; for a store written before that message said so, from the row's
    announcement (which is the current attempt's), filled into ``attempts`` too."""
    current = next((a for a in attempts if a.attempt == row.attempt), None)
    if current is None:
        return {}
    if not current.excluded:
        exclude = (row.spec or {}).get("exclude_nodes") or []
        earlier = [a for a in attempts if a.attempt < row.attempt]
        current.excluded = {str(n): exclusion_reason(str(n), earlier) for n in exclude}
    return current.excluded


def _proposal_of(bids: list[BidView], node: str | None) -> str | None:
    """The proposal of ``node``'s bid among this attempt's (the one the body runs under, also
    after a move to the next-best bidder), or None."""
    mine = [b for b in bids if b.node == node and b.will_bid and not b.late]
    return mine[-1].proposal if mine else None


def bid_view(b: BidRow, announced_at: float) -> BidView:
    """A stored bid row as ``explain`` shows it; ``announced_at`` is its auction's start."""
    return BidView(
        node=b.node, attempt=b.attempt, will_bid=b.will_bid, reason=b.reason,
        capability=b.capability, experience=b.experience, load=b.load,
        confidence=b.confidence, cost=b.cost, latency_ms=b.latency_ms,
        trust=b.trust, score=b.score, breakdown=dict(b.breakdown or {}),
        is_winner=b.is_winner, late=b.late,
        answered_after_ms=(b.bid_at - announced_at) * 1000,
        **_judged(b.payload or {}),
    )


def _moved_from(detail: dict[str, Any] | None) -> tuple[str, str] | None:
    """(node, reason) of a REAWARDED message's detail."""
    d = detail or {}
    return (str(d["from"]), str(d.get("reason") or "")) if d.get("from") else None


def _judged(payload: dict[str, Any]) -> dict[str, Any]:
    """The proposal, reasoning, bidder, usage, estimates and metadata of a stored answer (its
    JSON payload)."""
    return {"proposal": str(payload.get("proposal") or ""),
            "reasoning": str(payload.get("reasoning") or ""),
            "bidder": payload.get("bidder"),
            "usage": dict(payload.get("usage") or {}),
            "estimated_cost": payload.get("estimated_cost"),
            "estimated_duration_s": payload.get("estimated_duration_s"),
            "metadata": dict(payload.get("metadata") or {})}


def _pending(app: Celery, task_id: str, attempt: int, announced_at: float) -> list[BidView]:
    """Answers of an open auction that are still on a Redis bid board (not scored yet)."""
    board = get_board(Context(get_settings(app), app))
    if not board.writes_on_award:
        return []
    try:
        answers = board.peek(task_id, attempt)
    except Exception:  # explain still shows what the store knows
        logger.warning("bid board unavailable: open auction %s shown without its answers",
                       task_id, exc_info=True)
        return []
    views = []
    for a in answers:
        common: dict[str, Any] = {"node": a.node, "attempt": a.attempt,
                                  "answered_after_ms": (a.bid_at - announced_at) * 1000,
                                  **_judged(a.model_dump())}
        if isinstance(a, Bid):
            views.append(BidView(will_bid=True, capability=a.capability,
                                 experience=a.experience, load=a.load,
                                 confidence=a.confidence, cost=a.cost,
                                 latency_ms=a.latency_ms, trust=a.trust, **common))
        else:
            views.append(BidView(will_bid=False, reason=a.reason, **common))
    return views


def _room_view(room: Room) -> dict[str, Any]:
    return {"declared": dict(room.totals), "reserved": dict(room.reserved),
            "free": room.free, "warm": sorted(room.warm)}


def _room_line(room: dict[str, Any]) -> str:
    held = ", ".join(f"{name} {room['free'].get(name, 0):g}/{total:g} free"
                     for name, total in sorted(room["declared"].items())) or "no resources"
    return held + (f"; warm: {', '.join(room['warm'])}" if room["warm"] else "")
