"""Workflow definitions: steps, retry policies, compensations, dependencies and JMESPath references.

A definition is JSON validated by pydantic. Each step names the agent (remote service) and the action, an input, a
timeout, a retry policy and an optional compensation. ``depends_on`` defaults to the previous step, so a plain list of
steps is a chain; explicit ``depends_on`` lists make a DAG.

Input references follow the convention of Step Functions' ``Parameters``: a key ending in ``.$`` holds a JMESPath
expression evaluated against the context ``{"input": <workflow input>, "steps": {<name>: {"output": ...}}}``.
A compensation input may also use ``step.input`` and ``step.output`` (the compensated step's rendered input and its
output, or null when its outcome is unknown).
"""

from __future__ import annotations

import hashlib
import json
import re
from functools import cached_property
from typing import Any, Literal

from jmespath.exceptions import JMESPathError
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, field_validator, model_validator

from .errors import InvalidDefinitionError
from .expressions import RenderBudget, compiled, evaluate
from .limits import MAX_EXPRESSION_CHARS, MAX_EXPRESSION_NESTING, MAX_EXPRESSIONS, nesting_depth
from .types import ActionName, AgentName, StepName

_REF_SUFFIX = ".$"
_STEP_REF = re.compile(r"\bsteps\.([A-Za-z][A-Za-z0-9_]*)")
_ROOTS = ("input", "steps", "step")
MAX_STEPS = 50


class RetryPolicy(BaseModel):
    """How often a step is attempted and how long to wait between tries.

    ``max_attempts`` counts dispatches of the step (attempt 1 .. max_attempts). Inside one attempt the agent also
    retries transient remote failures with exponential backoff (``backoff_base_seconds * 2**n`` capped at
    ``backoff_cap_seconds``, with full jitter when ``jitter`` is true; AWS Architecture Blog, "Exponential Backoff
    and Jitter").
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_attempts: int = Field(default=3, ge=1, le=10)
    backoff_base_seconds: float = Field(default=1.0, gt=0, le=60)
    backoff_cap_seconds: float = Field(default=20.0, gt=0, le=900)
    jitter: StrictBool = True

    @model_validator(mode="after")
    def _cap_not_below_base(self) -> RetryPolicy:
        if self.backoff_cap_seconds < self.backoff_base_seconds:
            raise ValueError("backoff_cap_seconds must be >= backoff_base_seconds")
        return self


class CompensationDefinition(BaseModel):
    """The compensating action that undoes a step (Compensating Transaction pattern).

    Each compensation attempt makes one remote call; a failed attempt is dispatched again after the policy's
    backoff (an SQS delay), so every retry is a supervised attempt with its own complete-by. The default policy is
    more patient than a forward step's, because a compensation that gives up needs a person.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    action: ActionName
    input: dict[str, Any] = Field(default_factory=dict)
    timeout_seconds: int = Field(default=30, ge=5, le=900)
    retry: RetryPolicy = Field(
        default_factory=lambda: RetryPolicy(max_attempts=5, backoff_base_seconds=2.0, backoff_cap_seconds=60.0)
    )


