"""Unit tests of a node's own bidder (issue 14): resolving the profile's ``bidder``, checking
and applying its answer, its timeout and failures, seed 001's LLM bidder agent with
pydantic-ai's offline models, what a bid request shows it, and who bids in "auto" mode.

No broker, no database, no network.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
from pydantic_ai.messages import (
    ModelMessage,
    ModelRequest,
    ModelResponse,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.models.test import TestModel

from bidding import BidResponse
from bidding.auction.bidder import node_bidder, resolve_bidder
from bidding.auction.candidates import split_by_bidder
from bidding.auction.llm_bidder import announcement_prompt, system_prompt
from bidding.auction.request_view import bidder_view
from bidding.auction.response import InvalidResponse, judged
from bidding.errors import ProfileError
from bidding.models import Bid, CanvasOptions, Refusal
from bidding.nodes.profile import NodeProfile, parse_profile
from bidding.nodes.registry import LiveNode
from bidding.nodes.timed import Outcome, TimedCalls
from tests.unit.test_bid import REDFIN, bid_of, make_rfp

SOURCE = "workers/redfin.toml"


def with_bidder(bidder: str, **fields: Any) -> NodeProfile:
    """REDFIN with its own bidder (and more profile keys)."""
    return parse_profile({**REDFIN.model_dump(exclude_none=True), "bidder": bidder, **fields},
                         SOURCE)


def draft() -> Bid:
    return bid_of(make_rfp(required_skills=["gpu"]))


# Bidders the tests' profiles name by dotted path -----------------------------------------

def refuse_long_documents(announcement: Any, draft: Bid) -> BidResponse | None:
    """Refuses content over 100 characters; keeps the draft otherwise."""
    if len(announcement.content) > 100:
        return BidResponse(will_bid=False, confidence=0.0, proposal="",
                           reasoning=f"documents over 100 characters take me too long "
                                     f"({len(announcement.content)})")
    return None


async def confident_async(announcement: Any, draft: Bid) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"will_bid": True, "confidence": 0.9, "proposal": "async plan", "reasoning": "fast"}


NOT_A_FUNCTION = 42


def asleep(announcement: Any, draft: Bid) -> None:
    time.sleep(2)


def broken(announcement: Any, draft: Bid) -> None:
    raise RuntimeError("model endpoint down")


def returns_a_number(announcement: Any, draft: Bid) -> int:
    return 7


# --- resolving the profile's bidder --------------------------------------------------------


def test_a_profile_without_bidder_bids_with_the_builtin_function_alone() -> None:
    # given a profile that names no bidder
    # then there is no bidder to ask
    assert resolve_bidder(REDFIN, SOURCE) is None
    assert node_bidder(REDFIN, SOURCE) is None


def test_a_dotted_path_resolves_to_the_function() -> None:
    # given a profile naming a function of this module
    profile = with_bidder("tests.unit.test_bidders:refuse_long_documents")
    # then that function is the node's bidder, resolved once per process
    assert resolve_bidder(profile, SOURCE) is refuse_long_documents
    assert node_bidder(profile, SOURCE) is node_bidder(profile, SOURCE)


@pytest.mark.parametrize(("spec", "expected"), [
    ("tests.unit.no_such_module:fn", "cannot import 'tests.unit.no_such_module:fn' "
                                     "(ModuleNotFoundError"),
    ("tests.unit.test_bidders:nope", "cannot import 'tests.unit.test_bidders:nope' "
                                     "(AttributeError"),
    ("tests.unit.test_bidders:NOT_A_FUNCTION", "'tests.unit.test_bidders:NOT_A_FUNCTION' is "
                                               "a int, not a function"),
])
def test_a_bidder_that_does_not_resolve_is_refused_naming_the_profile_and_key(
        spec: str, expected: str) -> None:
    # given a profile whose bidder cannot be imported, or is no function
    # when the worker resolves it, then the error names the profile file and its key
    with pytest.raises(ProfileError) as caught:
        node_bidder(with_bidder(spec), SOURCE)
    assert str(caught.value).startswith(f"{SOURCE}: bidder: ")
    assert expected in str(caught.value)


@pytest.mark.parametrize(("fields", "expected"), [
    ({"bidder": "not a path"}, 'bidder: expected "llm" or a dotted path'),
    ({"bidder": "llm"}, 'bidder_llm: bidder = "llm" needs this table'),
    ({"bidder_llm": {"model": "test"}}, 'bidder_llm: used only with bidder = "llm"'),
    ({"bidder": "llm", "bidder_llm": {"model": "test", "temp": 1}},
     "bidder_llm.temp: Extra inputs are not permitted"),
    ({"bidder": "a.b:c", "bidder_timeout_s": 0}, "bidder_timeout_s: Input should be greater"),
])
def test_bad_bidder_keys_are_refused_when_the_profile_loads(fields: dict[str, Any],
                                                            expected: str) -> None:
    # given a profile with a bad bidder key, then loading it names the file and the key
    with pytest.raises(ProfileError) as caught:
        parse_profile({"name": "x", "capabilities": ["gpu"], **fields}, "workers/x.toml")
    assert str(caught.value).startswith("workers/x.toml: ")
    assert expected in str(caught.value)


def test_an_unknown_llm_model_is_refused_naming_the_key() -> None:
    # given bidder = "llm" with a model pydantic-ai does not know
    profile = with_bidder("llm", bidder_llm={"model": "nosuch:model"})
    # when the worker resolves it, then the error names the profile and bidder_llm.model
    with pytest.raises(ProfileError) as caught:
        resolve_bidder(profile, SOURCE)
    assert str(caught.value).startswith(f"{SOURCE}: bidder_llm.model: 'nosuch:model': ")


# --- the bidder's answer -------------------------------------------------------------------


def test_none_keeps_the_draft_and_says_the_bidder_saw_it() -> None:
    bid = draft()
    answer = judged(bid, None, "pkg:fn", now=bid.bid_at + 1)
    assert isinstance(answer, Bid)
    assert answer.model_dump(exclude={"bidder", "bid_at"}) == bid.model_dump(
        exclude={"bidder", "bid_at"})
    assert answer.bidder == "pkg:fn"


def test_a_bid_keeps_the_builtin_sub_scores_and_takes_confidence_and_proposal() -> None:
    # given a draft and a bidder that bids with its own confidence and approach
    bid = draft()
    response = BidResponse(will_bid=True, confidence=0.55, proposal="fine-tune, then infer",
                           reasoning="GPU work is what I do")
    # when its answer is applied
    answer = judged(bid, response, "pkg:fn", now=bid.bid_at)
    # then the sub-scores are the draft's, the confidence, proposal and reasoning the bidder's
    assert isinstance(answer, Bid)
    for score in ("capability", "experience", "load", "cost", "trust", "latency_ms"):
        assert getattr(answer, score) == getattr(bid, score)
    assert (answer.confidence, answer.proposal, answer.reasoning) == (
        0.55, "fine-tune, then infer", "GPU work is what I do")
    # and the draft's own confidence is kept beside it
    assert answer.metadata["draft_confidence"] == bid.confidence


def test_will_bid_false_is_a_refusal_whose_reason_is_the_reasoning() -> None:
    bid = draft()
    answer = judged(bid, {"will_bid": False, "confidence": 0, "proposal": "",
                          "reasoning": "not my kind of task", "usage": {"input_tokens": 12}},
                    "pkg:fn", now=bid.bid_at)
    assert isinstance(answer, Refusal)
    assert (answer.node, answer.reason, answer.bidder) == ("redfin", "not my kind of task",
                                                           "pkg:fn")
    assert not answer.failed
    assert answer.usage == {"input_tokens": 12.0}


@pytest.mark.parametrize(("value", "expected"), [
    (7, "returned int 7; expected a BidResponse, a dict with its fields, or None"),
    ({"will_bid": True}, "returned an invalid BidResponse: confidence: Field required"),
    ({"will_bid": True, "confidence": 1.5, "proposal": "", "reasoning": ""},
     "confidence: Input should be less than or equal to 1"),
    ({"will_bid": True, "confidence": 0.5, "proposal": "", "reasoning": "", "price": 3},
     "price: Extra inputs are not permitted"),
    ({"will_bid": True, "confidence": 0.5, "proposal": "", "reasoning": "",
      "usage": {"tokens": "many"}}, "returned usage {'tokens': 'many'}; expected a dict of"),
    ({"will_bid": True, "confidence": 0.5, "proposal": "", "reasoning": "",
      "usage": {"cost": float("nan")}}, "returned usage {'cost': nan}; expected a dict of finite"),
])
def test_an_invalid_answer_says_what_is_wrong(value: Any, expected: str) -> None:
    with pytest.raises(InvalidResponse) as caught:
        judged(draft(), value, "pkg:fn", now=0)
    assert expected in str(caught.value)


# --- asking the bidder: never blocking, timeouts and failures ------------------------------


def ask(profile: NodeProfile, expires_at: float | None = None,
        content: str = "") -> tuple[Bid | Refusal, float]:
    """Ask ``profile``'s bidder about a draft; the answer and how long ``ask`` blocked."""
    bidder = node_bidder(profile, SOURCE)
    assert bidder is not None
    got: list[Bid | Refusal] = []
    done = threading.Event()

    def then(answer: Bid | Refusal) -> None:
        got.append(answer)
        done.set()

    started = time.monotonic()
    bidder.ask(make_rfp(required_skills=["gpu"], content=content), draft(), expires_at, then)
    blocked = time.monotonic() - started
    assert done.wait(5), "the bidder's answer never came"
    return got[0], blocked


