"""Unit tests of bidding.announce: candidate selection and building the announcement.

``select_candidates`` and ``build_announcement`` are pure: no broker, no store. The task is a
stand-in object with the attributes ``build_announcement`` reads (name, task_type,
required_skills).
"""

from __future__ import annotations

import json
import os
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy.exc import OperationalError

from bidding.auction import loads
from bidding.auction.announcement import build_announcement, check_options
from bidding.auction.candidates import prior_score, scaled_cap, select_candidates
from bidding.auction.scores import learned_trust
from bidding.config import Settings, load_settings
from bidding.errors import ConfigurationError, UnknownStrategyError
from bidding.models import OPTION_KEYS, Announcement, Bid, non_json_number
from bidding.nodes.registry import LiveNode
from bidding.strategies import NodeCapability, WeightedScore

# --- helpers -------------------------------------------------------------------------------


def make_rfp(**fields: Any) -> Announcement:
    values: dict[str, Any] = {"task_id": "t-1", "task_name": "demo.work", "task_type": "analysis"}
    values.update(fields)
    return Announcement(**values)


def live(name: str, capabilities: Sequence[str] = ("x",), trust: float = 70.0,
         attempts: int = 0, successes: int = 0) -> LiveNode:
    return LiveNode(name=name, capabilities=tuple(capabilities), capacity=4, price_per_unit=0.01,
                    latency_ms=10.0, trust=trust, last_heartbeat=0.0, attempts=attempts,
                    successes=successes)


def task(name: str = "demo.tasks.extract", **attrs: Any) -> Any:
    return SimpleNamespace(name=name, **attrs)


def settings(**conf: Any) -> Settings:
    return load_settings({f"bidding_{k}": v for k, v in conf.items()}, environ={})


def build(the_task: Any = None, args: Any = None, kwargs: Any = None,
          options: Mapping[str, Any] | None = None, conf: Settings | None = None) -> Announcement:
    return build_announcement(the_task if the_task is not None else task(),
                              conf or settings(), args, kwargs, options or {})


class ModuleLevelStrategy:
    """An unregistered strategy class a worker can import by its class path."""

    def select(self, bids: Sequence[Bid], announcement: Announcement,
               capabilities: Mapping[str, NodeCapability]) -> Bid | None:
        return bids[0] if bids else None


# --- select_candidates: filter -------------------------------------------------------------


def test_candidates_need_at_least_one_required_skill():
    # given a task needing "gpu" or "sql", and nodes with both, one, or neither
    announcement = make_rfp(required_skills=["gpu", "sql"])
    nodes = [live("both", ["gpu", "sql"]), live("gpu", ["gpu"]), live("sql", ["sql", "x"]),
             live("none", ["x", "y"])]
    # when candidates are selected
    chosen = select_candidates(announcement, nodes, random.Random(0))
    # then every node with at least one required skill is asked, in their order
    assert chosen == ["both", "gpu", "sql"]


def test_without_required_skills_every_live_node_is_a_candidate():
    # given a task that requires no skill
    announcement = make_rfp()
    nodes = [live("a", ["x"]), live("b", ["y"]), live("c", ["z"])]
    # when candidates are selected
    # then every live node is asked
    assert select_candidates(announcement, nodes, random.Random(0)) == ["a", "b", "c"]


def test_no_live_node_means_no_candidate():
    # given no live node
    # then nobody is asked
    assert select_candidates(make_rfp(), [], random.Random(0)) == []


def test_cap_zero_asks_every_eligible_node():
    # given 30 eligible nodes and candidate_cap 0 (no cap)
    announcement = make_rfp(required_skills=["x"], candidate_cap=0)
    nodes = [live(f"n{i:02d}") for i in range(30)]
    # when candidates are selected
    chosen = select_candidates(announcement, nodes, random.Random(0))
    # then all 30 are asked
    assert chosen == [n.name for n in nodes]


@pytest.mark.parametrize(("eligible", "asked"), [
    (3, 3), (8, 8), (16, 8), (32, 12), (128, 23), (256, 32), (1000, 64)])
