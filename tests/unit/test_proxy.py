"""Unit tests of bidding.proxy and ``bid.gather_histories``: the bids an announcer makes for
the candidates must be the bids their own workers would make (a SQLite store, no broker)."""

from __future__ import annotations

from contextlib import contextmanager

import pytest

from bidding.auction import award as award_module
from bidding.auction import bind as bind_module
from bidding.auction.award import award_answers, award_made_inside
from bidding.auction.bid import NodeHistory, compute_bid
from bidding.auction.history import (
    forget_history,
    gather_histories,
    gather_history,
    lock_states,
)
from bidding.auction.proxy import answers_inside, profile_of, proxy_answers
from bidding.lifecycle import states as lifecycle
from bidding.models import Bid, Refusal
from bidding.nodes.profile import NodeProfile
from bidding.nodes.registry import LiveNode
from bidding.store import read_session, write_session
from bidding.strategies import STRATEGIES, AgentJudgment, decides_at_once, resolve_strategy
from tests.unit.test_bid import NOW, announcement_row, episode, make_rfp, record, store_settings


def live(name: str, skills: tuple[str, ...], *, trust: float = 70.0) -> LiveNode:
    return LiveNode(name=name, capabilities=skills, capacity=4, price_per_unit=0.02,
                    latency_ms=40.0, trust=trust, last_heartbeat=NOW)


def populate(url: str) -> None:
    """Three nodes with different records: redfin and bluefin have episodes of several task
    types and work in flight; greenfin has no episode at all."""
    with write_session(url) as session:
        record(session, [
            episode("e3", "redfin", "extraction", False, NOW - 200),
            episode("e1", "redfin", "extraction", False, NOW - 10),
            episode("e4", "redfin", "extraction", True, NOW - 1000),
            episode("e2", "redfin", "extraction", True, NOW - 50),
            episode("o1", "redfin", "summary", False, NOW - 5),
            episode("x1", "bluefin", "extraction", False, NOW - 1),
            episode("x2", "bluefin", "extraction", True, NOW - 2),
            *(episode(f"b{i}", "bluefin", "extraction", i % 3 != 0, NOW - 100 - i)
              for i in range(15)),
        ])
        session.add_all([
            announcement_row("a1", lifecycle.ASSIGNED, "redfin"),
            announcement_row("a2", lifecycle.EXECUTING, "redfin"),
            announcement_row("a3", lifecycle.SUCCESS, "redfin"),
            announcement_row("a4", lifecycle.ASSIGNED, "bluefin"),
        ])


def test_histories_read_together_equal_each_nodes_own_history(store_url):
    # given three nodes with different records (one with none) and a small window
    populate(store_url)
    settings = store_settings(store_url, experience_window=3, recent_failure_seconds=100)
    nodes = ["redfin", "bluefin", "greenfin"]
    # when their histories of "extraction" are read in one go
    together = gather_histories(settings, nodes, "extraction", now=NOW)
    # then each is exactly what the node's own read finds
    for node in nodes:
        assert together[node] == gather_history(settings, node, "extraction", now=NOW), node
    # and they are not all alike (the comparison could tell them apart)
    assert together["redfin"].in_flight == 2 and together["bluefin"].in_flight == 1
    assert together["greenfin"] == NodeHistory()
    assert len(together["bluefin"].outcomes) == 3


def test_histories_of_no_node_are_empty(store_url):
    assert gather_histories(store_settings(store_url), [], "extraction", now=NOW) == {}


def test_the_published_profile_is_the_nodes_profile():
    # given a node as the registry lists it
    node = live("redfin", ("gpu", "nlp"), trust=81.5)
    # when the proxy rebuilds its profile
    profile = profile_of(node)
    # then it equals the profile the node's worker loaded
    assert profile == NodeProfile(name="redfin", capabilities=["gpu", "nlp"], capacity=4,
                                  price_per_unit=0.02, latency_ms=40, trust=81.5)


