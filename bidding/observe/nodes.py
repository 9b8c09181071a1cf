"""``bidding nodes`` and ``GET /aitp/nodes``: every node the store knows, its declared profile,
whether it is alive now, its load, its learned trust, the attempts it won and its success rate,
and how its bids' claims compare with what then happened (``observe.calibration``)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from pydantic import BaseModel
from sqlalchemy import func, or_, select
from sqlalchemy.orm import Session

from bidding import clock
from bidding.auction.history import read_rooms
from bidding.auction.placement import Room
from bidding.auction.scores import learned_trust
from bidding.config import Settings
from bidding.lifecycle import states
from bidding.observe.calibration import Calibration, Claimed, calibrate
from bidding.observe.stats import collect
from bidding.store import ensure_schema, read_session
from bidding.store.schema import AnnouncementRow, Episode, Node

#: The latest attempts per node with a claim that its calibration is computed over.
CALIBRATION_WINDOW = 200


class NodeView(BaseModel):
    """One node as the store sees it."""

    name: str
    capabilities: list[str]
    capacity: int
    price_per_unit: float
    latency_ms: float
    #: The profile's trust, and the one its bids carry (moved toward its success rate).
    trust: float
    learned_trust: float
    #: "online", "offline" (lost its broker, coming back) or "stopped"; ``live``: online with a
    #: heartbeat within ``bidding_heartbeat_ttl`` (a candidate for auctions now).
    status: str
    live: bool
    last_heartbeat: float
    #: Tasks it holds now (ASSIGNED or EXECUTING), and that against its capacity (0-1+).
    in_flight: int
    load: float
    #: Attempts awarded to it (``bidding stats``' wins).
    tasks_won: int
    #: Its finished attempts, how many succeeded, and their ratio (None before the first).
    attempts: int
    successes: int
    success_rate: float | None
    #: Its profile's own bidder ("package.module:function" or "llm"); None: the built-in one
    #: (announcers in "auto" bid mode bid for it; they ask the others).
    bidder: str | None = None
    #: Its latest attempts' claims (the winning bids' confidence, estimated cost and
    #: duration) against their outcomes, over up to ``CALIBRATION_WINDOW`` attempts.
    calibration: Calibration = Calibration()
    #: Its declared resources (its profile's ``[resources]`` table), what its unfinished
    #: attempts hold of them, and what is left free.
    resources: dict[str, float] = {}
    reserved: dict[str, float] = {}
    free: dict[str, float] = {}
    #: The items it holds warm (its profile's, and those its task bodies marked).
    warm: list[str] = []


def claimed_attempts(session: Session, window: int = CALIBRATION_WINDOW
                     ) -> dict[str, list[Claimed]]:
    """Each node's latest ``window`` finished attempts whose bid claimed something, newest
    first (attempts lost with their worker left out: no verdict on the work)."""
    latest = (
        select(Episode.node, Episode.success, Episode.cost, Episode.duration_s,
               Episode.claimed_confidence, Episode.estimated_cost,
               Episode.estimated_duration_s,
               func.row_number().over(partition_by=Episode.node,
                                      order_by=Episode.finished_at.desc()).label("n"))
        .where(Episode.lost.is_(False),
               or_(Episode.claimed_confidence.is_not(None), Episode.estimated_cost.is_not(None),
                   Episode.estimated_duration_s.is_not(None)))
        .subquery())
    found: dict[str, list[Claimed]] = defaultdict(list)
    for row in session.execute(select(latest).where(latest.c.n <= window)
                               .order_by(latest.c.node, latest.c.n)):
        found[row.node].append(Claimed(
            success=bool(row.success), cost=float(row.cost or 0.0),
            duration_s=float(row.duration_s or 0.0), claimed_confidence=row.claimed_confidence,
            estimated_cost=row.estimated_cost, estimated_duration_s=row.estimated_duration_s))
    return found


def _room_fields(room: Room | None) -> dict[str, Any]:
    if room is None:
        return {}
    return {"resources": dict(room.totals), "reserved": dict(room.reserved),
            "free": room.free, "warm": sorted(room.warm)}


def node_views(settings: Settings, now: float | None = None) -> list[NodeView]:
    """Every node in the store, by name."""
    now = clock.now() if now is None else now
    ensure_schema(settings.database_url)
    with read_session(settings.database_url) as session:
        nodes = session.scalars(select(Node).order_by(Node.name)).all()
        in_flight = {str(node): int(count) for node, count in session.execute(
            select(AnnouncementRow.assigned_node, func.count())
            .where(AnnouncementRow.state.in_(states.IN_FLIGHT_STATES))
            .group_by(AnnouncementRow.assigned_node)).all()}
        claims = claimed_attempts(session)
        rooms = read_rooms(session, [n.name for n in nodes])
        views = [
            NodeView(
                name=n.name, capabilities=list(n.capabilities), capacity=n.capacity,
                price_per_unit=n.price_per_unit, latency_ms=n.latency_ms, trust=n.trust,
                learned_trust=learned_trust(n.trust, n.successes, n.attempts),
                status=n.status,
                live=n.status == "online" and n.last_heartbeat >= now - settings.heartbeat_ttl,
                last_heartbeat=n.last_heartbeat,
                in_flight=int(in_flight.get(n.name, 0)),
                load=int(in_flight.get(n.name, 0)) / max(1, n.capacity),
                tasks_won=0, attempts=n.attempts, successes=n.successes,
                success_rate=n.successes / n.attempts if n.attempts else None,
                bidder=n.bidder, calibration=calibrate(claims.get(n.name, ())),
                **_room_fields(rooms.get(n.name)))
            for n in nodes
        ]
    wins = {s.node: s.wins for s in collect(settings.database_url).nodes}
    return [v.model_copy(update={"tasks_won": wins.get(v.name, 0)}) for v in views]