def test_the_auto_cap_grows_with_the_square_root_of_the_eligible_nodes(eligible, asked):
    # given an announcement with the default cap ("auto") and this many eligible nodes
    announcement = make_rfp(required_skills=["x"])
    assert announcement.candidate_cap == "auto"
    nodes = [live(f"n{i:04d}") for i in range(eligible)]
    # when candidates are selected
    chosen = select_candidates(announcement, nodes, random.Random(0))
    # then all are asked up to 8, then 2 * sqrt(n) of them, each once
    assert len(chosen) == len(set(chosen)) == asked == min(eligible, scaled_cap(eligible))


def test_a_cap_that_is_neither_a_number_nor_auto_is_refused_naming_it():
    # given a task option with a negative cap, or a word other than "auto"
    for bad in (-1, "all"):
        # when the announcement is built
        with pytest.raises(ValidationError) as info:
            make_rfp(candidate_cap=bad)
        # then the error names the field
        assert "candidate_cap" in str(info.value)


def test_cap_not_reached_asks_everyone():
    # given 4 eligible nodes and a cap of 4
    announcement = make_rfp(candidate_cap=4)
    nodes = [live(f"n{i}") for i in range(4)]
    # then all of them are asked, in order, without drawing
    assert select_candidates(announcement, nodes, random.Random(0)) == ["n0", "n1", "n2", "n3"]


# --- select_candidates: cap ----------------------------------------------------------------

# Ten eligible nodes for a task needing "a" and "b". The prior score is 0.7 * skill match +
# 0.3 * trust / 100, so skill match comes first and trust second:
#   full (both skills): trust 90 -> 0.97, trust 60 -> 0.88, trust 10 -> 0.73
#   half (one skill):   trust 100 -> 0.65 (better trust, worse match)
CAP_RFP = make_rfp(required_skills=["a", "b"], candidate_cap=4)
CAP_NODES = [
    live("full10", ["a", "b"], trust=10),
    live("half1", ["a"], trust=100),
    live("full90", ["a", "b"], trust=90),
    live("half2", ["b"], trust=100),
    live("half3", ["a"], trust=100),
    live("full60", ["b", "a"], trust=60),
    live("half4", ["b"], trust=100),
    live("half5", ["a"], trust=100),
    live("half6", ["b", "c"], trust=100),
    live("half7", ["a", "z"], trust=100),
]
BEST_TWO = {"full90", "full60"}
REST = {n.name for n in CAP_NODES} - BEST_TWO


def test_prior_score_ranks_skill_match_before_trust():
    # given the nodes above
    scores = {n.name: prior_score(CAP_RFP, n) for n in CAP_NODES}
    # then the two fully matched, most trusted nodes rank first
    ranked = sorted(scores, key=lambda name: -scores[name])
    assert set(ranked[:2]) == BEST_TWO
    assert scores["full90"] == pytest.approx(0.97)
    assert scores["full10"] == pytest.approx(0.73)
    assert scores["half1"] == pytest.approx(0.65)


def test_prior_score_uses_the_trust_a_node_has_earned():
    # given a node declaring trust 90 that failed 18 of its 20 attempts, and one declaring 60
    # that succeeded in all 20
    boaster = live("boaster", ["a", "b"], trust=90, attempts=20, successes=2)
    steady = live("steady", ["a", "b"], trust=60, attempts=20, successes=20)
    # then the record counts as it does in their bids (scoring.learned_trust), in bands of 2
    assert prior_score(CAP_RFP, steady) > prior_score(CAP_RFP, boaster)
    assert learned_trust(90, 2, 20) == pytest.approx(36.67, abs=0.01)
    assert prior_score(CAP_RFP, boaster) == pytest.approx(0.7 + 0.3 * 0.36)
    # and a node without a record keeps its declared trust
    assert prior_score(CAP_RFP, live("new", ["a", "b"], trust=90)) == pytest.approx(0.97)


def test_nodes_with_about_the_same_record_tie_and_share_the_best_half():
    # given six equally skilled nodes whose earned trust is 99.2-99.7 (all in the top band)
    nodes = [live(f"n{i}", ["a", "b"], trust=70, attempts=1000, successes=1000 - i)
             for i in range(6)]
    assert len({prior_score(CAP_RFP, n) for n in nodes}) == 1
    # when candidates are drawn with a cap of 4 (the best 2 by prior, 2 at random) many times
    kept = {name for seed in range(40)
            for name in select_candidates(CAP_RFP, nodes, random.Random(seed))[:2]}
    # then the best half is not always the same two nodes
    assert len(kept) > 2


