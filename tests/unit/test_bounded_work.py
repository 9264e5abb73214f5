"""Bounded work per request: every failure while preparing a dispatch ends on the step that caused it, sizes are
measured without serialising, expressions are bounded, caches are bounded by bytes."""

from __future__ import annotations

import json
from typing import Any

import jmespath
import pytest

from sasflow.cache import BoundedCache
from sasflow.definition import parse_definition, render
from sasflow.errors import InvalidDefinitionError, PayloadTooLargeError
from sasflow.expressions import MAX_BUILT_BYTES, MAX_RENDER_BUILT_BYTES
from sasflow.limits import MAX_EXPRESSION_CHARS, MAX_EXPRESSIONS, MAX_STEP_INPUT_BYTES, json_size
from sasflow.states import StepStatus, WorkflowStatus
from tests.support.pipeline import TRIP_INPUT, Pipeline, trip_definition


def big_blob_trip() -> dict[str, Any]:
    """The sample trip whose hotel step sends the workflow's 300 KB ``blob`` (over an SQS message)."""
    definition = trip_definition()
    definition["steps"][1]["input"]["blob.$"] = "input.blob"
    return definition


def test_a_step_input_over_the_limit_fails_that_step_in_one_scheduler_call_and_the_trip_unwinds() -> None:
    # Given a trip whose step 2 refers to a 300 KB part of the input (accepted: the input fits in the item)
    p = Pipeline()
    blob = "x" * 300_000
    wid = p.start(big_blob_trip(), {**TRIP_INPUT, "blob": blob})
    # When the flight's reply is applied, in one scheduler call
    p.run_agent("flights")
    applied = p.run_scheduler()
    # Then step 2 is FAILED with INPUT_TOO_LARGE, its size and the limit, and step 1's compensation was dispatched
    assert applied == 1
    snapshot = p.snapshot(wid)
    hotel = snapshot.steps["book_hotel"]
    assert (hotel.status, hotel.attempt, hotel.may_have_happened) == (StepStatus.FAILED, 0, False)
    assert hotel.error is not None and hotel.error["code"] == "INPUT_TOO_LARGE"
    assert f"the limit is {MAX_STEP_INPUT_BYTES} bytes" in hotel.error["message"]
    assert "the input of step book_hotel is 3000" in hotel.error["message"]
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATING
    assert snapshot.workflow.reason == "step book_hotel failed: INPUT_TOO_LARGE"
    assert snapshot.steps["reserve_flight"].status is StepStatus.COMPENSATING
    assert [r.action for r in p.requests("flights")] == ["cancel_reservation"]
    assert p.requests("hotels") == []
    # and the unwind ends COMPENSATED: the flight undone, the hotel never called
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATED
    assert p.services["hotels"].calls == []
    assert p.services["flights"].actions() == ["reserve", "cancel_reservation"]


def test_a_first_step_that_cannot_be_sent_is_refused_at_the_start_and_nothing_is_written() -> None:
    # Given a trip whose first step sends the whole 300 KB blob
    p = Pipeline()
    definition = trip_definition()
    definition["steps"][0]["input"]["blob.$"] = "input.blob"
    # When it is started
    with pytest.raises(PayloadTooLargeError) as refused:
        p.start(definition, {**TRIP_INPUT, "blob": "x" * 300_000})
    # Then the start is refused (the API's 413) and nothing was stored or sent
    assert refused.value.limit == MAX_STEP_INPUT_BYTES
    assert refused.value.what == "the input of step reserve_flight"
    assert p.store.writes == {}
    assert p.bus.sent == 0