def test_proxy_answers_are_the_bids_the_nodes_would_make(store_url):
    # given the three nodes, of which greenfin lacks the required skill
    populate(store_url)
    settings = store_settings(store_url)
    nodes = [live("redfin", ("pdf", "nlp")), live("bluefin", ("pdf",), trust=90),
             live("greenfin", ("gpu",))]
    announcement = make_rfp(
        task_type="extraction", required_skills=["pdf"], preferred_node="bluefin"
    )
    # when the announcer makes their answers
    answers = proxy_answers(settings, announcement, nodes, now=NOW)
    # then redfin and bluefin bid exactly as compute_bid on their own history would
    by_node = {a.node: a for a in answers}
    for node in nodes[:2]:
        own = compute_bid(
            announcement,
            profile_of(node),
            gather_history(settings, node.name, "extraction", now=NOW),
            now=NOW,
        )
        assert isinstance(by_node[node.name], Bid)
        assert by_node[node.name] == own
    # and the bids carry their different records (bluefin: preferred, one task in flight)
    assert by_node["bluefin"].is_preferred_node and by_node["bluefin"].in_flight == 1
    assert by_node["redfin"].in_flight == 2
    # and greenfin refuses, saying why
    refusal = by_node["greenfin"]
    assert isinstance(refusal, Refusal)
    assert refusal.reason.startswith("no matching capability")


def test_the_proxy_rereads_only_the_nodes_whose_version_changed(store_url):
    forget_history()
    settings = store_settings(store_url, history_cache_seconds=60)
    nodes = [live("redfin", ("pdf",)), live("bluefin", ("pdf",))]
    announcement = make_rfp(task_type="extraction", required_skills=["pdf"])
    # given both nodes' bids made at history versions 3 and 5
    proxy_answers(settings, announcement, nodes, now=NOW, versions={"redfin": 3, "bluefin": 5})
    # when both finish a failed attempt, and only redfin's version is raised
    with write_session(store_url) as session:
        record(
            session,
            [
                episode("f1", "redfin", "extraction", False, NOW - 1),
                episode("f2", "bluefin", "extraction", False, NOW - 1),
            ],
        )
    answers = proxy_answers(
        settings, announcement, nodes, now=NOW, versions={"redfin": 4, "bluefin": 5}
    )
    # then redfin's bid counts the failure, and bluefin's still uses its cached record
    by_node = {a.node: a for a in answers}
    assert isinstance(by_node["redfin"], Bid) and isinstance(by_node["bluefin"], Bid)
    assert by_node["redfin"].confidence < by_node["bluefin"].confidence == 1.0
    # and without versions (a store board) both are read afresh
    fresh = {a.node: a for a in proxy_answers(settings, announcement, nodes, now=NOW)}
    assert fresh["bluefin"].confidence == by_node["redfin"].confidence


def test_answers_made_inside_the_award_are_the_bids_the_nodes_would_make(store_url):
    # given the three nodes, of which greenfin lacks the required skill
    populate(store_url)
    forget_history()
    settings = store_settings(store_url)
    nodes = [
        live("redfin", ("pdf", "nlp")),
        live("bluefin", ("pdf",), trust=90),
        live("greenfin", ("gpu",)),
    ]
    announcement = make_rfp(task_type="extraction", required_skills=["pdf"])
    # when the answers are made in a transaction, from the nodes' states read there
    inside = answers_inside(settings, announcement, nodes, now=NOW)
    with read_session(store_url) as session:
        made = inside.make(
            session,
            lock_states(
                session,
                list(inside.nodes),
                lock=False,
                task_type=announcement.task_type,
                since=NOW - settings.recent_failure_seconds,
            ),
        )
    # then only the nodes that can bid are locked and counted
    assert list(inside.nodes) == ["redfin", "bluefin"]
    # and every answer is the one the announcer makes outside a transaction
    assert made == proxy_answers(settings, announcement, nodes, now=NOW)
    # and the bids carry the counts they were given (redfin has two tasks in flight)
    assert [a.in_flight for a in made if isinstance(a, Bid)] == [2, 1]


def test_answers_made_inside_the_award_need_a_strategy_that_decides_at_once(
    store_url, monkeypatch
):
    # given a strategy that consults a judge (an LLM may take seconds under the write lock)
    monkeypatch.setitem(
        STRATEGIES,
        "slow_judge",
        lambda: AgentJudgment(judge=lambda bids, announcement, caps: None),
    )
    settings = store_settings(store_url)
    announcement = make_rfp(task_type="extraction", strategy="slow_judge")
    inside = answers_inside(settings, announcement, [live("redfin", ("pdf",))], now=NOW)
    # when its answers are to be made inside the award, then that is refused, naming it
    with pytest.raises(ValueError, match="slow_judge decides outside"):
        award_made_inside(settings, announcement, inside, candidates=1)
    # and without a judge the same strategy decides at once
    assert decides_at_once(AgentJudgment()) and not decides_at_once(resolve_strategy("slow_judge"))


