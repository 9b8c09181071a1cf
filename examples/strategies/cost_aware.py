"""A custom selection strategy that reads the figures bidders attach to their bids: among the
bids whose bidder expects to use at most ``max_tokens`` tokens, the most confident wins (all
bids when none is affordable). Registered under a name so that every node can build it."""

from collections.abc import Mapping, Sequence

import bidding
from bidding import Announcement, Bid, NodeCapability


class CostAwareStrategy:
    """Select based on estimated token cost."""

    def __init__(self, max_tokens: int = 1000):
        self.max_tokens = max_tokens

    async def select(
        self,
        bids: Sequence[Bid],
        announcement: Announcement,
        capabilities: Mapping[str, NodeCapability],
    ) -> Bid | None:
        """The most confident bid within the token budget."""
        # Filter by token budget (if bidders provide estimates)
        affordable = [
            b for b in bids
            if b.metadata.get("estimated_tokens", 0) <= self.max_tokens
        ]
        if not affordable:
            affordable = list(bids)  # Fallback to all if none affordable

        # Among affordable, pick highest confidence
        return max(affordable, key=lambda b: b.confidence) if affordable else None


bidding.register_strategy("cost_aware", lambda: CostAwareStrategy(max_tokens=500))