def test_an_expression_that_multiplies_the_input_is_measured_without_building_it() -> None:
    # Given a 100 KB input named 50 times by one expression (5 MB once serialised, a few bytes in memory)
    blob = "y" * 100_000
    value = [blob] * 50
    # When its size is measured against the step limit
    with pytest.raises(PayloadTooLargeError) as refused:
        json_size(value, MAX_STEP_INPUT_BYTES, what="the input")
    # Then it is refused with the size counted so far, which passed the limit
    assert refused.value.size > MAX_STEP_INPUT_BYTES
    assert json_size({"a": [1, "é", None, True]}, 100) == len(
        json.dumps({"a": [1, "é", None, True]}, separators=(",", ":"), ensure_ascii=False).encode()
    )


def test_an_input_that_fails_to_render_at_run_time_fails_its_step_with_the_reason() -> None:
    # Given a step whose expression applies sum() to a string output (valid JMESPath, wrong type at run time)
    p = Pipeline()
    definition = trip_definition()
    definition["steps"][1]["input"] = {"total.$": "sum(steps.reserve_flight.output.confirmation)"}
    wid = p.start(definition, TRIP_INPUT)
    # When the flight's reply is applied
    p.run_agent("flights")
    p.run_scheduler()
    # Then the hotel step failed with INPUT_NOT_RENDERED naming the JMESPath error, and the flight is compensated
    hotel = p.snapshot(wid).steps["book_hotel"]
    assert hotel.status is StepStatus.FAILED
    assert hotel.error is not None and hotel.error["code"] == "INPUT_NOT_RENDERED"
    assert "JMESPathTypeError" in hotel.error["message"]
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATED


def test_a_compensation_that_cannot_be_prepared_ends_compensation_failed_with_the_reason() -> None:
    # Given a flight whose compensation input multiplies the flight's output past the step limit
    p = Pipeline()
    p.services["flights"].script["reserve"] = ["ok"]
    definition = trip_definition()
    definition["steps"][0]["compensation"]["input"] = {"copies.$": "[input.blob, input.blob, input.blob]"}
    p.services["payments"].script["charge"] = ["reject"]
    wid = p.start(definition, {**TRIP_INPUT, "blob": "z" * 100_000})
    # When the trip unwinds after the payment is refused
    p.pump()
    # Then the flight's compensation could not be sent: COMPENSATION_FAILED, waiting for a person, with the reason
    snapshot = p.snapshot(wid)
    flight = snapshot.steps["reserve_flight"]
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATION_FAILED
    assert flight.status is StepStatus.COMPENSATION_FAILED
    assert flight.comp_error is not None and flight.comp_error["code"] == "INPUT_TOO_LARGE"
    assert snapshot.steps["book_hotel"].status is StepStatus.COMPENSATED
    assert "cancel_reservation" not in p.services["flights"].actions()


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("(" * 40 + "input" + ")" * 40, "nested deeper than 32 levels"),
        ("!" * 40 + "input", "nested deeper than 32 levels"),
        ("input." + "a" * MAX_EXPRESSION_CHARS, f"at most {MAX_EXPRESSION_CHARS}"),
    ],
)
def test_pathological_expressions_are_refused_as_invalid_definitions(expression: str, reason: str) -> None:
    definition = trip_definition()
    definition["steps"][0]["input"] = {"x.$": expression}
    with pytest.raises(InvalidDefinitionError, match=reason):
        parse_definition(definition)


def test_a_definition_with_too_many_expressions_is_refused() -> None:
    definition = trip_definition()
    definition["steps"][0]["input"] = {f"k{i}.$": "input.traveller" for i in range(MAX_EXPRESSIONS + 1)}
    # the 257 of step 1 and the 4 of the rest of the trip
    with pytest.raises(InvalidDefinitionError, match=f"holds {MAX_EXPRESSIONS + 5} JMESPath expressions"):
        parse_definition(definition)


