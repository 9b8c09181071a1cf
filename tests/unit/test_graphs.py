"""Task graphs (issue 12), pure parts: the definition's validation and the templates."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from bidding.errors import ConfigurationError
from bidding.graphs.advance import task_result
from bidding.graphs.plan import ready
from bidding.graphs.spec import load_definition
from bidding.graphs.templates import TemplateError, apply_mapping, resolve
from bidding.graphs.validate import GraphValidationError, check


class FakeTask:
    """What validation needs of a registered task: its name and its body's signature."""

    def __init__(self, name: str, run: Any) -> None:
        self.name = name
        self.run = run


def _extract(paper_pdf_url: str, max_pages: int = 50) -> dict[str, Any]:
    return {}


def _analyze(text: str) -> dict[str, Any]:
    return {}


def _aggregate(raw_text: str, nlp_results: list[str]) -> dict[str, Any]:
    return {}


TASKS = {"pdf_text_extraction": FakeTask("demo.extract", _extract),
         "nlp_analysis": FakeTask("demo.analyze", _analyze),
         "orchestration": FakeTask("demo.aggregate", _aggregate)}

#: Seed 004's research-paper example (sections 2.1 and 3.1).
PAPER: dict[str, Any] = {
    "name": "Research Paper Analysis",
    "input": {"type": "object", "required": ["paper_pdf_url"],
              "properties": {"paper_pdf_url": {"type": "string", "format": "uri"},
                             "max_pages": {"type": "integer", "default": 50}}},
    "input_values": {"paper_pdf_url": "https://example.org/paper.pdf"},
    "subtasks": [
        {"subtask_id": "subtask_1", "name": "Extract Text from PDF",
         "agent_capability": "pdf_text_extraction",
         "input": {"paper_pdf_url": "${parent.input.paper_pdf_url}",
                   "max_pages": "${parent.input.max_pages}"},
         "output_mapping": {"extracted_text": "raw_text"}, "priority": 1},
        {"subtask_id": "subtask_2", "name": "Analyze Text with NLP",
         "agent_capability": "nlp_analysis", "depends_on": ["subtask_1"],
         "input": {"text": "${subtask_1.output.raw_text}"},
         "output_mapping": {"analysis": "nlp_results"}, "priority": 2},
        {"subtask_id": "subtask_3", "name": "Aggregate Results",
         "agent_capability": "orchestration", "depends_on": ["subtask_1", "subtask_2"],
         "input": {"raw_text": "${subtask_1.output.raw_text}",
                   "nlp_results": "${subtask_2.output.nlp_results}"},
         "output_mapping": {}, "priority": 3},
    ],
}


def errors(spec: dict[str, Any], tasks: dict[str, Any] | None = None) -> str:
    defn = load_definition(spec)
    with pytest.raises(GraphValidationError) as caught:
        check(defn, defn.input_with_defaults(), TASKS if tasks is None else tasks)
    return str(caught.value)


def paper() -> dict[str, Any]:
    return copy.deepcopy(PAPER)


def test_the_seed_example_is_valid() -> None:
    # given seed 004's three-step example with the registered capabilities
    defn = load_definition(paper())
    # when it is validated, then nothing is wrong, and max_pages takes the schema's default
    check(defn, defn.input_with_defaults(), TASKS)
    assert defn.input_with_defaults()["max_pages"] == 50


def test_a_duplicate_id_is_named() -> None:
    # given two subtasks with one id
    spec = paper()
    spec["subtasks"][2]["subtask_id"] = "subtask_2"
    # then the error names the id
    assert "subtask subtask_2: subtask_id is used by 2 subtasks" in errors(spec)


def test_an_unknown_dependency_is_named() -> None:
    spec = paper()
    spec["subtasks"][1]["depends_on"] = ["subtask_0"]
    message = errors(spec)
    assert "subtask subtask_2: depends_on names unknown subtask 'subtask_0'" in message


