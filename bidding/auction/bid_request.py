"""A bid request: what an auction asks one candidate, in the one JSON form every bid board
carries (the Redis board's lists, the store board's kombu queues) (pure).

``BidRequest.to_json`` writes it and ``BidRequest.from_json`` reads it; nothing else does. The
announcement is what the node's bidder may see of it (``request_view.bidder_view``): when that
left anything out, the request is ``partial`` and the node that closes the auction reads the
whole announcement from the store. ``history_version`` is the node's history version
(``nodes.history_version``) as the board read it when the node took the request: the announcer
sends none (a node of the previous version then reads its own), and the store board has none.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from bidding.models import Announcement


class BidRequest(BaseModel):
    """One candidate's bid request. Fields the reader does not know are ignored, so that a
    newer announcer's request still reaches an older node."""

    model_config = ConfigDict(frozen=True)

    #: The announcement as the node's bidder may see it.
    announcement: Announcement
    #: The candidate asked to bid.
    node: str
    #: When the auction's window ends (the store's clock): a request taken later is dropped
    #: unread (0: never).
    expires_at: float = 0.0
    #: How many answers the auction waits for, so that the answer that completes it closes
    #: it (0: not said).
    expected: int = 0
    #: ``announcement`` is the bidder's view, not the whole announcement.
    partial: bool = False
    #: The node's history version when it took the request (None: not tracked).
    history_version: int | None = None

    def to_json(self) -> str:
        """The request's JSON, as every board carries it."""
        return self.model_dump_json()

    @classmethod
    def from_json(cls, raw: str | bytes, history_version: int | None = None) -> BidRequest:
        """The request ``raw`` is the JSON of; ``history_version``: the node's, as the board
        read it when the node took the request (it replaces any the request carried).

        Raises ``pydantic.ValidationError``, naming the field, when ``raw`` is not a request.
        """
        request = cls.model_validate_json(raw)
        if history_version is not None:
            request = request.model_copy(update={"history_version": history_version})
        return request
