"""Which bid board a configuration gets (no broker: nothing here connects but the memory
transport), and the store board's bid requests."""

from __future__ import annotations

import uuid

import pytest
from celery import Celery

from bidding.auction.bid_request import BidRequest
from bidding.auction.board import RedisBoard, StoreBoard, get_board, redis_url
from bidding.auction.history import history_changed, history_versions
from bidding.config import load_settings
from bidding.context import Context
from bidding.errors import ConfigurationError
from bidding.models import Announcement


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
    assert isinstance(get_board(Context(settings, app_with("redis://127.0.0.1:1/0"))), RedisBoard)
    assert isinstance(
        get_board(Context(settings, app_with("amqp://guest@127.0.0.1//"))), StoreBoard
    )


def test_the_board_can_be_forced_to_the_store_or_to_another_redis() -> None:
    store = load_settings({"bidding_bid_board": "store"}, environ={})
    assert isinstance(get_board(Context(store, app_with("redis://127.0.0.1:1/0"))), StoreBoard)
    other = load_settings({"bidding_bid_board": "redis://127.0.0.1:2/3"}, environ={})
    board = get_board(Context(other, app_with("amqp://guest@127.0.0.1//")))
    assert isinstance(board, RedisBoard) and board.url == "redis://127.0.0.1:2/3"


def test_a_bad_board_setting_is_refused_naming_it() -> None:
    with pytest.raises(ConfigurationError, match="bidding_bid_board"):
        load_settings({"bidding_bid_board": "postgres://x"}, environ={})


# --- the store board's requests: kombu messages on bids.<node> ----------------------------


def rfp_for(task_id: str) -> Announcement:
    return Announcement(task_id=task_id, task_name="demo.work", task_type="analysis")


def test_the_store_board_sends_each_candidate_its_request_and_the_node_takes_its_own(
    store_url: str,
) -> None:
    # given the store board of a federation whose broker is not Redis, and an auction that
    # asks nodes a and b
    app = app_with("memory://")
    board = StoreBoard(store_url)
    a, b = f"a-{uuid.uuid4().hex[:8]}", f"b-{uuid.uuid4().hex[:8]}"
    announcement = rfp_for(str(uuid.uuid4()))
    requests = [
        BidRequest(
            announcement=announcement,
            node=n,
            expires_at=announcement.announced_at + 60,
            expected=2,
        )
        for n in (a, b)
    ]
    answered_here: list[BidRequest] = []
    handed_over: list[BidRequest] = []
    # when the requests are sent and node b takes its own, in Celery's event loop
    board.send_requests(app, requests, ttl=announcement.window + 1.0)
    intake = board.consume_requests(
        b, answer_here=answered_here.append, hand_over=handed_over.append
    )
    with app.connection_for_read() as conn:
        for consumer in intake.start(conn.default_channel):
            consumer.consume()
        conn.drain_events(timeout=5)
        with pytest.raises(TimeoutError):
            conn.drain_events(timeout=0.2)
    intake.stop()
    # then b got its request as it was sent, handed over to a bid thread (the event loop
    # must not wait for a bid), and nothing else
    assert handed_over == [requests[1]] and answered_here == []


def test_a_board_that_is_not_redis_keeps_no_history_versions(store_url: str) -> None:
    # given the store board
    settings = load_settings({"bidding_database_url": store_url}, environ={})
    app = app_with("memory://")
    board = get_board(Context(settings, app))
    # when a node finishes an attempt
    history_changed(Context(settings, app), "a")
    # then there is no Redis to keep versions in, and no node has one (every bid reads the
    # node's history afresh)
    assert board.redis is None
    assert history_versions(Context(settings, app), ["a", "b"]) == {"a": None, "b": None}
