"""``bidding nodes`` and ``GET /aitp/nodes``: every node the store knows, its declared profile,
whether it is alive now, its load, its learned trust, the attempts it won and its success rate."""

from __future__ import annotations

from pydantic import BaseModel
from sqlalchemy import func, select

from bidding import clock
from bidding.auction.scores import learned_trust
from bidding.config import Settings
from bidding.lifecycle import states
from bidding.observe.stats import collect
from bidding.store import ensure_schema, read_session
from bidding.store.schema import AnnouncementRow, Node


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
                bidder=n.bidder)
            for n in nodes
        ]
    wins = {s.node: s.wins for s in collect(settings.database_url).nodes}
    return [v.model_copy(update={"tasks_won": wins.get(v.name, 0)}) for v in views]