def test_the_bidder_refuses_long_documents_with_its_reason() -> None:
    profile = with_bidder("tests.unit.test_bidders:refuse_long_documents")
    refusal, _ = ask(profile, content="x" * 500)
    assert isinstance(refusal, Refusal)
    assert refusal.reason == "documents over 100 characters take me too long (500)"
    bid, _ = ask(profile, content="short")
    assert isinstance(bid, Bid) and bid.bidder == profile.bidder


def test_an_async_bidder_is_run_to_completion() -> None:
    bid, _ = ask(with_bidder("tests.unit.test_bidders:confident_async"))
    assert isinstance(bid, Bid)
    assert (bid.confidence, bid.proposal) == (0.9, "async plan")


def test_a_bidder_that_sleeps_past_its_timeout_is_a_refusal_and_blocks_nobody(
        caplog: pytest.LogCaptureFixture) -> None:
    # given a bidder that takes 2 s, with a 0.2 s timeout
    profile = with_bidder("tests.unit.test_bidders:asleep", bidder_timeout_s=0.2)
    # when it is asked
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="bidding.auction.bidder"):
        answer, blocked = ask(profile)
    # then the caller was not held up, and the node refuses at the timeout, saying why
    assert blocked < 0.05
    assert time.monotonic() - started < 1.0
    assert isinstance(answer, Refusal)
    assert answer.reason == ("its bidder tests.unit.test_bidders:asleep did not answer within "
                             "0.2 s (bidder_timeout_s)")
    # and it was logged once
    assert [r.getMessage() for r in caplog.records].count(
        f"node redfin, task t-1: {answer.reason}") == 1