def test_a_cycle_names_its_subtasks() -> None:
    # given subtask_1 depending on subtask_3, which depends on it
    spec = paper()
    spec["subtasks"][0]["depends_on"] = ["subtask_3"]
    message = errors(spec)
    # then the error names every subtask of the cycle, in order
    assert "depends_on makes a cycle" in message
    assert "subtasks subtask_1, subtask_3: depends_on makes a cycle " \
        "(subtask_1 -> subtask_3 -> subtask_1)" in message


def test_a_template_naming_a_non_dependency_is_refused() -> None:
    # given subtask_2 reading subtask_3's output, which it does not depend on
    spec = paper()
    spec["subtasks"][1]["input"]["text"] = "${subtask_3.output.hypothesis}"
    message = errors(spec)
    assert ("subtask subtask_2: input.text: template ${subtask_3.output.hypothesis}: "
            "subtask_3 is not a dependency of subtask_2") in message


def test_a_transitive_dependency_may_be_read() -> None:
    # given subtask_3 depending on subtask_2 only, reading subtask_1 (a dependency of it)
    spec = paper()
    spec["subtasks"][2]["depends_on"] = ["subtask_2"]
    defn = load_definition(spec)
    # then it is valid
    check(defn, defn.input_with_defaults(), TASKS)


def test_a_template_naming_an_unmapped_field_is_refused() -> None:
    # given a template asking for subtask_1's "extracted_text", which its mapping renames
    spec = paper()
    spec["subtasks"][1]["input"]["text"] = "${subtask_1.output.extracted_text}"
    message = errors(spec)
    assert ("subtask subtask_2: input.text: template ${subtask_1.output.extracted_text}: "
            "subtask_1's output_mapping does not produce 'extracted_text'") in message


def test_an_input_not_matching_the_schema_is_refused() -> None:
    # given max_pages as a string, and no paper_pdf_url
    spec = paper()
    spec["input_values"] = {"max_pages": "ten"}
    message = errors(spec)
    assert "input.max_pages: 'ten' is not of type 'integer'" in message
    assert "'paper_pdf_url' is a required property" in message


def test_nan_or_infinity_in_the_input_is_refused_naming_where() -> None:
    # given NaN and infinity in the task's input values and in a subtask's literal input
    # (JSON has neither: its announcement would store null)
    spec = paper()
    spec["input_values"]["weights"] = {"a": [1.0, float("inf")]}
    spec["subtasks"][1]["input"]["threshold"] = float("nan")
    message = errors(spec, {**TASKS, "nlp_analysis": FakeTask("demo.analyze", _any)})
    # then each is named, with the reason
    assert "input['weights']['a'][1]: Infinity is not JSON" in message
    assert "subtask subtask_2: input['threshold']: NaN is not JSON" in message


def test_input_over_the_arguments_limit_is_refused_naming_where_and_its_size() -> None:
    # given input values and a subtask's literal input each over a 1024-byte limit (their
    # JSON is what a subtask's announcement carries)
    spec = paper()
    spec["input_values"]["notes"] = "n" * 1100
    spec["subtasks"][1]["input"]["glossary"] = ["g" * 600, "h" * 600]
    defn = load_definition(spec)
    values = defn.input_with_defaults()
    tasks = {**TASKS, "nlp_analysis": FakeTask("demo.analyze", _any)}
    # when it is checked with bidding_max_arguments_bytes = 1024
    with pytest.raises(GraphValidationError) as caught:
        check(defn, values, tasks, max_arguments_bytes=1024)
    # then each is named, with its size and the setting
    message = str(caught.value)
    assert (f"input: {len(json.dumps(values))} bytes of JSON, more than "
            "bidding_max_arguments_bytes (1024)") in message
    literal = spec["subtasks"][1]["input"]
    assert (f"subtask subtask_2: input: {len(json.dumps(literal))} bytes of JSON, more than "
            "bidding_max_arguments_bytes (1024)") in message
    # and within the default limit the same definition is valid
    check(defn, values, tasks)


def _any(**kwargs: Any) -> dict[str, Any]:
    return {}


def test_a_capability_without_a_task_is_refused() -> None:
    spec = paper()
    spec["subtasks"][2]["agent_capability"] = "summarization"
    message = errors(spec)
    assert ("subtask subtask_3: agent_capability 'summarization': no registered task "
            "implements it") in message