class StepDefinition(BaseModel):
    """One step of a workflow: an action on one remote service, done by that service's agent."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: StepName
    agent: AgentName
    action: ActionName
    input: dict[str, Any] = Field(default_factory=dict)
    timeout_seconds: int = Field(
        default=30, ge=5, le=900, description="Seconds from dispatch to complete-by (the agent keeps 2 s to reply)."
    )
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    compensation: CompensationDefinition | None = None
    depends_on: list[StepName] | None = Field(
        default=None, description="Steps that must complete first; null means the previous step."
    )
    on_failure: Literal["compensate", "hold"] | None = Field(
        default=None,
        description="When the step fails for good: compensate (unwind) or hold (wait for a person); null: the "
        "definition's policy.",
    )


class WorkflowDefinition(BaseModel):
    """A named, versioned list of steps that runs as one unit: it completes, or what was done is undone."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    version: StrictInt = Field(default=1, ge=1, le=2_147_483_647)
    steps: list[StepDefinition] = Field(min_length=1, max_length=MAX_STEPS)
    on_failure: Literal["compensate", "hold"] = Field(
        default="compensate",
        description="When a step fails for good (attempts used up, or refused): compensate what may have happened "
        "(the default), or hold the workflow for a person (HELD: retry, skip or compensate it through the operator "
        "routes).",
    )
    hold_timeout_seconds: int | None = Field(
        default=None,
        ge=60,
        le=31_536_000,
        description="Under the hold policy: compensate a workflow held for longer than this (seconds); null holds "
        "until a person acts.",
    )

    @field_validator("steps")
    @classmethod
    def _unique_names(cls, steps: list[StepDefinition]) -> list[StepDefinition]:
        seen: set[str] = set()
        for step in steps:
            if step.name in seen:
                raise ValueError(f"step name {step.name!r} is used twice")
            seen.add(step.name)
        return steps

    @model_validator(mode="after")
    def _valid_graph_and_references(self) -> WorkflowDefinition:
        names = [s.name for s in self.steps]
        deps = self.dependencies
        for name, parents in deps.items():
            for parent in parents:
                if parent not in names:
                    raise ValueError(f"step {name!r} depends on unknown step {parent!r}")
                if parent == name:
                    raise ValueError(f"step {name!r} depends on itself")
        order = _topological_order(names, deps)  # raises on a cycle
        ancestors = _ancestors(order, deps)
        count = sum(
            len(_expressions(step.input)) + (len(_expressions(step.compensation.input)) if step.compensation else 0)
            for step in self.steps
        )
        if count > MAX_EXPRESSIONS:
            raise ValueError(
                f"the definition holds {count} JMESPath expressions; at most {MAX_EXPRESSIONS} are allowed"
            )
        for step in self.steps:
            _check_template(step.input, f"steps[{step.name}].input", ancestors[step.name], allow_step=False)
            if step.compensation is not None:
                _check_template(
                    step.compensation.input,
                    f"steps[{step.name}].compensation.input",
                    ancestors[step.name],
                    allow_step=True,
                )
        return self

    @cached_property
    def content_id(self) -> str:
        """The definition's content address: 32 hex digits (128 bits) of the SHA-256 of its canonical JSON.

        Equal definitions (defaults filled in, keys sorted) have the same id, so the store keeps one copy of a
        definition however many workflows run it, and a workflow record carries only this id.
        """
        text = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]

    @cached_property
    def dependencies(self) -> dict[str, tuple[str, ...]]:
        """Map each step name to the names it depends on (the previous step when ``depends_on`` is null)."""
        result: dict[str, tuple[str, ...]] = {}
        previous: str | None = None
        for step in self.steps:
            if step.depends_on is None:
                result[step.name] = (previous,) if previous is not None else ()
            else:
                result[step.name] = tuple(dict.fromkeys(step.depends_on))
            previous = step.name
        return result

    @cached_property
    def dependents(self) -> dict[str, tuple[str, ...]]:
        """Map each step name to the steps that depend on it directly."""
        result: dict[str, list[str]] = {s.name: [] for s in self.steps}
        for name, parents in self.dependencies.items():
            for parent in parents:
                result[parent].append(name)
        return {k: tuple(v) for k, v in result.items()}

    @cached_property
    def descendants(self) -> dict[str, frozenset[str]]:
        """Map each step name to every step that depends on it, directly or transitively."""
        result: dict[str, frozenset[str]] = {}
        for name in reversed(self.order):
            acc: set[str] = set()
            for child in self.dependents[name]:
                acc |= {child} | result[child]
            result[name] = frozenset(acc)
        return result

    @cached_property
    def order(self) -> tuple[str, ...]:
        """Step names in a topological order that keeps the written order where dependencies allow."""
        return tuple(_topological_order([s.name for s in self.steps], self.dependencies))

    def failure_policy(self, name: str) -> str:
        """``compensate`` or ``hold``: what the failure of step ``name`` does (its own policy, or the definition's)."""
        return self.step(name).on_failure or self.on_failure

    def step(self, name: str) -> StepDefinition:
        """Return the step called ``name``.

        Raises
        ------
        KeyError
            When the definition has no such step.
        """
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)

    def referenced_steps(self, name: str) -> set[str]:
        """Names of the earlier steps whose outputs the input of step ``name`` refers to."""
        return set(_STEP_REF.findall(_expressions_text(self.step(name).input)))


def parse_definition(data: Any) -> WorkflowDefinition:
    """Validate ``data`` (a dict parsed from JSON) as a workflow definition.

    Raises
    ------
    InvalidDefinitionError
        With pydantic's message when the definition is invalid.
    """
    try:
        return WorkflowDefinition.model_validate(data)
    except ValueError as exc:  # pydantic.ValidationError is a ValueError
        raise InvalidDefinitionError(str(exc)) from exc


def render(template: dict[str, Any], context: dict[str, Any]) -> dict[str, Any]:
    """Resolve ``key.$`` JMESPath references in ``template`` against ``context``, recursively.

    Parameters
    ----------
    template:
        A step or compensation input; keys ending in ``.$`` hold JMESPath expressions.
    context:
        ``{"input": ..., "steps": {name: {"output": ...}}, "step": {...}}``.

    Returns
    -------
    dict
        A new dict where each ``key.$`` became ``key`` with the expression's value (null when nothing matches).

    Raises
    ------
    PayloadTooLargeError
        When an expression would build a value over its limit (``expressions.MAX_BUILT_BYTES``, or
        ``MAX_RENDER_BUILT_BYTES`` for all of them): it is refused before it is built.
    jmespath.exceptions.JMESPathError
        When a function is given a value of the wrong type.
    """
    return _render_value(template, context, RenderBudget())  # type: ignore[no-any-return]


