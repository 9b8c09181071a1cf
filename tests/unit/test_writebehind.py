"""The write-behind journal's entry: what the caller's award hands the writers, what a writer
makes of one it cannot read or the store refuses (no broker, no store)."""

from __future__ import annotations

import json

import pytest
from sqlalchemy.exc import DataError, IntegrityError, InterfaceError, OperationalError

from bidding.auction.refused import refuses
from bidding.auction.writebehind import Entry, Unreadable, read_entry
from bidding.models import Announcement, Award, Bid, Refusal, Score


def test_an_entry_comes_back_from_its_json_as_the_award_made_it() -> None:
    # given an award with a bid, a refusal and their scores, as the caller decided it
    announcement = Announcement(task_id="t-1", task_name="demo.work", task_type="analysis",
                       required_skills=["x"], budget=2.0)
    bid = Bid(task_id="t-1", node="north", capability=1.0, experience=0.5, load=0.75,
              confidence=0.8, trust=70.0, skills=["x"], cost=0.01)
    no = Refusal(task_id="t-1", node="south", reason="at capacity")
    award = Award(task_id="t-1", outcome="awarded", winner="north", strategy="weighted",
                  closed_by="proxy bids", scores=[Score(node="north", total=0.71,
                                                        terms={"capability": 0.4})])
    entry = Entry(
        announcement=announcement,
        candidates=["north", "south"],
        answers=[bid, no],
        award=award,
        counts={"north": 1, "south": 4},
    )
    # when it travels as JSON (the journal keeps nothing else)
    raw = entry.to_json()
    back = Entry.from_json(raw.encode())
    # then every part comes back equal, the bid a Bid and the refusal a Refusal
    assert json.loads(raw)["rfp"]["task_id"] == "t-1"
    assert back == entry
    assert isinstance(back.answers[0], Bid) and isinstance(back.answers[1], Refusal)


def test_an_entry_of_a_newer_version_is_read_as_unreadable_and_what_it_holds_is_salvaged() -> None:
    # given an entry whose announcement has an option this version does not know, and one
    # that is not even JSON
    announcement = Announcement(
        task_id="t-2", task_name="demo.work", task_type="analysis", required_skills=["x"], args=[1]
    )
    award = Award(
        task_id="t-2",
        outcome="awarded",
        winner="north",
        strategy="weighted",
        closed_by="proxy bids",
    )
    data = json.loads(
        Entry(
            announcement=announcement, candidates=["north"], answers=[], award=award, counts={}
        ).to_json()
    )
    data["rfp"]["a_newer_option"] = 3
    # when a writer reads them
    newer = read_entry("t-2", json.dumps(data).encode())
    garbled = read_entry("t-3", b"{not json")
    # then neither raises: each is unreadable, saying why
    assert isinstance(newer, Unreadable) and "a_newer_option" in newer.error
    assert isinstance(garbled, Unreadable) and garbled.task_id == "t-3"
    # and what can be read of them fails their tasks: the announcement without the unknown
    # option and the winner; or, of one that is not JSON, its id alone
    salvaged, candidates, winner = newer.salvage()
    assert salvaged == announcement and candidates == ["north"] and winner == "north"
    bare, candidates, winner = garbled.salvage()
    assert bare.task_id == "t-3" and bare.task_name == "unknown" and winner is None


@pytest.mark.parametrize(
    ("exc", "refused"),
    [
        (DataError("INSERT ...", {}, Exception("unsupported Unicode escape sequence")), True),
        (IntegrityError("INSERT ...", {}, Exception("violates foreign key")), True),
        (OverflowError("Python int too large to convert to SQLite INTEGER"), True),
        (OperationalError("INSERT ...", {}, Exception("server closed the connection")), False),
        (OperationalError("INSERT ...", {}, Exception("database is locked")), False),
        (InterfaceError("INSERT ...", {}, Exception("connection already closed")), False),
        (AssertionError("a new announcement was not open"), False),
    ],
    ids=["data", "integrity", "overflow", "connection-lost", "sqlite-locked", "closed", "bug"],
)
def test_an_entry_is_refused_for_what_it_holds_never_for_a_store_out_of_reach(
    exc: BaseException,
    refused: bool,
) -> None:
    # given a write of a journal entry that failed with exc
    # then the entry counts as refused (its task failed) only when the store said no to a value
    # of it: a store out of reach, a lock held too long or a bug of ours leave it to be tried
    # again
    assert refuses(exc) is refused