def test_an_argument_the_task_does_not_take_is_refused() -> None:
    spec = paper()
    spec["subtasks"][1]["input"]["language"] = "en"
    assert "subtask subtask_2: input.language: task demo.analyze (nlp_analysis) takes no " \
        "argument 'language'" in errors(spec)


def test_a_task_without_subtasks_needs_a_capability() -> None:
    assert "a task needs subtasks or an agent_capability" in errors({"name": "empty"})


def test_every_error_is_reported_at_once() -> None:
    spec = paper()
    spec["subtasks"][1]["depends_on"] = ["nope"]
    spec["subtasks"][2]["agent_capability"] = "nothing"
    defn = load_definition(spec)
    with pytest.raises(GraphValidationError) as caught:
        check(defn, defn.input_with_defaults(), TASKS)
    assert len(caught.value.errors) >= 2


def test_a_malformed_definition_names_the_field() -> None:
    with pytest.raises(ConfigurationError, match=r"subtasks\.0\.agent_capability"):
        load_definition({"name": "x", "subtasks": [{"subtask_id": "a"}]})


# --- templates ------------------------------------------------------------------------------


def test_a_whole_value_template_keeps_its_json_type() -> None:
    # given "${parent.input.max_pages}" and max_pages = 50
    resolved = resolve({"max_pages": "${parent.input.max_pages}",
                        "flags": ["${parent.input.flags}"]},
                       {"max_pages": 50, "flags": {"a": True}}, {})
    # then it resolves to the integer, and a mapping stays a mapping
    assert resolved == {"max_pages": 50, "flags": [{"a": True}]}


def test_a_template_inside_text_is_replaced_by_its_text() -> None:
    resolved = resolve("pages: ${parent.input.n}, text: ${s1.output.raw_text}",
                       {"n": 3}, {"s1": {"raw_text": "abc"}})
    assert resolved == "pages: 3, text: abc"


def test_a_missing_field_is_named() -> None:
    with pytest.raises(TemplateError, match=r"s1.output has no field 'text'"):
        resolve("${s1.output.text}", {}, {"s1": {"raw_text": "abc"}})


def test_a_malformed_template_is_named() -> None:
    with pytest.raises(TemplateError, match=r"\$\{s1.input.x\}"):
        resolve("${s1.input.x}", {}, {})


def test_output_mapping_renames_for_downstream() -> None:
    # given a task output with extracted_text, and seed 004's mapping
    mapped = apply_mapping({"extracted_text": "t", "pages": 3}, {"extracted_text": "raw_text"},
                           "subtask_1")
    # then downstream sees raw_text only
    assert mapped == {"raw_text": "t"}
    assert apply_mapping({"a": 1}, {}, "s") == {"a": 1}
    with pytest.raises(TemplateError, match="subtask_1: output has no field 'extracted_text'"):
        apply_mapping({"text": "t"}, {"extracted_text": "raw_text"}, "subtask_1")


def test_the_result_is_the_merged_output_of_the_sinks() -> None:
    # given a diamond a -> (b, c) -> d, and two sinks d and e
    spec = {"name": "g", "subtasks": [
        {"subtask_id": "a", "agent_capability": "x"},
        {"subtask_id": "d", "agent_capability": "x", "depends_on": ["a"]},
        {"subtask_id": "e", "agent_capability": "x", "depends_on": ["a"]}]}
    defn = load_definition(spec)
    outputs = {"a": {"v": 1}, "d": {"d": 2}, "e": {"e": 3}}
    assert task_result(defn, {}, outputs) == {"d": 2, "e": 3}
    # and the spec's own output_mapping says otherwise when given
    spec["output_mapping"] = {"total": "${a.output.v}", "d": "renamed"}
    assert task_result(load_definition(spec), {}, outputs) == {"total": 1, "renamed": 2}


