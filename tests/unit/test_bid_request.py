"""A bid request has one JSON form, written and read by ``BidRequest`` alone, whichever board
carries it (issue "One path through the auction", item 3). No broker, no store."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from bidding.auction.bid_request import BidRequest
from bidding.models import Announcement


def make_rfp(**fields: Any) -> Announcement:
    values: dict[str, Any] = {"task_id": "t-1", "task_name": "demo.work", "task_type": "analysis"}
    values.update(fields)
    return Announcement(**values)


def test_a_bid_request_reads_back_as_it_was_written() -> None:
    # given a partial request to node a, with the node's history version
    request = BidRequest(announcement=make_rfp(content="summarize"), node="a",
                         expires_at=1712.5, expected=3, partial=True, history_version=7)
    # when it is written and read back
    again = BidRequest.from_json(request.to_json())
    # then it is the same request
    assert again == request


def test_a_request_sent_by_the_previous_version_is_read() -> None:
    # given the two forms the previous version sent: on the Redis board, stamped with the
    # node's history version; on a kombu queue, with neither a version nor a partial flag
    announcement = make_rfp(args=[1, "two"])
    on_redis = ('{"history_version": 4, "node": "a", "expires_at": 12.5, "expected": 2, '
                '"partial": true, "announcement": ' + announcement.model_dump_json() + "}")
    on_kombu = json.dumps({"announcement": announcement.model_dump(mode="json"), "node": "b",
                           "expires_at": 12.5, "expected": 2})
    # when a node of this version reads them, then it reads what was sent
    assert BidRequest.from_json(on_redis) == BidRequest(
        announcement=announcement, node="a", expires_at=12.5, expected=2, partial=True,
        history_version=4)
    assert BidRequest.from_json(on_kombu) == BidRequest(
        announcement=announcement, node="b", expires_at=12.5, expected=2)


def test_a_node_of_the_previous_version_reads_a_request_of_this_one() -> None:
    # given a request sent by this version (no history version: the node reads its own)
    announcement = make_rfp()
    sent = json.loads(BidRequest(announcement=announcement, node="a", expires_at=9.0,
                                 expected=2).to_json())
    # when the previous version's reader takes it apart, then it finds what it looked for
    assert Announcement.model_validate(sent["announcement"]) == announcement
    assert (str(sent["node"]), float(sent.get("expires_at") or 0),
            int(sent.get("expected") or 0), not sent.get("partial"),
            sent.get("history_version")) == ("a", 9.0, 2, True, None)


def test_the_history_version_a_transport_read_is_the_requests() -> None:
    # given a request written without a history version
    raw = BidRequest(announcement=make_rfp(), node="a", expires_at=9.0).to_json()
    # when a transport that read the node's version reads the request
    request = BidRequest.from_json(raw, history_version=12)
    # then the request carries it
    assert request.history_version == 12


def test_a_malformed_request_is_refused_naming_the_field() -> None:
    # given a request without its announcement, and one whose node is not a name
    with pytest.raises(ValidationError, match="announcement"):
        BidRequest.from_json('{"node": "a", "expires_at": 1.0}')
    with pytest.raises(ValidationError, match="node"):
        BidRequest.from_json(json.dumps({"announcement": make_rfp().model_dump(mode="json"),
                                         "node": ["a"]}))
    # and one that is not JSON at all
    with pytest.raises(ValidationError, match="JSON"):
        BidRequest.from_json(b"not json")