def _render_value(value: Any, context: dict[str, Any], budget: RenderBudget) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, str) and key.endswith(_REF_SUFFIX) and isinstance(item, str):
                out[key[: -len(_REF_SUFFIX)]] = evaluate(item, context, budget)
            else:
                out[key] = _render_value(item, context, budget)
        return out
    if isinstance(value, list):
        return [_render_value(v, context, budget) for v in value]
    return value


def _expressions(value: Any) -> list[str]:
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and key.endswith(_REF_SUFFIX):
                if key == _REF_SUFFIX:
                    raise ValueError(f"{key!r} needs a name before {_REF_SUFFIX!r}: the key its value is rendered as")
                if not isinstance(item, str):
                    raise ValueError(f"{key!r} must hold a JMESPath expression string")
                found.append(item)
            else:
                found.extend(_expressions(item))
    elif isinstance(value, list):
        for item in value:
            found.extend(_expressions(item))
    return found


def _expressions_text(value: Any) -> str:
    return "\n".join(_expressions(value))


def _check_template(template: dict[str, Any], where: str, ancestors: set[str], *, allow_step: bool) -> None:
    allowed = set(_ROOTS) if allow_step else {"input", "steps"}
    for expression in _expressions(template):
        if len(expression) > MAX_EXPRESSION_CHARS:
            raise ValueError(
                f"{where}: a JMESPath expression of {len(expression)} characters; at most {MAX_EXPRESSION_CHARS}"
            )
        if nesting_depth(expression) > MAX_EXPRESSION_NESTING:
            raise ValueError(f"{where}: a JMESPath expression nested deeper than {MAX_EXPRESSION_NESTING} levels")
        try:
            parsed = compiled(expression).parsed
        except JMESPathError as exc:
            raise ValueError(f"{where}: invalid JMESPath {expression[:80]!r}: {exc}") from exc
        except RecursionError:
            raise ValueError(f"{where}: a JMESPath expression too deeply nested to parse") from None
        roots: set[str] = set()
        steps: set[str] = set()
        try:
            _walk(parsed, True, roots, steps)
        except RecursionError:
            raise ValueError(f"{where}: a JMESPath expression too deeply nested to check") from None
        if not roots or roots - allowed:
            raise ValueError(
                f"{where}: {expression!r} must start with one of {sorted(allowed)} (found {sorted(roots) or 'none'})"
            )
        if "steps" in roots and "*" in steps:
            raise ValueError(f"{where}: {expression!r} must name the step it reads: steps.<name>.output...")
        for ref in steps:
            if ref not in ancestors:
                raise ValueError(f"{where}: {expression!r} refers to step {ref!r}, which is not an earlier dependency")


def _walk(node: dict[str, Any], at_root: bool, roots: set[str], steps: set[str]) -> None:
    """Collect the root names an expression reads from the context, and the step names under ``steps``.

    Only the leftmost field of a path is evaluated against the context root; fields inside projections, filters
    and the right side of a pipe are relative to the elements they visit.
    """
    kind = node.get("type")
    children = node.get("children", [])
    if kind == "field":
        if at_root:
            roots.add(node["value"])
            if node["value"] == "steps":
                steps.add("*")  # bare `steps`: no step named
    elif kind == "current" and at_root:
        roots.add("@")
    elif kind in ("subexpression", "index_expression"):
        left, right = children[0], children[1]
        if at_root and left.get("type") == "field" and left.get("value") == "steps":
            roots.add("steps")
            steps.add(right["value"] if right.get("type") == "field" else "*")
        else:
            _walk(left, at_root, roots, steps)
        _walk(right, False, roots, steps)
    elif kind in ("projection", "value_projection", "filter_projection", "flatten", "pipe"):
        _walk(children[0], at_root, roots, steps)
        for child in children[1:]:
            _walk(child, False, roots, steps)
    else:
        for child in children:
            if isinstance(child, dict):
                _walk(child, at_root, roots, steps)


def _topological_order(names: list[str], deps: dict[str, tuple[str, ...]]) -> list[str]:
    done: list[str] = []
    placed: set[str] = set()
    remaining = list(names)
    while remaining:
        progressed = False
        for name in list(remaining):
            if all(parent in placed for parent in deps.get(name, ())):
                done.append(name)
                placed.add(name)
                remaining.remove(name)
                progressed = True
                break
        if not progressed:
            raise ValueError(f"depends_on has a cycle among {sorted(remaining)}")
    return done


def _ancestors(order: list[str], deps: dict[str, tuple[str, ...]]) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for name in order:
        acc: set[str] = set()
        for parent in deps.get(name, ()):
            acc.add(parent)
            acc |= result[parent]
        result[name] = acc
    return result