@pytest.mark.parametrize("seed", range(25))
def test_cap_keeps_the_best_half_and_draws_the_rest(seed):
    # given 10 eligible nodes and a cap of 4
    # when candidates are selected
    chosen = select_candidates(CAP_RFP, CAP_NODES, random.Random(seed))
    # then exactly 4 distinct nodes are asked, always including the 2 best by prior score
    assert len(chosen) == 4
    assert len(set(chosen)) == 4
    assert set(chosen) >= BEST_TWO
    # and the other 2 come from the rest
    assert len(set(chosen) & REST) == 2


def test_cap_draw_is_reproducible_with_a_seeded_rng():
    # given the same seed twice
    # then the same candidates are chosen
    first = select_candidates(CAP_RFP, CAP_NODES, random.Random(11))
    again = select_candidates(CAP_RFP, CAP_NODES, random.Random(11))
    assert first == again


def test_cap_gives_every_other_node_a_chance():
    # given many seeds
    drawn: Counter[str] = Counter()
    for seed in range(300):
        drawn.update(set(select_candidates(CAP_RFP, CAP_NODES, random.Random(seed))) - BEST_TWO)
    # then every node outside the best two is sometimes asked, including the low-trust one
    assert set(drawn) == REST
    # and each is asked a fair share of the time (2 of 8 slots: 25% expected, 75 of 300)
    assert all(30 <= drawn[name] <= 130 for name in REST), drawn


def test_a_full_node_is_ranked_as_its_bid_would_be_scored_its_record_times_its_slot_share():
    # given three equally skilled nodes of trust 90, 80 and 60, four slots each, and a cap of
    # 2 (the best by rank, and one drawn)
    nodes = [live("ninety", ["a", "b"], trust=90), live("eighty", ["a", "b"], trust=80),
             live("sixty", ["a", "b"], trust=60)]
    announcement = CAP_RFP.model_copy(update={"candidate_cap": 2})
    asked_for: list[list[str]] = []

    def ranked_first(busy: dict[str, int]) -> set[str]:
        def loads(names: Sequence[str]) -> dict[str, int]:
            asked_for.append(list(names))
            return {n: busy[n] for n in names if n in busy}

        return {select_candidates(announcement, nodes, random.Random(seed), loads=loads)[0]
                for seed in range(20)}

    # when the best has a free slot, then it is always asked first
    assert ranked_first({"ninety": 3}) == {"ninety"}
    # and when its four slots are busy (a slot share of 4 / 5: 90 -> 72), the next is
    assert ranked_first({"ninety": 4}) == {"eighty"}
    # and it still ranks above a worse free node (72 against 60)
    assert ranked_first({"ninety": 4, "eighty": 4}) == {"ninety"}
    assert prior_score(announcement, nodes[0], in_flight=4) == pytest.approx(0.7 + 0.3 * 0.72)
    # and the loads were read for the eligible nodes
    assert asked_for[0] == ["ninety", "eighty", "sixty"]


def test_a_failed_read_of_the_loads_ranks_by_the_last_answer_or_as_if_free(monkeypatch):
    # given a store that answers once, then drops the connection when the tasks in flight are
    # read
    answers: list[Any] = [{"n1": 4}]

    def read(settings: Any, names: Any) -> dict[str, int]:
        if not answers:
            raise OperationalError("SELECT", {}, Exception("server closed the connection"))
        return answers.pop()

    loads.invalidate_cache()
    monkeypatch.setattr(loads, "in_flight_counts", read)
    settings = Settings(live_cache_seconds=60)
    # when the announcer asks for them, then for one node more (read again, and dropped)
    assert loads.recent_loads(settings, ["n1"]) == {"n1": 4}
    # then it ranks by the last answer
    assert loads.recent_loads(settings, ["n1", "n2"]) == {"n1": 4}
    # and with no answer at all, as if every node were free
    loads.invalidate_cache()
    assert loads.recent_loads(settings, ["n1", "n2"]) == {}
    loads.invalidate_cache()