def test_the_cache_is_bounded_by_bytes_and_keeps_the_most_recently_used() -> None:
    cache: BoundedCache[str, str] = BoundedCache(max_bytes=100, max_entries=10)
    cache.put("a", "A", 40)
    cache.put("b", "B", 40)
    assert cache.get("a") == "A"  # a is now the most recent
    cache.put("c", "C", 40)  # 120 bytes: the least recently used (b) leaves
    assert (cache.get("b"), cache.get("a"), cache.get("c"), cache.bytes) == (None, "A", "C", 80)
    cache.put("huge", "H", 101)  # heavier than the whole cache: not kept, nothing else evicted
    assert (len(cache), cache.get("huge"), cache.bytes) == (2, None, 80)


def _tripling(times: int, wrap: str = "length") -> str:
    # join(@, [@, @]) makes a string three times as long as @ (the trial's memory attack on the API: 2 KB of body).
    return f"{wrap}(input.pad" + " | join(@, [@, @])" * times + ")"


@pytest.mark.parametrize(
    ("expression", "what"),
    [
        (_tripling(12), "join"),  # 1,000 * 3**12 characters: 531 MB if built
        ("length(input.items" + " | [@, @][]" * 40 + ")", "flatten"),  # 2**40 list elements if built
        ("length(to_string(input" + "".join(" | [@, @]" for _ in range(40)) + "))", "to_string"),
    ],
)
def test_an_expression_that_builds_more_than_a_record_holds_is_refused_before_it_builds_it(
    expression: str, what: str
) -> None:
    # Given a first step whose input expression grows its operand exponentially (a result that is only a number)
    p = Pipeline()
    definition = trip_definition()
    definition["steps"][0]["input"] = {"x.$": expression}
    # When it is started
    with pytest.raises(PayloadTooLargeError) as refused:
        p.start(definition, {**TRIP_INPUT, "pad": "x" * 1000, "items": list(range(10))})
    # Then it is refused (413) naming the primitive, with the limit of one built value, and nothing is written
    assert refused.value.what == f"a value an input expression builds ({what})"
    assert refused.value.limit == MAX_BUILT_BYTES
    assert refused.value.size > MAX_BUILT_BYTES
    assert p.store.writes == {}


def test_an_expression_that_builds_within_the_limits_renders_as_jmespath_does() -> None:
    # Given expressions that join, flatten and serialise within the limits
    context = {"input": {"pad": "ab", "items": [[1, 2], [3]], "doc": {"k": [1, "é"]}}}
    # Then they render exactly as plain JMESPath renders them
    template = {
        "j.$": "join('-', [input.pad, input.pad])",
        "f.$": "input.items[]",
        "s.$": "to_string(input.doc)",
        "n.$": "length(input.pad | join(@, [@, @]))",
    }
    assert render(template, context) == {"j": "ab-ab", "f": [1, 2, 3], "s": '{"k":[1,"\\u00e9"]}', "n": 6}
    assert render(template, context)["s"] == jmespath.search("to_string(input.doc)", context)


def test_the_values_one_rendering_builds_are_bounded_in_all() -> None:
    # Given an input whose 5 expressions each build 200 KB (each under the limit of one value, 1 MB in all)
    template = {f"k{i}.$": "join('', [input.pad, input.pad])" for i in range(5)}
    # When it is rendered
    with pytest.raises(PayloadTooLargeError) as refused:
        render(template, {"input": {"pad": "x" * 100_000}})
    # Then the fifth is refused: the total passed the rendering's budget
    assert refused.value.what == "the values one input's expressions build"
    assert refused.value.limit == MAX_RENDER_BUILT_BYTES
    assert refused.value.size == 5 * 200_000


def test_a_definition_version_beyond_a_signed_32_bit_integer_is_refused() -> None:
    # The trial's 500: a version of 10**38 could not be written as a DynamoDB number. It is a validation error now.
    definition = trip_definition()
    definition["version"] = 2_147_483_648
    with pytest.raises(InvalidDefinitionError, match="less than or equal to 2147483647"):
        parse_definition(definition)
    definition["version"] = 2_147_483_647
    assert parse_definition(definition).version == 2_147_483_647
