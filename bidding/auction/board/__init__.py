"""The bid board: where bid requests go to the candidates, and answers wait while an auction is
open; the join that closes it.

Two boards behind one protocol (``protocol.BidBoard``), chosen by ``bidding_bid_board``:

- ``RedisBoard`` (``redis_board.py``), the default when the broker is Redis: an auction's
  answers are one hash, posted and joined with one Lua call each; requests are lists that each
  node's listener thread pops.
- ``StoreBoard`` (``store_board.py``), for any other broker (RabbitMQ): each answer is a bid
  row, inserted with ``bids_received + 1`` in one transaction; requests are kombu messages on
  ``bids.<node>``.

Either way the sweepers close an auction at its deadline with the answers on the board; if the
board is lost (Redis restarted), the auction still closes, with the answers that remain. A
request is a ``bid_request.BidRequest`` on both; an answer is kept as ``answers.py`` says.
"""

from __future__ import annotations

from bidding.auction.board.answers import (
    answer_message,
    bid_row,
    bid_values,
    parse_answer,
    sorted_answers,
    write_answer,
)
from bidding.auction.board.protocol import (
    Answer,
    BidBoard,
    Posted,
    RedisConnections,
    RequestIntake,
)
from bidding.auction.board.redis_board import RedisBoard
from bidding.auction.board.store_board import StoreBoard
from bidding.context import Context

__all__ = [
    "Answer", "BidBoard", "Posted", "RedisBoard", "RedisConnections", "RequestIntake",
    "StoreBoard", "answer_message", "bid_row", "bid_values", "get_board", "parse_answer",
    "redis_url", "sorted_answers", "write_answer",
]


def redis_url(broker_url: str) -> str | None:
    """The redis-py URL of a Celery broker URL, or None when the broker is not Redis."""
    url = broker_url.split(";")[0].strip()
    if url.startswith(("redis://", "rediss://", "unix://")):
        return url
    if url.startswith("redis+socket://"):
        return "unix://" + url[len("redis+socket://"):]
    return None


_boards: dict[tuple[str, str, str], BidBoard] = {}


def get_board(ctx: Context) -> BidBoard:
    """The board ``bidding_bid_board`` names: "auto" (Redis when the broker is Redis, else the
    store), "store", or a Redis URL. One per process and configuration."""
    broker = str(ctx.app.conf.broker_url or "")
    key = (ctx.settings.bid_board, broker, ctx.settings.database_url)
    found = _boards.get(key)
    if found is not None:
        return found
    choice = ctx.settings.bid_board
    board: BidBoard
    if choice == "store":
        board = StoreBoard(ctx.settings.database_url)
    elif choice == "auto":
        url = redis_url(broker)
        board = RedisBoard(url) if url else StoreBoard(ctx.settings.database_url)
    else:
        url = redis_url(choice)
        # Settings admits only "auto", "store" and the URL schemes redis_url accepts.
        assert url is not None
        board = RedisBoard(url)
    _boards[key] = board
    return board