def test_the_loads_are_read_once_while_fresh_and_again_for_nodes_not_covered(monkeypatch):
    # given a store that counts the reads of the tasks in flight
    reads: list[list[str]] = []

    def read(settings: Any, names: Any) -> dict[str, int]:
        reads.append(list(names))
        return {"n1": 2}

    loads.invalidate_cache()
    monkeypatch.setattr(loads, "in_flight_counts", read)
    settings = Settings(live_cache_seconds=60)
    # when an announcer ranks the same nodes twice, then a third time with one more
    assert loads.recent_loads(settings, ["n1", "n2"]) == {"n1": 2}
    assert loads.recent_loads(settings, ["n2", "n1"]) == {"n1": 2}
    loads.recent_loads(settings, ["n1", "n2", "n3"])
    # then the store was read for the first, and for the one more only
    assert reads == [["n1", "n2"], ["n3"]]
    # and a task this process awards counts on its winner at once, until the next read
    loads.note_award(settings, "n2")
    loads.note_award(settings, "n1")
    assert loads.recent_loads(settings, ["n1", "n2"]) == {"n1": 3, "n2": 1}
    # and with no cache (0 s), every ranking reads
    loads.recent_loads(Settings(live_cache_seconds=0), ["n1"])
    assert len(reads) == 3
    loads.invalidate_cache()


def test_odd_cap_keeps_the_larger_half():
    # given a cap of 3: ceil(3 / 2) = 2 are kept by rank, 1 is drawn
    announcement = CAP_RFP.model_copy(update={"candidate_cap": 3})
    for seed in range(20):
        chosen = select_candidates(announcement, CAP_NODES, random.Random(seed))
        # then the best two are always there, plus one other
        assert len(set(chosen)) == 3
        assert set(chosen) >= BEST_TWO


# --- check_options -------------------------------------------------------------------------


def test_check_options_accepts_every_known_key():
    # given every documented option key
    # then no error is raised
    check_options(dict.fromkeys(OPTION_KEYS, 1), "bidding")


def test_check_options_names_unknown_keys_and_lists_valid_ones():
    # given two misspelt keys
    with pytest.raises(ConfigurationError) as info:
        check_options({"budgett": 1, "colour": "red", "budget": 1.0}, "demo.work bidding")
    # then both are named, sorted, after where they were found, and every valid key is listed
    message = str(info.value)
    assert message.startswith("demo.work bidding: unknown option(s) budgett, colour; ")
    assert "valid options: " + ", ".join(OPTION_KEYS) in message


# --- build_announcement --------------------------------------------------------------------


def test_defaults_come_from_the_task_and_the_settings():
    # given a task with a type and skills, and non-default settings
    the_task = task(task_type="extraction", required_skills=("pdf", "ocr"))
    conf = settings(strategy="composite", no_bid="fallback", window=0.5, min_confidence=0.3,
                    min_trust=20.0, candidate_cap=3)
    # when the announcement is built without call options
    announcement = build(the_task, args=[1], kwargs={"k": "v"}, conf=conf, options={})
    # then the task's type and skills, and every setting, are used
    assert announcement.task_name == "demo.tasks.extract"
    assert announcement.task_type == "extraction"
    assert announcement.required_skills == ["pdf", "ocr"]
    assert announcement.strategy == "composite"
    assert announcement.no_bid == "fallback"
    assert announcement.window == 0.5
    assert announcement.min_confidence == 0.3
    assert announcement.min_trust == 20.0
    assert announcement.candidate_cap == 3
    assert announcement.args == [1]
    assert announcement.kwargs == {"k": "v"}
    # and the model defaults fill the rest
    assert (
        announcement.priority,
        announcement.budget,
        announcement.deadline,
        announcement.units,
        announcement.attempt,
    ) == (5, None, None, 1.0, 1)


def test_task_type_defaults_to_the_tasks_short_name():
    # given a task without task_type or required_skills attributes
    announcement = build(task("demo.tasks.summarize"))
    # then the type is the last part of its name and no skill is required
    assert announcement.task_type == "summarize"
    assert announcement.required_skills == []


