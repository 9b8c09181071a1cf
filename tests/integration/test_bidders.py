"""Node bidders end to end (issue 14), in the default bid mode, "auto": east's profile names a
bidder of its own (``tests.integration.bidders:choosy``, 0.5 s timeout), so callers ask it
through its queue, while they bid for north and south (built-in bidders) at once, in the same
auction. Real worker processes on Redis; the store on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from sqlalchemy import select

import bidding
from bidding.auction.proxy import PROXY_CLOSE
from bidding.cli import main
from bidding.observe.explain import BidView, Explanation
from bidding.store import read_session
from bidding.store.schema import Message
from tests.integration.app import approach, shared
from tests.integration.bidders import REFUSAL, REFUSED_TYPE
from tests.integration.conftest import Cluster, store_cluster

pytestmark = pytest.mark.integration

CHOOSY = "tests.integration.bidders:choosy"
EAST = f'bidder = "{CHOOSY}"\nbidder_timeout_s = 0.5\n'


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def judged(request: pytest.FixtureRequest, redis_broker: str,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """The three test nodes, east with its own bidder; every announcer in "auto" bid mode."""
    with store_cluster(request.param, tmp_path_factory.mktemp(f"bidders-{request.param}"),
                    extra_env={"BIDDING_BID_MODE": "auto"}, profiles={"east": EAST}) as c:
        yield c


def east_of(why: Explanation) -> BidView:
    return next(b for b in why.bids if b.node == "east")


def test_a_node_whose_bidder_refuses_a_kind_of_task_never_wins_it(judged: Cluster) -> None:
    # given east, whose bidder refuses legal reviews, among three nodes that can do the work
    assert judged.settings.bid_mode == "auto"
    # when six legal reviews are submitted
    results = [shared.apply_async((i,), bidding={"task_type": REFUSED_TYPE}) for i in range(6)]
    # then every one runs, and none on east
    assert {r.get(timeout=20)["node"] for r in results} <= {"north", "south"}
    # and explain shows east's refusal, with its bidder's reasoning as the reason
    why = bidding.explain(results[0].id, app=judged.app)
    east = east_of(why)
    assert (east.will_bid, east.reason, east.bidder) == (False, REFUSAL, CHOOSY)
    assert f" east       refused: {REFUSAL}\n             by its bidder {CHOOSY}" in why.render()
    # and so does `bidding explain --json`
    shown = CliRunner().invoke(main, ["explain", results[0].id, "-A", "tests.integration.app",
                                      "--json"])
    assert shown.exit_code == 0, shown.output
    refusal = next(b for b in json.loads(shown.output)["bids"] if b["node"] == "east")
    assert (refusal["reason"], refusal["bidder"]) == (REFUSAL, CHOOSY)


def test_a_node_whose_bidder_bids_shows_its_proposal(judged: Cluster) -> None:
    # when a task east's bidder bids on runs
    result = shared.delay("plain")
    result.get(timeout=15)
    # then east's bid carries its bidder's confidence, proposal and reasoning
    why = bidding.explain(result.id, app=judged.app)
    east = east_of(why)
    assert east.will_bid and east.bidder == CHOOSY
    assert east.confidence == 0.95
    assert east.proposal == "east runs shared_work ['plain'] on its GPU"
    assert east.reasoning == "idle GPU, and the task is small"
    # and the text report shows them under its bid
    assert "             proposal: east runs shared_work ['plain'] on its GPU" in why.render()
    # and the auction was one: north and south bid for by the caller, east asked; it closed
    # when east's answer came in, with all three bids
    assert sorted(b.node for b in why.bids) == ["east", "north", "south"]
    assert why.closed_by == "all bids in"
    assert {b.node: b.bidder for b in why.bids} == {"east": CHOOSY, "north": None,
                                                     "south": None}


def test_a_bidder_that_sleeps_past_its_timeout_does_not_hold_the_auction(
        judged: Cluster) -> None:
    # given east's bidder, which takes 3 s over a task whose value is "sleep" (timeout 0.5 s)
    window = judged.settings.window
    # when such a task is submitted, and another right after it
    slow = shared.delay("sleep")
    quick = shared.delay("quick")
    # then both run, the first not on east
    assert slow.get(timeout=15)["node"] in ("north", "south")
    quick.get(timeout=15)
    # and east refused the first at its timeout, saying so, within the window
    why = bidding.explain(slow.id, app=judged.app)
    east = east_of(why)
    assert not east.will_bid
    assert east.reason == f"its bidder {CHOOSY} did not answer within 0.5 s (bidder_timeout_s)"
    assert why.assignment_ms is not None and why.assignment_ms < window * 1000
    # and meanwhile east answered the second auction as usual: its sleeping bidder held up
    # none of its other bids (the auction closed on all answers, east's in time)
    other = bidding.explain(quick.id, app=judged.app)
    assert east_of(other).will_bid and not east_of(other).late
    assert other.closed_by == "all bids in"


def test_a_long_document_is_cut_for_the_bidder_and_runs_whole(judged: Cluster) -> None:
    # given a task whose argument is a 20,000-character document (the request limit: 8192)
    document = "lorem ipsum " * 1700
    assert judged.settings.bid_request_limit == 8192 and len(document) == 20_400
    # when it is submitted, to east's bidder and the others
    result = shared.delay(document)
    # then the task runs with the whole document (the awarder read it from the store)
    assert result.get(timeout=15)["value"] == document
    # and east's bidder was shown the document cut to the limit, and told its full size
    east = east_of(bidding.explain(result.id, app=judged.app))
    assert east.will_bid
    shown, full = (int(n) for n in east.proposal.split()[2::3])
    assert 8000 < shown < 8192 and full == len(document) + 4  # as JSON: ["..."]


def test_mixed_auctions_award_each_task_exactly_once(judged: Cluster) -> None:
    # when 30 tasks go out at once, each to a mixed auction (east asked, the others proxied)
    results = [shared.delay(i) for i in range(30)]
    assert sorted(r.get(timeout=30)["value"] for r in results) == list(range(30))
    ids = [r.id for r in results]
    # then each was awarded once and ran once
    with read_session(judged.settings.database_url) as s:
        awards = Counter(s.scalars(select(Message.task_id).where(
            Message.task_id.in_(ids), Message.kind == "AWARDED")))
    assert awards == Counter(ids)
    assert [judged.executions(i) for i in ids] == [1] * 30
    # and a task only north and south can do is bid for by its caller alone
    alpha = shared.apply_async(("alpha",), bidding={"required_skills": ["alpha"]})
    alpha.get(timeout=15)
    assert bidding.explain(alpha.id, app=judged.app).closed_by == PROXY_CLOSE


def test_the_body_runs_under_the_winners_proposal(judged: Cluster) -> None:
    # given east, whose own bidder proposes how it would do a task, and a task only east can
    # do, with a budget
    # when it is called
    result = approach.apply_async(("paper.pdf",), bidding={"budget": 5.0})
    # then the body read its award: east's proposal, the winning score, the first attempt
    got = result.get(timeout=15)
    assert got["proposal"] == "east runs approach_work ['paper.pdf'] on its GPU"
    assert (got["node"], got["worker"], got["attempt"], got["task_id"]) == (
        "east", "east", 1, result.id)
    why = bidding.explain(result.id, app=judged.app)
    assert got["score"] == why.winning_score and got["score"] is not None
    assert got["budget_left"] == 5.0
    # and explain shows the proposal next to what the body returned
    assert why.proposal == got["proposal"]
    text = why.render()
    assert f"  proposal: {got['proposal']}\n  result: returned {{" in text
    assert f"'proposal': \"{got['proposal']}\"" in text
    # and the caller, outside any body, has no award
    assert bidding.current_award() is None
