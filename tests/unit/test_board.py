"""Which bid board a configuration gets (no broker: nothing here connects)."""

from __future__ import annotations

import pytest
from celery import Celery

from bidding.auction.board import RedisBoard, StoreBoard, get_board, redis_url
from bidding.config import load_settings
from bidding.errors import ConfigurationError


@pytest.mark.parametrize(("broker", "expected"), [
    ("redis://127.0.0.1:6379/9", "redis://127.0.0.1:6379/9"),
    ("rediss://h:6380/0", "rediss://h:6380/0"),
    ("redis+socket:///tmp/redis.sock", "unix:///tmp/redis.sock"),
    ("redis://a:6379/0;redis://b:6379/0", "redis://a:6379/0"),
    ("amqp://guest:guest@127.0.0.1:5672//", None),
    ("memory://", None),
])
def test_the_redis_url_of_a_broker_url(broker: str, expected: str | None) -> None:
    assert redis_url(broker) == expected


def app_with(broker: str) -> Celery:
    return Celery("t", broker=broker, set_as_current=False)


def test_auto_uses_redis_when_the_broker_is_redis_and_the_store_otherwise() -> None:
    settings = load_settings({"bidding_database_url": "sqlite:////tmp/x.db"}, environ={})
    assert isinstance(get_board(settings, app_with("redis://127.0.0.1:1/0")), RedisBoard)
    assert isinstance(get_board(settings, app_with("amqp://guest@127.0.0.1//")), StoreBoard)


def test_the_board_can_be_forced_to_the_store_or_to_another_redis() -> None:
    store = load_settings({"bidding_bid_board": "store"}, environ={})
    assert isinstance(get_board(store, app_with("redis://127.0.0.1:1/0")), StoreBoard)
    other = load_settings({"bidding_bid_board": "redis://127.0.0.1:2/3"}, environ={})
    board = get_board(other, app_with("amqp://guest@127.0.0.1//"))
    assert isinstance(board, RedisBoard) and board.url == "redis://127.0.0.1:2/3"


def test_a_bad_board_setting_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match="bidding_bid_board"):
        load_settings({"bidding_bid_board": "postgres://x"}, environ={})