def test_a_judge_never_decides_under_the_write_lock_even_when_counts_keep_moving(
    store_url, monkeypatch
):
    # given an open auction with two bids, and a judge that picks redfin
    populate(store_url)
    settings = store_settings(store_url)
    announcement = make_rfp(task_type="extraction", required_skills=["pdf"], strategy="slow_judge")
    with write_session(store_url) as session:
        session.add(announcement_row(announcement.task_id, lifecycle.BIDDING, None))
    answers = proxy_answers(
        settings, announcement, [live("redfin", ("pdf",)), live("bluefin", ("pdf",))], now=NOW
    )
    inside_lock = [False]
    judged_inside: list[bool] = []

    def judge(bids, announcement, caps):
        judged_inside.append(inside_lock[0])
        return {"selected_agent_id": "redfin", "reasoning": "the judge's pick"}

    monkeypatch.setitem(STRATEGIES, "slow_judge", lambda: AgentJudgment(judge=judge))
    real_write_session = bind_module.write_session

    @contextmanager
    def watched(url):
        with real_write_session(url) as session:
            inside_lock[0] = True
            try:
                yield session
            finally:
                inside_lock[0] = False

    monkeypatch.setattr(bind_module, "write_session", watched)
    # and in-flight counts that move between every decision and its commit, but for redfin
    seen = iter(range(1, 10))
    monkeypatch.setattr(
        award_module,
        "in_flight_counts",
        lambda settings, nodes: {"redfin": 2, "bluefin": 1 + next(seen)},
    )
    # when the auction is awarded
    won = award_answers(
        settings, announcement, answers, closed_by="all bids in", candidates=2, write=True
    )
    # then the judge decided three times, never inside the write transaction, and its pick won
    assert judged_inside == [False, False, False]
    assert won is not None and won.winner == "redfin"



def _inside(settings, announcement, nodes):
    """The answers made inside an award's transaction (its states read there, unlocked)."""
    inside = answers_inside(settings, announcement, nodes, now=NOW)
    with read_session(settings.database_url) as session:
        return inside.make(session, lock_states(
            session, list(inside.nodes), lock=False, task_type=announcement.task_type,
            since=NOW - settings.recent_failure_seconds))


def test_answers_inside_the_award_reread_only_the_outcomes_of_nodes_whose_record_grew(
    store_url
):
    forget_history()
    populate(store_url)
    settings = store_settings(store_url, history_cache_seconds=60)
    nodes = [live("redfin", ("pdf",)), live("bluefin", ("pdf",))]
    announcement = make_rfp(task_type="extraction", required_skills=["pdf"])
    # given an award's bids, made from both nodes' outcomes
    first = {a.node: a for a in _inside(settings, announcement, nodes)}
    # when redfin finishes a failed attempt (its record counts it), bluefin takes new work,
    # and a failure of bluefin's is in the store that its record does not count (so only
    # a read of its episodes would find it)
    with write_session(store_url) as session:
        record(session, [episode("f1", "redfin", "extraction", False, NOW - 1)])
        session.add_all([episode("f2", "bluefin", "extraction", False, NOW - 1),
                         announcement_row("n1", lifecycle.ASSIGNED, "bluefin")])
    second = {a.node: a for a in _inside(settings, announcement, nodes)}
    # then redfin's bid counts its new failure, and bluefin's keeps its cached outcomes
    assert all(isinstance(a, Bid) for a in (*first.values(), *second.values()))
    assert second["redfin"].confidence < first["redfin"].confidence
    assert second["bluefin"].confidence == first["bluefin"].confidence
    # and yet both count the work in flight read in this award (never a cached count)
    assert (first["bluefin"].in_flight, second["bluefin"].in_flight) == (1, 2)
    # and once the cached outcomes are too old, bluefin's are read again
    forget_history()
    fresh = {a.node: a for a in _inside(settings, announcement, nodes)}
    assert fresh["bluefin"].confidence < first["bluefin"].confidence


def test_answers_inside_the_award_from_cached_outcomes_are_the_bids_read_afresh(store_url):
    forget_history()
    populate(store_url)
    settings = store_settings(store_url, history_cache_seconds=60)
    nodes = [live("redfin", ("pdf", "nlp")), live("bluefin", ("pdf",), trust=90)]
    announcement = make_rfp(task_type="extraction", required_skills=["pdf"])
    # given the outcomes of both nodes cached by an award
    read = _inside(settings, announcement, nodes)
    # when the next award finds both records unchanged
    cached = _inside(settings, announcement, nodes)
    # then its bids are the ones an award reading everything makes
    assert cached == read
    forget_history()
    assert cached == _inside(settings, announcement, nodes)
