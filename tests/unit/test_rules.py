"""Seed 000's coordinator rules, opt-in: ``bidding_skill_keywords`` (a call's required skills
from keywords in its content and arguments) and ``bidding_preferred_nodes`` (task type ->
node), applied where the announcement is built; validated where the settings load."""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from bidding.auction.announcement import build_announcement
from bidding.config import Settings, load_settings
from bidding.errors import ConfigurationError
from bidding.models import Announcement
from bidding.observe.explain import Explanation

KEYWORDS = {"pdf": "pdf_text_extraction", "Sentiment": "nlp_analysis",
            "machine learning": "ml", "c++": "cpp"}
ROUTES = {"extraction": "bluefin"}


def settings(environ: Mapping[str, str] | None = None, **conf: Any) -> Settings:
    return load_settings({f"bidding_{k}": v for k, v in conf.items()}, environ=environ or {})


def build(args: Any = None, kwargs: Any = None, options: Mapping[str, Any] | None = None,
          conf: Settings | None = None, **task: Any) -> Announcement:
    the_task = SimpleNamespace(name="demo.tasks.work", **task)
    return build_announcement(the_task, conf or settings(skill_keywords=KEYWORDS,
                                                         preferred_nodes=ROUTES),
                              args, kwargs, options or {})


# --- bidding_skill_keywords ----------------------------------------------------------------


def test_a_call_without_skills_requires_those_of_the_keywords_in_its_arguments() -> None:
    # when a task with no required skills is called with a PDF to analyse for sentiment
    made = build(["https://x.org/report.PDF"], {"ask": "overall SENTIMENT please"})
    # then it requires both skills, in the order of the setting, and says why
    assert made.required_skills == ["pdf_text_extraction", "nlp_analysis"]
    assert made.inferred == {"required_skills": "bidding_skill_keywords: 'pdf' -> "
                             "pdf_text_extraction, 'sentiment' -> nlp_analysis (found in the task)"}


def test_keywords_match_whole_words_only_and_longest_first() -> None:
    assert build(["pdfs", "unpdf", "sentimental"]).required_skills == []
    assert build(["some machine learning in C++"]).required_skills == ["ml", "cpp"]
    assert build(["a machine"]).required_skills == []


def test_the_content_option_is_searched_and_argument_names_are_not() -> None:
    # the name of an argument ("pdf") is no keyword; a content given by the call is searched
    assert build(None, {"pdf": "x"}).required_skills == []
    made = build(["nothing"], options={"content": "Extract the text of this PDF"})
    assert made.required_skills == ["pdf_text_extraction"]


def test_skills_named_by_the_task_or_the_call_are_kept() -> None:
    by_task = build(["a pdf"], required_skills=["ocr"])
    by_call = build(["a pdf"], options={"required_skills": ["ocr"]})
    assert by_task.required_skills == by_call.required_skills == ["ocr"]
    assert by_task.inferred == by_call.inferred == {}


def test_without_the_setting_nothing_is_inferred() -> None:
    made = build(["a pdf"], conf=settings())
    assert (made.required_skills, made.preferred_node, made.inferred) == ([], None, {})


# --- bidding_preferred_nodes ---------------------------------------------------------------


def test_a_task_type_routed_to_a_node_prefers_it_unless_the_call_names_one() -> None:
    made = build(["x"], task_type="extraction")
    assert made.preferred_node == "bluefin"
    assert made.inferred["preferred_node"] == (
        "bidding_preferred_nodes: task type 'extraction' -> bluefin")
    assert build(["x"], options={"preferred_node": "redfin"},
                 task_type="extraction").preferred_node == "redfin"
    assert build(["x"], task_type="analysis").preferred_node is None


def test_the_preferred_node_multiplies_its_bid_under_the_composite_strategy() -> None:
    from bidding.auction.bid import NodeHistory, compute_bid
    from bidding.models import Bid
    from bidding.nodes.profile import NodeProfile
    from bidding.strategies import Composite

    # given a call of a task type routed to bluefin, bid on by bluefin and redfin alike
    made = build(["x"], options={"strategy": "composite"}, task_type="extraction")
    bids = [compute_bid(made, NodeProfile(name=n, capabilities=["x"]), NodeHistory())
            for n in ("bluefin", "redfin")]
    assert all(isinstance(b, Bid) for b in bids)
    # when the composite strategy scores them
    scores = {b.node: Composite().score(b, made, {}) for b in bids if isinstance(b, Bid)}
    # then bluefin's bid, and only its, is multiplied by 1.1
    assert scores["bluefin"].multipliers.get("preferred_node") == 1.1
    assert "preferred_node" not in scores["redfin"].multipliers
    assert scores["bluefin"].total > scores["redfin"].total


# --- explain -------------------------------------------------------------------------------


def test_explain_says_why_skills_and_node_were_inferred() -> None:
    made = build(["a pdf"], task_type="extraction")
    shown = Explanation(
        task_id="t", task_name="demo.tasks.work", task_type="extraction", state="BIDDING",
        strategy="weighted", required_skills=made.required_skills,
        preferred_node=made.preferred_node, candidates=[], winner=None, winning_score=None,
        outcome=None, closed_by=None, error=None, announced_at=0.0, awarded_at=None,
        assignment_ms=None, bids=[], messages=[], inferred=made.inferred,
    ).render()
    assert ("  required skills inferred: bidding_skill_keywords: 'pdf' -> pdf_text_extraction "
            "(found in the task)\n") in shown
    assert "  preferred node inferred: bidding_preferred_nodes: task type 'extraction' -> " \
           "bluefin\n" in shown


# --- validation at settings load -----------------------------------------------------------


@pytest.mark.parametrize(("conf", "environ", "says"), [
    ({"skill_keywords": {"pdf": " "}}, {}, "bidding_skill_keywords: 'pdf' -> ' ':"
     " keyword and skill must be non-empty"),
    ({"skill_keywords": {"PDF": "a", "pdf": "b"}}, {}, "bidding_skill_keywords: "
     "keyword 'pdf' maps to two skills ('a' and 'b')"),
    ({"skill_keywords": ["pdf"]}, {}, "bidding_skill_keywords: must be a mapping"),
    ({"skill_keywords": {"pdf": 3}}, {}, "bidding_skill_keywords.pdf: Input should be a valid "
     "string"),
    ({}, {"BIDDING_SKILL_KEYWORDS": "pdf=x"}, "BIDDING_SKILL_KEYWORDS: not a JSON "
     "object"),
    ({"preferred_nodes": {"extraction": "n" * 33}}, {}, "bidding_preferred_nodes:"
     " 'extraction' -> '" + "n" * 33 + "': a node name of 1 to 32 characters"),
    ({"preferred_nodes": {"": "n1"}}, {}, "bidding_preferred_nodes: task type '':"
     " 1 to 64 characters"),
])
def test_a_bad_rule_setting_is_refused_at_load_naming_it(
    conf: dict[str, Any], environ: dict[str, str], says: str,
) -> None:
    with pytest.raises(ConfigurationError) as raised:
        settings(environ, **conf)
    assert says in str(raised.value)


def test_rule_settings_come_from_the_environment_as_json() -> None:
    loaded = settings({"BIDDING_SKILL_KEYWORDS": '{"PDF": "pdf_text_extraction"}',
                       "BIDDING_PREFERRED_NODES": '{"extraction": "bluefin"}'})
    assert loaded.skill_keywords == {"pdf": "pdf_text_extraction"}
    assert loaded.preferred_nodes == {"extraction": "bluefin"}