def test_call_options_override_task_and_settings():
    # given a task with defaults, and call options for the same fields
    the_task = task(task_type="extraction", required_skills=["pdf"])
    options = {
        "task_type": "ocr",
        "required_skills": ["ocr"],
        "strategy": "routing",
        "window": 3.0,
        "min_confidence": 0.9,
        "priority": 9,
        "budget": 2.5,
        "preferred_node": "redfin",
        "units": 4,
        "no_bid": "fallback",
        "candidate_cap": 0,
        "min_trust": 0,
        "deadline": 1e10,
        "content": "read it",
    }
    # when the announcement is built
    announcement = build(the_task, options=options)
    # then every option wins
    assert announcement.task_type == "ocr"
    assert announcement.required_skills == ["ocr"]
    assert announcement.strategy == "routing"
    assert announcement.window == 3.0
    assert announcement.min_confidence == 0.9
    assert announcement.priority == 9
    assert announcement.budget == 2.5
    assert announcement.preferred_node == "redfin"
    assert announcement.units == 4.0
    assert announcement.no_bid == "fallback"
    assert announcement.candidate_cap == 0
    assert announcement.min_trust == 0.0
    assert announcement.deadline == 1e10
    assert announcement.content == "read it"


def test_options_set_to_none_keep_the_defaults():
    # given call options explicitly set to None
    announcement = build(task(task_type="extraction"), options={"task_type": None, "window": None})
    # then they are ignored
    assert announcement.task_type == "extraction"
    assert announcement.window == 2.0


def test_task_id_is_used_or_generated():
    # given an explicit task id
    announcement = build_announcement(task(), settings(), None, None, {}, task_id="abc-123")
    # then it is used
    assert announcement.task_id == "abc-123"
    # and without one, a fresh id is made for every call
    assert build().task_id != build().task_id


def test_unknown_option_key_is_refused():
    # given a call option that does not exist
    with pytest.raises(ConfigurationError) as info:
        build(options={"strategy": "weighted", "timeout": 3})
    # then it is named, with the valid options listed
    assert "unknown option(s) timeout" in str(info.value)
    assert "valid options: task_type, required_skills" in str(info.value)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [([{1, 2}], None), (None, {"when": object()}), ([b"bytes"], None)],
    ids=["set", "object", "bytes"],
)
def test_non_json_arguments_are_refused(args, kwargs):
    # given arguments JSON cannot encode
    with pytest.raises(ConfigurationError) as info:
        build(args=args, kwargs=kwargs)
    # then the error names the task and says JSON
    assert "args/kwargs of demo.tasks.extract" in str(info.value)
    assert "JSON" in str(info.value)


@pytest.mark.parametrize(
    ("value", "where", "found"),
    [
        ([1, float("nan")], "args", "args[1]: NaN is not JSON"),
        ({"x": {"y": float("inf")}}, "kwargs", "kwargs['x']['y']: Infinity is not JSON"),
        ([(1, [-float("inf")])], "args", "args[0][1][0]: -Infinity is not JSON"),
        ({3: [0.5, {"k": float("nan")}]}, "input", "input[3][1]['k']: NaN is not JSON"),
        ([1.5, "nan", None, True, {"k": [0.0, -2]}], "args", None),
    ],
    ids=["nan-in-args", "nested-infinity", "minus-infinity-in-a-tuple", "int-key", "none"],
)
def test_a_float_json_cannot_carry_is_found_naming_where_it_is(value, where, found):
    # given a value, perhaps with NaN or infinity somewhere inside
    # when it is searched, then the first such float is named with its path, and why
    assert non_json_number(value, where) == found


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        ([1, float("nan")], None, "args[1]: NaN is not JSON"),
        (None, {"x": {"y": float("inf")}}, "kwargs['x']['y']: Infinity is not JSON"),
    ],
    ids=["args", "kwargs"],
)
def test_nan_or_infinity_in_the_arguments_is_refused_naming_the_argument(args, kwargs, named):
    # given arguments with NaN or infinity (JSON has neither: a stored task's would be null)
    with pytest.raises(ConfigurationError) as info:
        build(args=args, kwargs=kwargs)
    # then the error names the task, the argument and the reason
    assert str(info.value).startswith(f"args/kwargs of demo.tasks.extract: {named}")


