"""The Redis bid board against a real Redis: the join, the close, late answers, requests."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator

import pytest
import redis

from bidding.auction.board import RedisBoard
from bidding.models import Bid, Refusal
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


def pop(board: RedisBoard, node: str) -> dict[str, int] | None:
    raw = board.next_request(node, 0.1)
    return None if raw is None else json.loads(raw)


def test_requests_reach_each_node_oldest_first_stamped_with_its_history_version(
    board: RedisBoard,
) -> None:
    # given node a that has finished two attempts
    board.bump_history("a")
    board.bump_history("a")
    # when two requests are sent to node a and one to node b
    board.request({"a": '{"n": 1}', "b": '{"n": 2}'}, ttl=0.5)
    board.request({"a": '{"n": 3}'}, ttl=0.5)
    # then each node gets its own, oldest first, with its history version, and nothing else
    assert pop(board, "a") == {"n": 1, "history_version": 2}
    assert pop(board, "a") == {"n": 3, "history_version": 2}
    assert pop(board, "b") == {"n": 2, "history_version": 0}
    assert pop(board, "a") is None


def test_requests_nobody_pops_expire(board: RedisBoard) -> None:
    # given a request for a node that is dead
    board.request({"dead": '{"n": 4}'}, ttl=0.2)
    # when its ttl passes, then it is gone (a dead node's list does not grow)
    time.sleep(0.4)
    assert board.next_request("dead", 0.05) is None


def test_finishing_an_attempt_changes_the_nodes_history_version(board: RedisBoard) -> None:
    # given a node's history version
    before = board.history_version("a")
    # when it finishes an attempt
    board.bump_history("a")
    # then the version moved (cached histories of it are stale), and other nodes' did not
    assert board.history_version("a") != before
    assert board.history_version("b") == 0


def test_a_short_windows_request_does_not_expire_a_longer_ones(board: RedisBoard) -> None:
    # given a request with a long window waiting for node a
    board.request({"a": '{"n": 1}'}, ttl=5.0)
    # when a request with a much shorter window is pushed behind it
    board.request({"a": '{"n": 2}'}, ttl=0.2)
    time.sleep(0.4)
    # then both are still there for the node (the list's expiry only ever grows)
    assert pop(board, "a") == {"n": 1, "history_version": 0}
    assert pop(board, "a") == {"n": 2, "history_version": 0}
