"""Planning an auction (pure): the route is decided once, from the candidates, their bidders
and what is known of the task, with the fallback it takes when its award cannot commit."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest

from bidding.auction.plan import Circumstances, Route, RowStep, plan_auction
from bidding.models import Announcement, Fallbacks
from bidding.nodes.registry import LiveNode

BUILT_IN = LiveNode(name="north", capabilities=("ocr",), capacity=2, price_per_unit=0.0,
                    latency_ms=1, trust=70, last_heartbeat=0.0)
OWN_BIDDER = replace(BUILT_IN, name="south", bidder="pkg.bidders:careful")

NEW = Circumstances(new=True, fresh_id=True, bid_mode="auto", decides_at_once=True,
                    journal=False, board_keeps_answers=True, request_limit=8192, in_time=True)


def announcement(**fields: Any) -> Announcement:
    return Announcement(task_id=str(uuid.uuid4()), task_name="t.work", task_type="work",
                        required_skills=["ocr"], **fields)


def test_a_new_task_whose_candidates_all_bid_built_in_is_proxied_with_its_row_in_the_award():
    plan = plan_auction(announcement(), [BUILT_IN], ["north"], [], NEW)
    assert (plan.route, plan.row, plan.proxied, plan.asked) == (
        Route.PROXY, RowStep.WITH_AWARD, ("north",), ())
    # and if that award cannot commit, every candidate is asked, before the row is written
    assert plan.fallback is not None
    assert (plan.fallback.route, plan.fallback.row, plan.fallback.asked) == (
        Route.ASK, RowStep.AFTER_ASKING, ("north",))


def test_with_the_journal_on_a_new_task_goes_through_it_then_proxy_then_asking():
    plan = plan_auction(announcement(), [BUILT_IN], ["north"], [], replace(NEW, journal=True))
    routes = []
    step = plan
    while step is not None:
        routes.append(step.route)
        step = step.fallback
    assert routes == [Route.JOURNAL, Route.PROXY, Route.ASK]


def test_a_callers_own_task_id_never_goes_through_the_journal_nor_asks_before_its_row():
    plan = plan_auction(announcement(), [BUILT_IN], ["north"], [],
                        replace(NEW, journal=True, fresh_id=False))
    assert plan.route is Route.PROXY
    assert plan.fallback is not None and plan.fallback.row is RowStep.FIRST


@pytest.mark.parametrize("known", [replace(NEW, new=False), replace(NEW, decides_at_once=False)],
                         ids=["a due task", "a slow strategy"])
def test_a_proxy_award_that_cannot_decide_in_its_transaction_writes_the_row_first(known):
    plan = plan_auction(announcement(), [BUILT_IN], ["north"], [], known)
    assert (plan.route, plan.row) == (Route.PROXY, RowStep.FIRST)
    # and its fallback asks without writing the row again
    assert plan.fallback is not None
    assert (plan.fallback.route, plan.fallback.row) == (Route.ASK, RowStep.WRITTEN)


def test_a_node_with_a_bidder_of_its_own_is_asked_beside_the_proxied_ones():
    plan = plan_auction(announcement(), [BUILT_IN, OWN_BIDDER], ["north", "south"], [], NEW)
    assert (plan.route, plan.proxied, plan.asked) == (Route.MIXED, ("north",), ("south",))
    assert plan.row is RowStep.AFTER_ASKING and plan.fallback is None


def test_asking_writes_the_row_first_on_a_board_that_does_not_keep_answers_or_a_cut_request():
    store_board = plan_auction(announcement(), [BUILT_IN], ["north"], [],
                               replace(NEW, bid_mode="ask", board_keeps_answers=False))
    cut = plan_auction(announcement(content="x" * 500), [BUILT_IN], ["north"], [],
                       replace(NEW, bid_mode="ask", request_limit=256))
    assert store_board.route is cut.route is Route.ASK
    assert store_board.row is cut.row is RowStep.FIRST


def test_without_candidates_a_task_waits_for_nodes_coming_back_or_is_deferred_or_fails():
    waits = plan_auction(announcement(), [], [], ["north"], NEW)
    assert (waits.route, waits.waiting) == (Route.WAIT, ("north",))
    deferring = announcement(fallbacks=Fallbacks(on_capability_unavailable="defer"))
    assert plan_auction(deferring, [], [], [], NEW).route is Route.DEFER
    assert plan_auction(deferring, [], [], [], replace(NEW, in_time=False)).route is Route.NONE
    assert plan_auction(announcement(), [], [], [], NEW).route is Route.NONE
