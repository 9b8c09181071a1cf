"""Review item h: a node's queues are bounded. A bid request arriving while its bid threads
have ``bidding_bid_queue_size`` requests waiting, or a call to its own bidder while that
bidder's threads have as many waiting, is refused at once, saying the node is overloaded (a
bid never raises, and a refusal has its reason). SQLite and PostgreSQL stores, no broker."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
from celery import Celery

from bidding.auction import consumer
from bidding.auction.bid_request import BidRequest
from bidding.auction.bidder import NodeBidder
from bidding.auction.board import StoreBoard
from bidding.auction.consumer import BidThreads
from bidding.config import Settings
from bidding.lifecycle import states as lifecycle
from bidding.models import Announcement, Bid, Refusal
from bidding.nodes.profile import NodeProfile
from bidding.nodes.timed import Overloaded, TimedCalls
from tests.stored import add_announcement

NODE = "n1"
PROFILE = NodeProfile(name=NODE, capabilities=["s1"])


def open_auction_row(settings: Settings) -> Announcement:
    """An auction open for bids, in the store (as the store board needs it)."""
    announcement = Announcement(task_id=str(uuid.uuid4()), task_name="t.noop", task_type="noop",
                       required_skills=["s1"], window=60.0)
    return add_announcement(settings.database_url, announcement, lifecycle.BIDDING, [NODE],
                            expected_bids=2)


def test_a_bid_request_arriving_at_a_full_queue_is_refused_at_once_saying_the_node_is_overloaded(
    settings: Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # given a node with one bid thread busy on a bid that takes long, and room for one more
    # request waiting
    small = settings.model_copy(
        update={"bid_threads": 1, "bid_queue_size": 1, "bid_board": "store"}
    )
    app = Celery("t", broker="memory://", set_as_current=False)
    busy, release = threading.Event(), threading.Event()
    answered: list[str] = []

    def slow_answer(ctx: Any, profile: Any, request: BidRequest, **kwargs: Any) -> None:
        busy.set()
        assert release.wait(30)
        answered.append(request.announcement.task_id)

    monkeypatch.setattr(consumer, "answer", slow_answer)
    threads = BidThreads(small, app, PROFILE, None)
    first, second, third = (open_auction_row(small) for _ in range(3))
    try:
        assert threads.submit(
            BidRequest(announcement=first, node=NODE, expires_at=first.announced_at + 60)
        )
        assert busy.wait(10)
        assert threads.submit(
            BidRequest(announcement=second, node=NODE, expires_at=second.announced_at + 60)
        )
        # when a third request arrives
        taken = threads.submit(
            BidRequest(announcement=third, node=NODE, expires_at=third.announced_at + 60)
        )
        # then it is not queued: the node refused it at once, saying why
        assert not taken
        [refusal] = StoreBoard(small.database_url).peek(third.task_id, 1)
        assert isinstance(refusal, Refusal) and refusal.node == NODE and refusal.failed
        assert refusal.reason == (
            f"node {NODE} overloaded: 1 bid thread(s) busy and 1 "
            "request(s) waiting (bidding_bid_queue_size)"
        )
    finally:
        release.set()
        deadline = time.monotonic() + 10
        while threads.pool.held and time.monotonic() < deadline:
            time.sleep(0.01)
        threads.shutdown()
    # and the two it took were answered
    assert sorted(answered) == sorted([first.task_id, second.task_id])


def test_an_award_finding_the_bid_threads_full_runs_on_the_thread_that_completed_it(
    settings: Settings,
) -> None:
    # given a node whose only bid thread is busy and whose queue is full
    small = settings.model_copy(update={"bid_threads": 1, "bid_queue_size": 1})
    app = Celery("t", broker="memory://", set_as_current=False)
    threads = BidThreads(small, app, PROFILE, None)
    release = threading.Event()
    try:
        assert threads.pool.try_submit(release.wait, 30)
        assert threads.pool.try_submit(release.wait, 30)
        # when an answer completes an auction and hands its award over
        ran: list[str] = []
        threads.defer(lambda: ran.append(threading.current_thread().name))
        # then the award is not dropped: it ran at once, on the thread that completed it
        assert ran == [threading.current_thread().name]
    finally:
        release.set()
        threads.shutdown()


def test_a_call_to_a_busy_bidder_beyond_its_queue_is_refused_at_once() -> None:
    # given a node's own bidder whose one thread is stuck, with one more call waiting
    calls = TimedCalls("bidder-n1", threads=1, limit=1)
    started, release = threading.Event(), threading.Event()
    outcomes: list[Any] = []
    try:
        calls.submit(lambda: started.set() or release.wait(30), 30, outcomes.append)
        assert started.wait(10)
        calls.submit(lambda: None, 30, outcomes.append)
        # when one more call comes, then it is refused at once, saying why
        with pytest.raises(Overloaded, match=r"bidder-n1: 1 call\(s\) waiting, at most 1"):
            calls.submit(lambda: None, 30, outcomes.append)
    finally:
        release.set()
        calls.close()


def test_a_node_whose_bidder_is_overloaded_refuses_at_once_saying_so() -> None:
    # given a node whose own bidder is stuck on one call, with room for one more waiting
    profile = NodeProfile(name=NODE, capabilities=["s1"], bidder="tests.bidders:anything")
    started, release = threading.Event(), threading.Event()
    bidder = NodeBidder(
        profile, lambda announcement, draft: started.set() or release.wait(30), threads=1, queue=1
    )
    announcement = Announcement(task_id="t-1", task_name="t.noop", task_type="noop")
    draft = Bid(
        task_id="t-1",
        node=NODE,
        capability=1.0,
        experience=0.5,
        load=1.0,
        confidence=0.9,
        trust=70,
    )
    answers: list[Bid | Refusal] = []
    try:
        bidder.ask(announcement, draft, None, answers.append)
        assert started.wait(10)
        bidder.ask(announcement, draft, None, answers.append)
        # when a third bid asks it
        bidder.ask(announcement, draft, None, answers.append)
        # then the node answers at once: a refusal saying its bidder is overloaded
        [refusal] = answers
        assert isinstance(refusal, Refusal) and refusal.bidder == profile.bidder
        assert refusal.reason == (
            "its bidder tests.bidders:anything is overloaded: 1 call(s) waiting, at most 1"
        )
    finally:
        release.set()
        bidder.calls.close()