@pytest.mark.parametrize("value", [float("nan"), float("inf")], ids=["nan", "infinity"])
def test_nan_or_infinity_in_an_option_is_refused_naming_the_option(value: float) -> None:
    # given a deadline of NaN or infinity among a call's bidding options
    with pytest.raises(ConfigurationError) as info:
        build(options={"deadline": value})
    # then the error names the option and says the number is not finite
    assert str(info.value).startswith("bidding options of demo.tasks.extract: deadline: ")
    assert "finite number" in str(info.value)


def test_delay_with_nan_in_its_arguments_is_refused_before_anything_is_announced(
    monkeypatch, store_url
):
    from celery import Celery
    from sqlalchemy import func, select

    import bidding
    from bidding.config import celery_conf
    from bidding.store import read_session
    from bidding.store.schema import AnnouncementRow

    for name in [k for k in os.environ if k.startswith("BIDDING_")]:
        monkeypatch.delenv(name)
    app = Celery("t", set_as_current=False)
    app.conf.update(celery_conf("memory://", "cache+memory://"), bidding_database_url=store_url)
    bidding.install(app)

    @app.task(
        base=bidding.BiddingTask, name="demo.tasks.scale", required_skills=["x"], shared=False
    )
    def scale(values: list[float], factor: float = 1.0) -> list[float]:
        """The task body never runs: the call is refused before it is announced."""
        return [v * factor for v in values]

    # when it is called with NaN nested in a keyword argument
    with pytest.raises(ValueError) as info:
        scale.delay([1.0, 2.0], factor=float("nan"))
    # then the caller gets a bidding error, a ValueError, naming the argument and the reason
    assert isinstance(info.value, bidding.BiddingError)
    assert str(info.value) == (
        "args/kwargs of demo.tasks.scale: kwargs['factor']: NaN is not JSON; celery-bidding "
        "sends JSON only (a retry would run with null)"
    )
    # and nothing was announced
    with read_session(store_url) as session:
        assert session.scalar(select(func.count()).select_from(AnnouncementRow)) == 0


def test_arguments_over_the_limit_are_refused_naming_the_task_the_size_and_the_setting():
    # given bidding_max_arguments_bytes at its least, 1024, and arguments whose JSON (args and
    # kwargs together, as the store keeps it: [[...], {...}]) has 1024 bytes, then 1025
    conf = settings(max_arguments_bytes=1024)
    fits = ["x" * 1008, {"k": 1}]  # [["<1008 x>"], {"k": 1}]: 1024 bytes
    assert len(json.dumps([fits[:1], fits[1]])) == 1024
    # when the first is announced, then it is
    assert build(args=fits[:1], kwargs=fits[1], conf=conf).args == fits[:1]
    # when the second is, then it is refused, naming the task, the size and the setting
    with pytest.raises(ConfigurationError) as info:
        build(args=["x" * 1009], kwargs={"k": 1}, conf=conf)
    assert str(info.value) == (
        "args/kwargs of demo.tasks.extract: 1025 bytes of JSON, more than "
        "bidding_max_arguments_bytes (1024); pass large data by reference (a URL, a path, "
        "a key) instead"
    )


def test_delay_with_a_2_mib_argument_is_refused_before_anything_is_announced(
    monkeypatch, store_url
):
    from celery import Celery
    from sqlalchemy import func, select

    import bidding
    from bidding.config import celery_conf
    from bidding.store import read_session
    from bidding.store.schema import AnnouncementRow

    # given an app with the default limit (1 MiB) on a real store, and a task
    for name in [k for k in os.environ if k.startswith("BIDDING_")]:
        monkeypatch.delenv(name)
    app = Celery("t", set_as_current=False)
    app.conf.update(celery_conf("memory://", "cache+memory://"), bidding_database_url=store_url)
    bidding.install(app)

    @app.task(
        base=bidding.BiddingTask, name="demo.tasks.summarize", required_skills=["x"], shared=False
    )
    def summarize(text: str) -> str:
        """The task body never runs: the call is refused before it is announced."""
        return text[:10]

    # when it is called with 2 MiB of text
    with pytest.raises(ValueError) as info:
        summarize.delay("x" * 2_097_152)
    # then the caller gets a bidding error, a ValueError, naming the task, the size and the
    # setting
    assert isinstance(info.value, bidding.BiddingError)
    assert str(info.value).startswith(
        "args/kwargs of demo.tasks.summarize: 2097162 bytes of JSON, more than "
        "bidding_max_arguments_bytes (1048576)"
    )
    # and nothing was announced
    with read_session(store_url) as session:
        assert session.scalar(select(func.count()).select_from(AnnouncementRow)) == 0


