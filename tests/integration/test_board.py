"""The Redis bid board against a real Redis: the join, the close, late answers, requests."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from celery import Celery

from bidding.auction.bid_request import BidRequest
from bidding.auction.board import RedisBoard
from bidding.auction.board.redis_board import WAKE
from bidding.auction.history import history_changed, history_versions
from bidding.config import load_settings
from bidding.context import Context
from bidding.models import Announcement, Bid, Refusal
from bidding.nodes import history_version
from tests.conftest import REDIS_DB, REDIS_URL, require

pytestmark = pytest.mark.integration

URL = f"{REDIS_URL}/{REDIS_DB + 3}"


@pytest.fixture
def board() -> Iterator[RedisBoard]:
    try:
        redis.Redis.from_url(URL).ping()
        ok, why = True, ""
    except redis.RedisError as exc:
        ok, why = False, str(exc)
    require("Redis", ok, why)
    yield RedisBoard(URL)
    redis.Redis.from_url(URL).flushdb()


def bid(task: str, node: str, at: float) -> Bid:
    return Bid(task_id=task, node=node, attempt=1, skills=["x"], capability=1.0,
               experience=0.3, load=1.0, confidence=0.5, cost=0.0, latency_ms=10, trust=70,
               recent_failures=0, in_flight=0, capacity=1, bid_at=at)


def test_the_last_expected_answer_completes_the_auction(board: RedisBoard) -> None:
    # given an auction that asked two nodes
    task = str(uuid.uuid4())
    # when both answer
    first = board.post(bid(task, "a", 2.0), expected=2, window=1.0)
    second = board.post(Refusal(task_id=task, node="b", attempt=1, reason="busy", bid_at=1.0),
                        expected=2, window=1.0)
    # then only the second answer completes it, and closing returns both, oldest first
    assert (first.received, first.complete, first.late) == (1, False, False)
    assert (second.received, second.complete, second.late) == (2, True, False)
    answers = board.close(task, 1)
    assert [(type(a).__name__, a.node) for a in answers] == [("Refusal", "b"), ("Bid", "a")]


def test_an_answer_after_the_close_is_late_and_every_closer_sees_the_same_answers(
    board: RedisBoard,
) -> None:
    # given an auction closed with one answer in
    task = str(uuid.uuid4())
    board.post(bid(task, "a", 1.0), expected=3, window=1.0)
    closed = board.close(task, 1)
    # when another node answers, and a duplicate closer closes again
    late = board.post(bid(task, "b", 2.0), expected=3, window=1.0)
    again = board.close(task, 1)
    # then the answer is late, and both closers decided on the same single bid
    assert late.late and not late.complete
    assert [a.node for a in closed] == [a.node for a in again] == ["a"]
    assert board.peek(task, 1)[0].node == "a"


def test_attempts_of_a_task_have_separate_boards(board: RedisBoard) -> None:
    # given the first attempt closed
    task = str(uuid.uuid4())
    board.post(bid(task, "a", 1.0), expected=1, window=1.0)
    board.close(task, 1)
    # when its retry (attempt 2) is answered
    retry = bid(task, "b", 2.0).model_copy(update={"attempt": 2})
    posted = board.post(retry, expected=1, window=1.0)
    # then the retry's auction is open and complete on its own
    assert posted.complete and not posted.late
    assert [a.node for a in board.close(task, 2)] == ["b"]


#: The Redis board's requests travel on Redis: the app's broker carries none of them.
APP = Celery("board-test", set_as_current=False)


def request(node: str, n: int) -> BidRequest:
    announcement = Announcement(task_id=f"t{n}", task_name="t.work", task_type="work")
    return BidRequest(announcement=announcement, node=node, expires_at=time.time() + 60)


def pop(board: RedisBoard, node: str) -> tuple[str, int | None] | None:
    taken = board.next_request(node, 0.1)
    return None if taken is None else (taken.announcement.task_id, taken.history_version)


def test_requests_reach_each_node_oldest_first_with_its_history_version(
    board: RedisBoard,
) -> None:
    # given node a that has finished two attempts
    history_version.bump(board.client, "a")
    history_version.bump(board.client, "a")
    # when two requests are sent to node a and one to node b
    board.send_requests(APP, [request("a", 1), request("b", 2)], ttl=0.5)
    board.send_requests(APP, [request("a", 3)], ttl=0.5)
    # then each node gets its own, oldest first, with its history version, and nothing else
    assert pop(board, "a") == ("t1", 2)
    assert pop(board, "a") == ("t3", 2)
    assert pop(board, "b") == ("t2", 0)
    assert pop(board, "a") is None


def test_a_request_carries_the_history_version_its_node_has_when_it_takes_it(
    board: RedisBoard,
) -> None:
    # given a request waiting for node a
    board.send_requests(APP, [request("a", 1)], ttl=5.0)
    # when node a finishes an attempt before it takes the request
    history_version.bump(board.client, "a")
    # then the request carries the new version: a history cached before it is stale
    assert pop(board, "a") == ("t1", 1)


def test_requests_nobody_pops_expire(board: RedisBoard) -> None:
    # given a request for a node that is dead
    board.send_requests(APP, [request("dead", 4)], ttl=0.2)
    # when its ttl passes, then it is gone (a dead node's list does not grow)
    time.sleep(0.4)
    assert board.next_request("dead", 0.05) is None


def test_finishing_an_attempt_changes_the_nodes_history_version(board: RedisBoard) -> None:
    # given a node's history version, kept in the Redis of the bid board
    settings = load_settings({"bidding_bid_board": URL}, environ={})
    before = history_versions(Context(settings, APP), ["a"])["a"]
    # when it finishes an attempt
    history_changed(Context(settings, APP), "a")
    # then the version moved (cached histories of it are stale), and other nodes' did not
    assert history_versions(Context(settings, APP), ["a", "b"]) == {"a": (before or 0) + 1, "b": 0}


def test_a_short_windows_request_does_not_expire_a_longer_ones(board: RedisBoard) -> None:
    # given a request with a long window waiting for node a
    board.send_requests(APP, [request("a", 1)], ttl=5.0)
    # when a request with a much shorter window is pushed behind it
    board.send_requests(APP, [request("a", 2)], ttl=0.2)
    time.sleep(0.4)
    # then both are still there for the node (the list's expiry only ever grows)
    assert pop(board, "a") == ("t1", 0)
    assert pop(board, "a") == ("t2", 0)


def test_a_node_answers_its_requests_on_its_listeners_thread_and_drops_an_unreadable_one(
    board: RedisBoard,
) -> None:
    # given a request nobody can read, then a good one, waiting for node a
    board.client.lpush(board.requests_key("a"), b"not a request")
    board.send_requests(APP, [request("a", 1)], ttl=5.0)
    answered: list[tuple[str, str]] = []
    handed_over: list[BidRequest] = []
    # when node a takes its requests
    intake = board.consume_requests(
        "a", answer_here=lambda r: answered.append(
            (r.announcement.task_id, threading.current_thread().name)),
        hand_over=handed_over.append)
    consumers = intake.start(None)
    try:
        deadline = time.monotonic() + 5
        while not answered and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        intake.stop()
    # then the good one was answered on the listener's own thread (no kombu consumer, no
    # hand-over), and the unreadable one was dropped
    assert consumers == [] and handed_over == []
    assert answered == [("t1", "bid-requests-a")]
    assert board.next_request("a", 0.05) is None


def test_a_listener_waiting_for_requests_stops_at_once_and_leaves_the_next_request_waiting(
    board: RedisBoard, caplog: pytest.LogCaptureFixture,
) -> None:
    # given node a's listener waiting for a request (a long blocking pop: an idle listener
    # wakes rarely)
    answered: list[str] = []
    intake = board.consume_requests("a", answer_here=lambda r: answered.append(
        r.announcement.task_id), hand_over=answered.append)
    intake.start(None)
    key = board.requests_key("a")
    db = str(board.client.connection_pool.connection_kwargs.get("db", 0))

    def blocked() -> bool:
        return any(c.get("cmd") == "brpop" and str(c.get("db")) == db
                   for c in board.client.client_list())

    assert wait_until(blocked, 5)
    # when the node stops
    began = time.monotonic()
    intake.stop()
    # then the listener returned at once, woken (not at the end of its 5 s wait), having
    # answered nothing, and took the wake-up for no request (no "malformed" error)
    assert time.monotonic() - began < 2.0
    assert answered == []
    assert "malformed" not in caplog.text
    # (a wake-up pushed just as the listener left its pop stays, for the next listener to
    # skip: at most that one)
    assert board.client.lrange(key, 0, -1) in ([], [WAKE])
    # and a request sent afterwards waits for the node's next listener
    board.send_requests(APP, [request("a", 1)], ttl=5.0)
    taken = [board.next_request("a", 0.5) for _ in range(2)]
    assert [(t.announcement.task_id, t.history_version) for t in taken if t] == [("t1", 0)]


def wait_until(predicate: Callable[[], bool], seconds: float) -> bool:
    """Whether ``predicate`` became true within ``seconds``."""
    deadline = time.monotonic() + seconds
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True