def test_the_end_of_the_window_comes_before_a_longer_timeout() -> None:
    # given a bidder that sleeps, a 5 s timeout, and an auction whose window ends in 0.3 s
    profile = with_bidder("tests.unit.test_bidders:asleep")
    answer, _ = ask(profile, expires_at=time.time() + 0.3)
    # then the node refuses at the window's end
    assert isinstance(answer, Refusal)
    assert "did not answer before the auction's window closed" in answer.reason


def test_a_bidder_that_raises_is_a_refusal_with_the_error_logged_once(
        caplog: pytest.LogCaptureFixture) -> None:
    profile = with_bidder("tests.unit.test_bidders:broken")
    with caplog.at_level(logging.WARNING):
        answer, _ = ask(profile)
    assert isinstance(answer, Refusal)
    assert answer.reason == ("its bidder tests.unit.test_bidders:broken raised RuntimeError: "
                             "model endpoint down")
    assert not answer.failed  # a refusal like any other: the auction goes on
    logged = [r for r in caplog.records if "model endpoint down" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


def test_a_bidder_that_returns_something_invalid_is_a_refusal_saying_so() -> None:
    answer, _ = ask(with_bidder("tests.unit.test_bidders:returns_a_number"))
    assert isinstance(answer, Refusal)
    assert answer.reason == ("its bidder tests.unit.test_bidders:returns_a_number returned "
                             "int 7; expected a BidResponse, a dict with its fields, or None")


def test_calls_past_their_deadline_leave_the_others_answered_on_time() -> None:
    # given a pool of 2 threads, both taken by calls that hang past their deadline
    calls = TimedCalls("t", 2, limit=100)
    release = threading.Event()
    outcomes: dict[str, Outcome] = {}
    for name in ("hung-1", "hung-2"):
        calls.submit(release.wait, 0.1, lambda o, n=name: outcomes.__setitem__(n, o))
    # when a quick call comes, with a deadline it cannot meet while both threads hang
    calls.submit(lambda: "quick", 0.3, lambda o: outcomes.__setitem__("queued", o))
    time.sleep(0.5)
    # then each is reported at its deadline, the queued one unrun
    assert all(outcomes[n].timed_out for n in ("hung-1", "hung-2", "queued"))
    # and once the threads are free, new calls are answered with their value
    release.set()
    done = threading.Event()
    calls.submit(lambda: "later", 1.0, lambda o: (outcomes.__setitem__("later", o), done.set()))
    assert done.wait(2) and outcomes["later"].value == "later"
    calls.close()


def test_concurrent_slow_calls_each_get_a_thread_of_their_own() -> None:
    # given a pool of 8 threads, and 6 calls of 0.3 s submitted at once, each with 1 s
    calls = TimedCalls("t", 8, limit=100)
    outcomes: list[Outcome] = []
    all_in = threading.Semaphore(0)
    started = time.monotonic()
    for i in range(6):
        calls.submit(lambda i=i: time.sleep(0.3) or i, 1.0,
                     lambda o: (outcomes.append(o), all_in.release()))
    # then they run side by side: every one answers with its value, none times out
    for _ in range(6):
        assert all_in.acquire(timeout=2)
    assert sorted(o.value for o in outcomes) == list(range(6))
    assert time.monotonic() - started < 0.9
    calls.close()


# --- seed 001's LLM bidder, with pydantic-ai's offline models ------------------------------

def llm_profile(model: str, **table: Any) -> NodeProfile:
    return with_bidder("llm", bidder_llm={"model": model, **table},
                       description="GPU inference and NLP")


def test_llm_bidder_with_test_model_bids_with_its_answer_and_records_tokens() -> None:
    # given seed 001's bidder agent on pydantic-ai's TestModel, told what to answer
    profile = llm_profile("tests.unit.test_bidders:bidding_test_model")
    # when the node asks it
    bid, _ = ask(profile)
    # then the bid carries the model's confidence, proposal and reasoning
    assert isinstance(bid, Bid)
    assert (bid.confidence, bid.proposal, bid.reasoning) == (0.8, "batch it on the GPU",
                                                             "I have a GPU")
    assert bid.bidder == "llm"
    # and the tokens the model reported are recorded with it
    assert bid.usage["requests"] == 1 and bid.usage["input_tokens"] > 0
    assert bid.usage["output_tokens"] > 0


def bidding_test_model() -> TestModel:
    return TestModel(custom_output_args={"will_bid": True, "confidence": 0.8,
                                         "proposal": "batch it on the GPU",
                                         "reasoning": "I have a GPU"})


SEEN: list[str] = []


def refuses_legal_work(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model that refuses tasks of type "legal_review" and bids on the rest."""
    prompt = next(p.content for m in messages if isinstance(m, ModelRequest)
                  for p in m.parts if isinstance(p, UserPromptPart))
    SEEN.append(str(prompt))
    legal = "(type legal_review)" in str(prompt)
    args = {"will_bid": not legal, "confidence": 0.0 if legal else 0.7,
            "proposal": "" if legal else "summarise section by section",
            "reasoning": "legal review is not among my skills" if legal else "NLP fits"}
    return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, args)])


REFUSING_MODEL = FunctionModel(refuses_legal_work)


def test_llm_bidder_with_a_function_model_refuses_one_kind_of_task() -> None:
    # given the bidder agent on a model that refuses legal reviews
    profile = llm_profile("tests.unit.test_bidders:REFUSING_MODEL")
    bidder = node_bidder(profile, SOURCE)
    assert bidder is not None
    answers: list[Bid | Refusal] = []
    done = threading.Semaphore(0)
    # when it is asked about a legal review and about a summary
    for task_type in ("legal_review", "summary"):
        announcement = make_rfp(
            task_type=task_type,
            required_skills=["nlp"],
            content="Review clause 4",
            args=["contract.pdf"],
        )
        bidder.ask(
            announcement, bid_of(announcement), None, lambda a: (answers.append(a), done.release())
        )
        assert done.acquire(timeout=5)
    # then it refuses the first, with its reasoning, and bids on the second with its proposal
    refusal, bid = answers
    assert isinstance(refusal, Refusal)
    assert refusal.reason == "legal review is not among my skills"
    assert isinstance(bid, Bid) and bid.proposal == "summarise section by section"
    # and the model saw seed 001's RFP message, with the arguments and the node's estimate
    assert SEEN[-1].startswith("RFP: Review clause 4\nSkills needed: ['nlp']\n")
    assert 'Arguments: ["contract.pdf"] {}' in SEEN[-1]
    assert "Your record suggests confidence 1.00" in SEEN[-1]


def test_the_llm_bidders_system_prompt_is_seed_001s() -> None:
    prompt = system_prompt(llm_profile("test"))
    assert prompt.startswith(
        "You are redfin, specializing in: gpu, nlp.\n\nGPU inference and NLP\n\n"
    )
    assert "Set will_bid=True only if your skills match." in prompt
    assert system_prompt(llm_profile("test", prompt="Bid on everything.")) == (
        "Bid on everything."
    )
    # and a table description comes before the profile's
    assert "\n\nTranslations\n\n" in system_prompt(llm_profile("test", description="Translations"))


def test_the_rfp_prompt_says_what_was_cut() -> None:
    announcement = make_rfp(content="x" * 50, truncated={"content": 90_000})
    assert "Shortened for this request: content (90000 characters)" in announcement_prompt(
        announcement, draft()
    )


# --- what a bid request shows a bidder -----------------------------------------------------


def test_a_small_task_is_shown_whole() -> None:
    announcement = make_rfp(content="Summarize this", args=["a"], kwargs={"k": 1}, budget=2.0)
    view, full = bidder_view(announcement, 8192)
    assert full and view is announcement


def test_the_canvas_exclusions_and_last_error_are_hidden() -> None:
    # given a retry of a task in a chain, after another node failed it
    announcement = make_rfp(
        canvas=CanvasOptions(
            chain=[{"task": "next", "args": ["secret"]}], root_id="r1", parent_id="p1"
        ),
        exclude_nodes=["bluefin"],
        last_error="bluefin: disk full",
        attempt=2,
    )
    # then its bidder sees none of that but the canvas's ids, and the request is partial
    view, full = bidder_view(announcement, 8192)
    assert not full
    assert view.canvas == CanvasOptions(root_id="r1", parent_id="p1")
    assert view.exclude_nodes == [] and view.last_error is None
    assert (view.task_id, view.attempt) == (announcement.task_id, 2)


def test_a_task_called_from_another_tasks_body_is_shown_whole() -> None:
    # given a task whose canvas has only ids (called from inside another task, or in a group)
    announcement = make_rfp(
        canvas=CanvasOptions(root_id="r1", parent_id="p1", group_id="g1", group_index=0)
    )
    # then its bid request is the whole announcement (no read of the store at the award)
    view, full = bidder_view(announcement, 8192)
    assert full and view is announcement


def test_long_content_and_arguments_are_cut_to_the_limit_with_their_sizes() -> None:
    # given a task with 5000 characters of content and a long document among its args
    document = "word " * 2000
    announcement = make_rfp(content="c" * 5000, args=[document, 3], kwargs={"lang": "en"})
    # when it is shown with a limit of 1000 characters
    view, full = bidder_view(announcement, 1000)
    # then the content is cut to 1000 characters, args and kwargs to 1000 of JSON together
    assert not full
    assert view.content == "c" * 1000
    assert (
        len(view.model_dump_json(include={"args"})) + len(view.model_dump_json(include={"kwargs"}))
        < 1000 + 40
    )
    assert view.args[0] == document[: len(view.args[0])] and len(view.args[0]) > 900
    # and the bidder is told each cut field's full size
    assert view.truncated["content"] == 5000
    assert view.truncated["args"] > 10_000


# --- who bids in "auto" mode ---------------------------------------------------------------


def live(name: str, bidder: str = "") -> LiveNode:
    return LiveNode(
        name=name,
        capabilities=("gpu",),
        capacity=4,
        price_per_unit=0.01,
        latency_ms=50,
        trust=70,
        last_heartbeat=time.time(),
        bidder=bidder,
    )


def test_auto_proxies_builtin_bidders_and_asks_the_others() -> None:
    nodes = [live("a"), live("b", bidder="pkg:fn"), live("c"), live("d", bidder="llm")]
    names = ["a", "b", "c", "d"]
    assert split_by_bidder("auto", nodes, names) == (["a", "c"], ["b", "d"])
    assert split_by_bidder("ask", nodes, names) == ([], names)
    assert split_by_bidder("proxy", nodes, names) == (names, [])
