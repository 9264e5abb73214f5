"""Workflow definitions: defaults, DAG validation, JMESPath references and rendering."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from sasflow.definition import WorkflowDefinition, parse_definition, render
from sasflow.errors import InvalidDefinitionError, MissingReferenceError


def step(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "agent": "flights", "action": "reserve", **extra}


def test_depends_on_defaults_to_the_previous_step() -> None:
    definition = parse_definition({"name": "chain", "steps": [step("a"), step("b"), step("c")]})
    assert definition.dependencies == {"a": (), "b": ("a",), "c": ("b",)}
    assert definition.order == ("a", "b", "c")
    assert definition.dependents == {"a": ("b",), "b": ("c",), "c": ()}


def test_explicit_depends_on_builds_a_dag_in_topological_order() -> None:
    definition = parse_definition(
        {
            "name": "dag",
            "steps": [
                step("join", depends_on=["left", "right"]),
                step("left", depends_on=[]),
                step("right", depends_on=[]),
            ],
        }
    )
    assert definition.order == ("left", "right", "join")


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([step("a", depends_on=["b"]), step("b", depends_on=["a"])], "cycle"),
        ([step("a", depends_on=["ghost"])], "unknown step 'ghost'"),
        ([step("a", depends_on=["a"])], "depends on itself"),
        ([step("a"), step("a")], "used twice"),
        ([step("a", input={"x.$": "input.[["})], "invalid JMESPath"),
        ([step("a", input={"x.$": "steps.b.output"}), step("b")], "not an earlier dependency"),
        ([step("a", input={"x.$": 42})], "must hold a JMESPath expression string"),
        ([step("a", timeout_seconds=2)], "greater than or equal to 5"),
        ([step("a"), step("b", input={"x.$": "inptu.traveller"})], r"must start with one of \['input', 'steps'\]"),
        ([step("a"), step("b", input={"x.$": "steps"})], "must name the step"),
        ([step("a"), step("b", input={"x.$": "steps.*.output"})], "must name the step"),
        ([step("a"), step("b", input={"x.$": "@"})], "must start with one of"),
        ([step("a", retry={"max_attempts": 3, "backoff_base_seconds": 5, "backoff_cap_seconds": 1})], "cap"),
    ],
)
def test_invalid_definitions_are_refused_with_the_reason(steps: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(InvalidDefinitionError, match=message):
        parse_definition({"name": "bad", "steps": steps})


def test_render_resolves_nested_references_and_leaves_literals_alone() -> None:
    template = {
        "who.$": "input.name",
        "nested": {"conf.$": "steps.a.output.code", "fixed": 1},
        "list": [{"n.$": "input.n"}],
    }
    context = {"input": {"name": "ada", "n": 3}, "steps": {"a": {"output": {"code": "FL-1"}}}}
    assert render(template, context) == {"who": "ada", "nested": {"conf": "FL-1", "fixed": 1}, "list": [{"n": 3}]}


def test_a_reference_that_finds_nothing_is_an_error_naming_the_path_and_the_expression() -> None:
    # Given a reference nested in a list of an object, whose expression finds nothing
    template = {"guest": {"names": ["fixed", {"first.$": "input.traveller.first"}]}}
    # When it is rendered, Then it fails at its path, naming the expression
    with pytest.raises(MissingReferenceError) as caught:
        render(template, {"input": {"traveller": {}}}, where="steps[book].input")
    assert (caught.value.path, caught.value.expression) == (
        "steps[book].input.guest.names[1].first",
        "input.traveller.first",
    )
    assert str(caught.value) == (
        "steps[book].input.guest.names[1].first: 'input.traveller.first' resolved to nothing "
        "(give a default to allow that)"
    )


def test_a_default_renders_when_the_expression_finds_nothing_and_only_then() -> None:
    template = {
        "n.$": {"expression": "input.nights", "default": 1},
        "none.$": {"expression": "input.x", "default": None},
    }
    assert render(template, {"input": {}}) == {"n": 1, "none": None}
    assert render(template, {"input": {"nights": 3, "x": False}}) == {"n": 3, "none": False}


def test_only_the_nullable_roots_may_find_nothing() -> None:
    # A compensation's `step.output` is unknown after a timeout: it may render null; `input` may not
    context = {"input": {}, "step": {"input": {}, "output": None}}
    assert render({"c.$": "step.output.code"}, context, nullable_roots=frozenset({"step"})) == {"c": None}
    with pytest.raises(MissingReferenceError, match=r"'input\.amount' resolved to nothing"):
        render({"a.$": "input.amount"}, context, nullable_roots=frozenset({"step"}))


@pytest.mark.parametrize(
    ("reference", "message"),
    [({"expression": "input.x"}, "must hold a JMESPath"), ({"expression": 3, "default": 1}, "must hold a JMESPath")],
)
def test_a_reference_object_needs_an_expression_and_a_default(reference: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidDefinitionError, match=message):
        parse_definition({"name": "bad", "steps": [step("a", input={"x.$": reference})]})


@pytest.mark.parametrize(
    ("steps", "index", "message"),
    [
        ([step("a"), step("b", depends_on=["a", "a"])], 1, "step 'b' lists 'a' in depends_on twice"),
        ([step("a"), step("b", depends_on=["b"])], 1, "step 'b' depends on itself"),
        ([step("a"), step("a")], 1, "step name 'a' is used twice"),
        (
            [step("a"), step("b", depends_on=["c"]), step("c", depends_on=["b"])],
            1,
            "depends_on has a cycle among ['b', 'c']",
        ),
        (
            [step("a"), step("b", input={"x.$": "steps.c.output"}), step("c")],
            1,
            "steps[b].input: 'steps.c.output' refers to step 'c', which is not an earlier dependency",
        ),
    ],
)
def test_a_validation_error_points_at_its_step_and_says_it_once(
    steps: list[dict[str, Any]], index: int, message: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        WorkflowDefinition.model_validate({"name": "bad", "steps": steps})
    assert [(e["loc"], e["msg"]) for e in caught.value.errors()] == [(("steps", index), message)]


def test_compensation_may_refer_to_its_own_step_but_an_action_may_not() -> None:
    ok = parse_definition(
        {"name": "c", "steps": [step("a", compensation={"action": "cancel", "input": {"c.$": "step.output.code"}})]}
    )
    assert ok.steps[0].compensation is not None
    with pytest.raises(InvalidDefinitionError, match=r"must start with one of \['input', 'steps'\]"):
        parse_definition({"name": "c", "steps": [step("a", input={"c.$": "step.output.code"})]})


def test_referenced_steps_lists_the_outputs_a_step_needs() -> None:
    definition = parse_definition(
        {"name": "r", "steps": [step("a"), step("b", input={"x.$": "steps.a.output.id", "y.$": "input.y"})]}
    )
    assert definition.referenced_steps("b") == {"a"}
    assert definition.referenced_steps("a") == set()


def test_references_inside_filters_and_under_input_are_not_mistaken_for_steps() -> None:
    definition = parse_definition(
        {
            "name": "refs",
            "steps": [
                step("a"),
                step("b", input={"x.$": "input.steps.later", "y.$": "input.items[?price > `3`].name"}),
                step("c", input={"z.$": "[input.a, steps.a.output.id, length(input.items)]"}),
            ],
        }
    )
    assert definition.referenced_steps("c") == {"a"}


def test_version_must_be_an_integer_not_a_string_or_bool() -> None:
    for version in ("1", True):
        with pytest.raises(InvalidDefinitionError, match="version"):
            parse_definition({"name": "v", "version": version, "steps": [step("a")]})


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"timeout_seconds": "30"}, "Input should be a valid integer"),
        ({"timeout_seconds": True}, "Input should be a valid integer"),
        ({"retry": {"max_attempts": "3"}}, "Input should be a valid integer"),
        ({"retry": {"backoff_base_seconds": "1"}}, "Input should be a valid number"),
        ({"input": {".$": "input.traveller"}}, "needs a name before '.$'"),
    ],
)
def test_values_are_taken_as_written_not_coerced(change: dict[str, object], problem: str) -> None:
    # Strict validation: a string or a boolean where a number belongs is an error, not a number
    step = {"name": "a", "agent": "flights", "action": "reserve", **change}
    with pytest.raises(InvalidDefinitionError, match=re.escape(problem)):
        parse_definition({"name": "strict", "steps": [step]})


def test_an_integer_is_a_valid_number_of_seconds() -> None:
    step = {"name": "a", "agent": "flights", "action": "reserve", "retry": {"backoff_base_seconds": 2}}
    assert parse_definition({"name": "ok", "steps": [step]}).steps[0].retry.backoff_base_seconds == 2.0