@pytest.mark.parametrize(
    ("args", "kwargs", "options", "where", "what"),
    [
        ([1, "a\x00b"], None, None, "args/kwargs of demo.tasks.extract: args[1]", "NUL"),
        (None, {"y": {"k\x00": 1}}, None, "kwargs['y']['k\\x00'] (its key)", "NUL"),
        ([["ok", "\ud800"]], None, None, "args[0][1]", "surrogate"),
        (
            None,
            None,
            {"preferred_node": "n\x00"},
            "bidding options of demo.tasks.extract: preferred_node",
            "NUL",
        ),
    ],
    ids=["nul-in-an-argument", "nul-in-a-key", "lone-surrogate", "nul-in-an-option"],
)
def test_a_string_the_store_cannot_keep_is_refused_naming_where_it_is(
    args: Any,
    kwargs: Any,
    options: Any,
    where: str,
    what: str,
) -> None:
    # given a call whose arguments or options hold a string PostgreSQL cannot keep (a NUL
    # character; half of a surrogate pair, which UTF-8 cannot encode)
    # when its announcement is built (in .delay(), before anything is written)
    with pytest.raises(ConfigurationError) as info:
        build(args=args, kwargs=kwargs, options=options)
    # then it is refused, naming where the string is and what it holds
    assert where in str(info.value) and what in str(info.value)


def test_strings_json_escapes_that_every_store_keeps_are_accepted() -> None:
    # given arguments with a backslash-u-0000 text, an emoji (a surrogate pair in JSON) and
    # non-ASCII text
    announcement = build(args=["\\u0000", "\U0001f600", "\u00e9t\u00e9"], kwargs={"k": "\\ud800"})
    # then they are accepted as they are
    assert announcement.args == ["\\u0000", "\U0001f600", "\u00e9t\u00e9"]


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"priority": 12}, "priority"),
        ({"window": -1}, "window"),
        ({"min_confidence": 1.5}, "min_confidence"),
        ({"budget": -0.1}, "budget"),
        ({"no_bid": "retry"}, "no_bid"),
        ({"required_skills": [" "]}, "required_skills"),
        ({"bid_mode": "auction"}, "bid_mode"),
    ],
)
def test_bad_option_value_names_the_field(options, field):
    # given an option value out of range or of the wrong kind
    with pytest.raises(ConfigurationError) as info:
        build(options=options)
    # then the error names the task and the field
    message = str(info.value)
    assert message.startswith("bidding options of demo.tasks.extract: ")
    assert f"{field}: " in message


BAD_POLICIES = {
    # id: (retry policy as a dict, what the error must say after the task's name)
    "out-of-range": (
        {"max_retries": -1},
        "retry_policy.max_retries: Input should be greater than or equal to 0 (got -1)",
    ),
    "unknown-key": (
        {"max_retry": 3},
        "retry_policy.max_retry: Extra inputs are not permitted (got 3)",
    ),
}


@pytest.mark.parametrize("case", list(BAD_POLICIES), ids=list(BAD_POLICIES))
@pytest.mark.parametrize("where", ["apply_async-bidding", "task-retry_policy"])
def test_bad_retry_policy_dict_names_the_field_and_reason_once(case, where, monkeypatch):
    from celery import Celery

    import bidding
    from bidding.config import celery_conf

    for name in [k for k in os.environ if k.startswith("BIDDING_")]:
        monkeypatch.delenv(name)
    policy, expected = BAD_POLICIES[case]
    app = Celery("t", set_as_current=False)
    app.conf.update(celery_conf("memory://"))
    bidding.install(app)

    # given a task whose retry policy is a dict with a bad field: on the task, or in a call
    @app.task(
        base=bidding.BiddingTask,
        name="demo.tasks.extract",
        required_skills=["x"],
        retry_policy=policy if where == "task-retry_policy" else None,
        shared=False,
    )
    def extract() -> None:
        """The task body never runs: the call is refused before it is announced."""

    options = {"retry_policy": policy} if where == "apply_async-bidding" else None

    # when it is called
    with pytest.raises(ConfigurationError) as info:
        extract.apply_async(bidding=options)

    # then the error names the task, then the field and the reason, once
    assert str(info.value) == f"bidding options of demo.tasks.extract: {expected}"


