"""The write-behind journal's entry: what the caller's award hands the writers (no broker)."""

from __future__ import annotations

import json

from bidding.auction.writebehind import Entry
from bidding.models import Announcement, Award, Bid, Refusal, Score


def test_an_entry_comes_back_from_its_json_as_the_award_made_it() -> None:
    # given an award with a bid, a refusal and their scores, as the caller decided it
    rfp = Announcement(task_id="t-1", task_name="demo.work", task_type="analysis",
                       required_skills=["x"], budget=2.0)
    bid = Bid(task_id="t-1", node="north", capability=1.0, experience=0.5, load=0.75,
              confidence=0.8, trust=70.0, skills=["x"], cost=0.01)
    no = Refusal(task_id="t-1", node="south", reason="at capacity")
    award = Award(task_id="t-1", outcome="awarded", winner="north", strategy="weighted",
                  closed_by="proxy bids", scores=[Score(node="north", total=0.71,
                                                        terms={"capability": 0.4})])
    entry = Entry(rfp=rfp, candidates=["north", "south"], answers=[bid, no], award=award,
                  counts={"north": 1, "south": 4})
    # when it travels as JSON (the journal keeps nothing else)
    raw = entry.to_json()
    back = Entry.from_json(raw.encode())
    # then every part comes back equal, the bid a Bid and the refusal a Refusal
    assert json.loads(raw)["rfp"]["task_id"] == "t-1"
    assert back == entry
    assert isinstance(back.answers[0], Bid) and isinstance(back.answers[1], Refusal)