def test_ready_subtasks_come_most_urgent_first() -> None:
    # Given subtasks ready together: one of priority 3, one "high", one with none (the task's)
    spec = {"name": "g", "subtasks": [
        {"subtask_id": "a", "agent_capability": "x", "priority": 3},
        {"subtask_id": "b", "agent_capability": "x", "priority": "high"},
        {"subtask_id": "d", "agent_capability": "x"},
        {"subtask_id": "c", "agent_capability": "x", "depends_on": ["a", "b"]}]}
    steps = load_definition(spec).steps()
    # Then the higher number goes first, as everywhere: high (8), the task's normal (5), then 3
    assert [s.subtask_id for s in ready(steps, set(), set())] == ["b", "d", "a"]
    # And under a LOW task, the subtask without a priority of its own comes after 3
    assert [s.subtask_id for s in ready(steps, set(), set(), default=2)] == ["b", "a", "d"]
    assert [s.subtask_id for s in ready(steps, {"a", "d"}, {"a", "b", "d"})] == []
    assert [s.subtask_id for s in ready(steps, {"a", "b", "d"}, {"a", "b", "d"})] == ["c"]


def test_a_yaml_file_is_read(tmp_path: Any) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("name: one\nagent_capability: nlp_analysis\n"
                    "input_values: {text: hello}\n")
    defn = load_definition(str(path))
    # a task without subtasks is one step for its capability, with the parent's input
    assert [(s.subtask_id, s.agent_capability, s.input) for s in defn.steps()] == [
        ("task", "nlp_analysis", {"text": "${parent.input.text}"})]


# --- fallbacks (AITP 6.2) -------------------------------------------------------------------


def test_the_seeds_fallbacks_map_onto_each_subtasks_announcement() -> None:
    # given the seed's fallback block on the task, and one subtask overriding one of them
    from bidding.graphs.advance import options

    spec = paper()
    spec["metadata"] = {"fallback": {
        "on_agent_offline": {"strategy": "SELECT_NEXT_BEST"},
        "on_timeout": {"strategy": "RETRY_WITH_TIMEOUT_EXTENSION",
                       "extended_timeout_seconds": 7200},
        "on_cost_exceeded": {"strategy": "FAIL_AND_NOTIFY",
                             "notification": "Task exceeded budget"},
        "on_capability_unavailable": {"strategy": "DEFER", "defer_seconds": 300}}}
    spec["subtasks"][1]["fallback"] = {"on_capability_unavailable": {"strategy": "FAIL"}}
    defn = load_definition(spec)
    first, second, _ = defn.subtasks
    # then each subtask's announcement carries them as bidding's fallbacks
    assert options(defn, first, None)["fallbacks"] == {
        "on_agent_offline": "next_best", "on_timeout": "extend",
        "extended_timeout_seconds": 7200, "on_capability_unavailable": "defer",
        "defer_seconds": 300}
    assert options(defn, second, None)["fallbacks"]["on_capability_unavailable"] == "fail"


def test_an_unknown_fallback_strategy_is_named_with_the_choices() -> None:
    # given a typo in a fallback strategy
    spec = paper()
    spec["metadata"] = {"fallback": {"on_capability_unavailable": {"strategy": "DEFFER"}}}
    # then the definition is refused, naming the field, the value and what is allowed
    with pytest.raises(ConfigurationError,
                       match=r"on_capability_unavailable\.strategy: 'DEFFER' is not one of "
                             r"DEFER, FAIL"):
        load_definition(spec)


# --- cost_limit -----------------------------------------------------------------------------


def test_parallel_subtasks_share_the_cost_limit_and_never_exceed_it() -> None:
    from bidding.graphs.plan import budget_share

    # given a limit of 10 and three subtasks not started yet
    # when the first two start together, then each gets a third, not all 10
    first = budget_share(10.0, 0.0, 0.0, 3)
    second = budget_share(10.0, 0.0, first, 2)
    assert first == pytest.approx(10 / 3) and second == pytest.approx(10 / 3)
    # when the first finishes having spent 1, the last gets what is left of the limit
    last = budget_share(10.0, 1.0, second, 1)
    assert last == pytest.approx(10 - 1 - 10 / 3)
    # then the budgets outstanding at any time never add up to more than the limit
    assert 1.0 + second + last <= 10.0 + 1e-9
    # and nothing is left to give once the limit is spent
    assert budget_share(10.0, 10.0, 0.0, 2) == 0.0
