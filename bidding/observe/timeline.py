"""Assignments per node over time (``GET /aitp/timeline``, the dashboard's chart): every award
of an attempt to a node (AWARDED, or REAWARDED to the next-best bidder), counted in equal time
buckets, so a node's share of the work can be followed as it changes."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel
from sqlalchemy import func, select

from bidding import clock
from bidding.lifecycle import journal
from bidding.store import ensure_schema, read_session
from bidding.store.schema import Message

#: Without ``since``, the chart starts at the first assignment of at most this long ago.
DEFAULT_SPAN = 3600.0
#: The most buckets one read returns.
MAX_BUCKETS = 500


class Bucket(BaseModel):
    """Assignments that fell in ``[start, start + bucket_seconds)``, by node."""

    start: float
    counts: dict[str, int]


class Timeline(BaseModel):
    """Assignments per node in equal buckets from ``since`` to ``until`` (Unix times)."""

    since: float
    until: float
    bucket_seconds: float
    #: Every node that was assigned something in the window, by name.
    nodes: list[str]
    buckets: list[Bucket]


def bucket_counts(events: Iterable[tuple[str, float]], since: float, until: float,
                  buckets: int) -> Timeline:
    """Count (node, time) events in ``buckets`` equal buckets of ``[since, until]`` (pure)."""
    buckets = max(1, min(buckets, MAX_BUCKETS))
    until = max(until, since)
    # A zero-length window still has buckets (empty ones), each a millisecond wide.
    width = max((until - since) / buckets, 0.001)
    counts: list[dict[str, int]] = [{} for _ in range(buckets)]
    nodes: set[str] = set()
    for node, at in events:
        if not since <= at <= until:
            continue
        index = min(buckets - 1, int((at - since) / width))
        counts[index][node] = counts[index].get(node, 0) + 1
        nodes.add(node)
    return Timeline(since=since, until=until, bucket_seconds=width, nodes=sorted(nodes),
                    buckets=[Bucket(start=since + i * width, counts=c)
                             for i, c in enumerate(counts)])


def assignments_over_time(database_url: str, since: float | None = None,
                          until: float | None = None, buckets: int = 30,
                          now: float | None = None) -> Timeline:
    """Assignments per node from ``since`` (default: the first one in the last hour) to
    ``until`` (default: the latest one, so a burst that ended a while ago still fills the
    chart; it grows as new ones come)."""
    now = clock.now() if now is None else now
    kinds = (journal.AWARDED, journal.REAWARDED)
    ensure_schema(database_url)
    with read_session(database_url) as session:
        if since is None:
            first = session.scalar(select(func.min(Message.at)).where(
                Message.kind.in_(kinds), Message.at >= now - DEFAULT_SPAN))
            since = now if first is None else float(first)
        window = [Message.kind.in_(kinds), Message.node.is_not(None), Message.at >= since]
        if until is not None:
            window.append(Message.at <= until)
        events = [(str(n), float(at)) for n, at in session.execute(
            select(Message.node, Message.at).where(*window)).all()]
    if until is None:
        until = max((at for _, at in events), default=since)
    return bucket_counts(events, since, until, buckets)