def test_unknown_strategy_name_is_refused_at_once():
    # given a strategy name that is not registered
    with pytest.raises(UnknownStrategyError) as info:
        build(options={"strategy": "cheapest"})
    # then the error names it and lists the valid names
    assert "'cheapest'" in str(info.value)
    assert "weighted" in str(info.value)


def test_unknown_strategy_from_settings_is_refused_too():
    # given settings naming an unregistered strategy
    # then building any announcement fails
    with pytest.raises(UnknownStrategyError):
        build(conf=settings(strategy="nope"))


def test_strategy_object_is_recorded_by_its_name():
    # given strategy objects: a registered built-in and an importable custom class, whose
    # path the callers and nodes allow (bidding_allowed_strategies)
    path = "tests.unit.test_announce:ModuleLevelStrategy"
    # then each is recorded as a name a worker can resolve
    assert build(options={"strategy": WeightedScore()}).strategy == "weighted"
    assert (
        build(
            options={"strategy": ModuleLevelStrategy}, conf=settings(allowed_strategies=[path])
        ).strategy
        == path
    )
    # and without that allowance the caller refuses it at once, saying how to allow it
    with pytest.raises(ConfigurationError, match="bidding_allowed_strategies"):
        build(options={"strategy": ModuleLevelStrategy})


def test_strategy_that_a_worker_cannot_import_is_refused():
    # given a strategy class defined inside a function (no importable path)
    class Local:
        def select(self, bids, announcement, capabilities):
            return None

    # when it is passed as the strategy
    with pytest.raises(ConfigurationError) as info:
        build(options={"strategy": Local()})
    # then the error says to register it
    assert "cannot be rebuilt on a worker" in str(info.value)
    assert "register_strategy" in str(info.value)


def test_single_string_skill_becomes_a_one_item_list():
    # given required_skills given as one string in the call options
    announcement = build(options={"required_skills": "gpu_inference"})
    # then it is a list of that one skill, not of its letters
    assert announcement.required_skills == ["gpu_inference"]


def test_single_string_skill_on_the_task_becomes_a_one_item_list():
    # given a task whose required_skills attribute is a single string
    announcement = build(task(required_skills="gpu"))
    # then it is a list of that one skill
    assert announcement.required_skills == ["gpu"]


def test_content_defaults_to_the_json_of_args_and_kwargs():
    # given args and kwargs
    announcement = build(args=(1, "two", [3.5]), kwargs={"lang": "fr", "n": None})
    # then the content is their JSON, as bidders judge it (tuple args become a list)
    assert announcement.content == '[[1, "two", [3.5]], {"lang": "fr", "n": null}]'
    assert json.loads(announcement.content) == [[1, "two", [3.5]], {"lang": "fr", "n": None}]


def test_content_without_arguments():
    # given no args and no kwargs
    # then the content is the JSON of an empty call
    assert build().content == "[[], {}]"


def test_the_announcers_schedule_to_start_timeout_is_kept_with_the_task():
    # given an announcer whose default gives winners 30 s to start
    announcement = build(conf=settings(schedule_to_start_timeout=30.0))
    # then the task carries it, so the sweepers that watch it go by the same limit
    assert announcement.schedule_to_start_timeout == 30.0
    # and the library's default is a finite 60 s (a winner that never starts does not keep
    # the task for ever); an announcer set to 0 gives none (0 is kept, so the sweepers do not
    # apply their own default), unless the call gives one
    assert build().schedule_to_start_timeout == 60.0
    assert build(conf=settings(schedule_to_start_timeout=0)).schedule_to_start_timeout == 0
    assert build(options={"schedule_to_start_timeout": 5}).schedule_to_start_timeout == 5
