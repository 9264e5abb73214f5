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
from typing import Annotated, Any, ClassVar, Literal

from jmespath.exceptions import JMESPathError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from .errors import InvalidDefinitionError, MissingReferenceError
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


class CompensationRetryPolicy(RetryPolicy):
    """How long a compensation keeps trying before it gives up and waits for a person (COMPENSATION_FAILED).

    A compensation that gives up pages a person, so its policy is measured in time, not only in attempts: it is
    retried while attempts remain **and** ``budget_minutes`` have not passed since its first dispatch, the last
    retry falling no later than the budget's end. A deferral (an open circuit: no call made) uses no attempt, and
    is bounded by the budget alone. The delay after attempt ``n`` is ``d = min(cap, base * 2**(n-1))`` seconds with
    *equal* jitter (uniform in ``[d/2, d]``; AWS Architecture Blog, "Exponential Backoff and Jitter"), so the
    default's attempts cannot run out before its budget: their shortest delays add up to more than 30 minutes.

    The default (40 attempts, 5 s to 120 s, 30 minutes) outlasts a 15-minute outage of the service: on an outage of
    21 s the earlier default (5 attempts, 2 s to 60 s, full jitter) had already paged a person.
    """

    max_attempts: int = Field(default=40, ge=1, le=200)
    backoff_base_seconds: float = Field(default=5.0, gt=0, le=60)
    backoff_cap_seconds: float = Field(default=120.0, gt=0, le=900)
    budget_minutes: int = Field(
        default=30,
        ge=1,
        le=1440,
        description="Minutes from the compensation's first dispatch after which it is not retried again.",
    )

    def delay_seconds(self, attempt: int, rng: Any) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based): equal jitter in ``[d/2, d]``, or ``d``."""
        delay = min(self.backoff_cap_seconds, self.backoff_base_seconds * (2 ** max(0, attempt - 1)))
        return float(rng.uniform(delay / 2, delay)) if self.jitter else delay


class CompensationDefinition(BaseModel):
    """The compensating action that undoes a step (Compensating Transaction pattern).

    Each compensation attempt makes one remote call; a failed attempt is dispatched again after the policy's
    backoff (an SQS delay), so every retry is a supervised attempt with its own complete-by. The policy
    (`CompensationRetryPolicy`) is far more patient than a forward step's, and bounded in time, because a
    compensation that gives up needs a person.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    action: ActionName
    input: dict[str, Any] = Field(default_factory=dict)
    timeout_seconds: int = Field(default=30, ge=5, le=900)
    retry: CompensationRetryPolicy = Field(default_factory=CompensationRetryPolicy)


class _StepBase(BaseModel):
    """What every kind of step has: a name, its dependencies, its condition and its failure policy."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: StepName
    depends_on: list[StepName] | None = Field(
        default=None,
        description="Steps that must be done first (COMPLETED, or SKIPPED by their condition); null "
        "means the previous step.",
    )
    when: str | None = Field(
        default=None,
        max_length=MAX_EXPRESSION_CHARS,
        description="A JMESPath over {input, steps} (its dependencies' outputs), evaluated once the dependencies are "
        "done: when its value is false, null, empty or zero-length the step is SKIPPED and counts as done for its "
        "dependents (its output is absent). null: always run.",
    )
    on_failure: Literal["compensate", "hold"] | None = Field(
        default=None,
        description="When the step fails for good: compensate (unwind) or hold (wait for a person); null: the "
        "definition's policy.",
    )


class TaskStep(_StepBase):
    """One step of a workflow: an action on one remote service, done by that service's agent (``type: task``)."""

    type: Literal["task"] = "task"
    agent: AgentName
    action: ActionName
    input: dict[str, Any] = Field(default_factory=dict)
    timeout_seconds: int = Field(
        default=30, ge=5, le=900, description="Seconds from dispatch to complete-by (the agent keeps 2 s to reply)."
    )
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    compensation: CompensationDefinition | None = None


#: The longest wait step (seconds): a year, as the longest hold timeout.
MAX_WAIT_SECONDS = 31_536_000


class WaitStep(_StepBase):
    """A step that waits for a time (``type: wait``), resumed by a delayed message or by the supervisor.

    Exactly one of ``seconds`` (a duration from the moment the step is reached) and ``until`` (a JMESPath over
    ``{input, steps}`` giving epoch seconds or an ISO 8601 time; a time already past resumes at once). A wait of 900
    seconds or less is resumed by an SQS message delayed until its time; a longer one by the supervisor, at the
    granularity of its schedule, when its complete-by (the resume time) is past. Nothing runs while it waits. A wait
    has nothing to undo: when the workflow unwinds it ends at once.
    """

    type: Literal["wait"]
    seconds: int | None = Field(default=None, ge=0, le=MAX_WAIT_SECONDS)
    until: str | None = Field(default=None, min_length=1, max_length=MAX_EXPRESSION_CHARS)

    #: Read generically by the engine: a wait has no compensation and no remote input.
    compensation: ClassVar[None] = None
    input: ClassVar[dict[str, Any]] = {}

    @model_validator(mode="after")
    def _one_of_seconds_and_until(self) -> WaitStep:
        if (self.seconds is None) == (self.until is None):
            raise ValueError("a wait step gives exactly one of seconds and until")
        return self


class NotifyDefinition(BaseModel):
    """How a callback step's task token reaches a person or a system: an agent's action, sent with each new token.

    The request's input is ``input`` rendered like a task's, plus ``task_token`` (the token of that attempt). The
    action's failure fails the attempt as a task's would (the next attempt, if any, issues a new token); its success
    changes nothing: the step waits for its callback.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    agent: AgentName
    action: ActionName
    input: dict[str, Any] = Field(default_factory=dict)


class CallbackStep(_StepBase):
    """A step that waits for an outside answer (``type: callback``): a person's approval, another system's event.

    Each attempt issues a single-use, unguessable task token (shown on the step while it waits, and sent through
    ``notify`` when given). ``POST /callbacks/{token}`` completes the step with an output, fails it with an error, or
    sends a heartbeat, which moves complete-by to ``timeout_seconds`` from then. Once complete-by passes, the
    supervisor times the step out like any other: its retry policy issues a new token, or fails it.
    """

    type: Literal["callback"]
    timeout_seconds: int = Field(
        default=3_600,
        ge=5,
        le=MAX_WAIT_SECONDS,
        description="Seconds from the token's issue (or its last heartbeat) to complete-by.",
    )
    retry: RetryPolicy = Field(
        default_factory=lambda: RetryPolicy(max_attempts=1),
        description="Attempts: each a new token (and a new notification); default 1, no second token.",
    )
    notify: NotifyDefinition | None = None

    #: Read generically by the engine: a callback has no compensation; its notification has its own input.
    compensation: ClassVar[None] = None
    input: ClassVar[dict[str, Any]] = {}


#: The most items one map step runs (Step Functions' Distributed Map runs up to 10,000 children in parallel).
MAX_MAP_ITEMS = 10_000
#: The most children of one map step in flight at once.
MAX_MAP_CONCURRENCY = 1_000
_PERCENT = re.compile(r"^(100|[0-9]{1,2})(\.[0-9]{1,2})?%$")


class MapStep(_StepBase):
    """A step that runs a child workflow for each item of a list (``type: map``), at most ``max_concurrency`` at once.

    ``items`` is a JMESPath over ``{input, steps}`` (like ``when``) giving a list of at most `MAX_MAP_ITEMS` items,
    evaluated once when the step is reached. Child ``i`` is a workflow of ``definition`` whose input is
    ``{"item": items[i], "index": i}``, with its own item in the store (id ``<parent id>:<step index>:<i>``), its own
    history, deadlines and compensation; it reports to its parent when it ends. The step COMPLETES once every child
    has ended and at most ``tolerated_failure`` of them did not complete (a count, or a percentage of the items such
    as ``"10%"``); its output is ``{"total", "succeeded", "failed", "results"}`` where ``results[i]`` is child
    ``i``'s output (its last step's output; null for a child that did not complete), unless ``collect`` is false.
    One failure more than tolerated fails the step: the workflow unwinds, and the unwind of a map step unwinds its
    children (a running child is cancelled, a completed one compensates its steps). ``timeout_seconds`` bounds the
    time without any child ending: past it (and the grace) the supervisor checks the children in flight (a report
    lost between a child's last write and its message is found again), and never fails the step for it.

    A child definition cannot hold a map step itself (one level of fan-out), and its steps count towards
    nothing of the parent's (the parent stays one item: the children are not in it).
    """

    type: Literal["map"]
    items: str = Field(min_length=1, max_length=MAX_EXPRESSION_CHARS)
    definition: WorkflowDefinition
    max_concurrency: int = Field(default=100, ge=1, le=MAX_MAP_CONCURRENCY)
    tolerated_failure: StrictInt | str = Field(
        default=0, description="Children that may fail without failing the step: a count (>= 0) or a percentage."
    )
    timeout_seconds: int = Field(
        default=900,
        ge=5,
        le=MAX_WAIT_SECONDS,
        description="Seconds without a child ending before the supervisor checks the children in flight.",
    )
    collect: StrictBool = Field(default=True, description="Collect the children's outputs in the step's output.")

    #: Read generically by the engine: a map's undo is its children's, not an agent's action; it has no remote input.
    compensation: ClassVar[None] = None
    input: ClassVar[dict[str, Any]] = {}

    @model_validator(mode="after")
    def _one_level_and_tolerance(self) -> MapStep:
        if any(isinstance(step, MapStep) for step in self.definition.steps):
            raise ValueError("a map step's definition cannot hold a map step itself (one level of fan-out)")
        if self.definition.tenancy is not None:
            raise ValueError(
                "a map step's definition cannot have tenancy: its children run under the map step's concurrency "
                "(put tenancy on the definition the parent starts with)"
            )
        tolerated = self.tolerated_failure
        if isinstance(tolerated, int) and tolerated < 0:
            raise ValueError("tolerated_failure is a count >= 0 or a percentage such as '10%'")
        if isinstance(tolerated, str) and not _PERCENT.match(tolerated):
            raise ValueError(f"tolerated_failure {tolerated[:20]!r} is not a count or a percentage such as '10%'")
        return self

    def tolerated(self, total: int) -> int:
        """How many of ``total`` children may fail without failing the step (a percentage rounds down)."""
        if isinstance(self.tolerated_failure, int):
            return self.tolerated_failure
        return int(total * float(self.tolerated_failure[:-1]) // 100)


_STEP_KINDS: dict[str, type[BaseModel]] = {}


def _step_by_type(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """Validate a step as the model its ``type`` names (``task`` when absent), so an error's ``loc`` is the step's
    own path (``steps[i].timeout_seconds``), not prefixed by the union's member."""
    if isinstance(value, dict):
        kind = value.get("type", "task")
        model = _STEP_KINDS.get(kind) if isinstance(kind, str) else None
        if model is None:
            raise PydanticCustomError(
                "invalid_step_type", "type must be task, wait, callback or map, not {kind}", {"kind": repr(kind)[:40]}
            )
        return model.model_validate(value)
    return handler(value)


#: One step of a definition: a task (the default when ``type`` is absent), a wait, a callback or a map.
AnyStep = TaskStep | WaitStep | CallbackStep | MapStep
StepDefinition = Annotated[AnyStep, WrapValidator(_step_by_type)]
_STEP_KINDS.update(task=TaskStep, wait=WaitStep, callback=CallbackStep, map=MapStep)


#: Most workflows of one tenant that may run at once (``tenancy.max_running``): the tenant's item lists each.
MAX_RUNNING_PER_TENANT = 1_000


class TenancyPolicy(BaseModel):
    """How many workflows of this definition one tenant may run at once (``sasflow.tenancy``).

    The tenant is the principal that starts the workflow, or, with ``tenant_key``, what that JMESPath gives on the
    workflow's input (a customer's id, say: every principal starting workflows for that customer shares its limit).
    A start over ``max_running`` is refused with 429 and Retry-After (``over_limit: refuse``), or accepted ``QUEUED``
    and started in order as slots free (``over_limit: queue``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_running: StrictInt = Field(
        ge=1,
        le=MAX_RUNNING_PER_TENANT,
        description="Workflows of one tenant running at once (RUNNING, HELD, unwinding or COMPENSATION_FAILED: until "
        "it ends COMPLETED, COMPENSATED or CANCELLED).",
    )
    tenant_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_EXPRESSION_CHARS,
        description="JMESPath on the workflow's input that names its tenant (a string or an integer); null: the "
        "principal that starts it.",
    )
    over_limit: Literal["refuse", "queue"] = Field(
        default="refuse",
        description="A start over max_running: refuse (429 with Retry-After, nothing written) or queue (201, QUEUED: "
        "it starts in order as the tenant's workflows end; it may be cancelled meanwhile).",
    )

    @model_validator(mode="after")
    def _key_parses(self) -> TenancyPolicy:
        if self.tenant_key is not None:
            try:
                compiled(self.tenant_key)
            except JMESPathError as exc:
                raise ValueError(f"tenant_key is not JMESPath: {exc}") from None
        return self


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
    tenancy: TenancyPolicy | None = Field(
        default=None,
        description="At most max_running workflows of this definition (by name, any version) per tenant at once.",
    )

    @model_validator(mode="after")
    def _valid_graph_and_references(self) -> WorkflowDefinition:
        """Check names, dependencies and references; each problem is reported at its step (``loc`` ``steps[i]``).

        Raises
        ------
        pydantic.ValidationError
            One error per problem (a name used twice, an unknown or duplicated dependency, a cycle, a reference to a
            step that is not an earlier dependency, a JMESPath that does not parse), its ``loc`` ending at the step.
        """
        problems: list[tuple[int, str]] = []
        names = {step.name for step in self.steps}
        index: dict[str, int] = {}
        for i, step in enumerate(self.steps):
            if step.name in index:
                problems.append((i, f"step name {step.name!r} is used twice"))
            index.setdefault(step.name, i)
            parents = step.depends_on or []
            for parent in sorted({p for p in parents if parents.count(p) > 1}):
                problems.append((i, f"step {step.name!r} lists {parent!r} in depends_on twice"))
            for parent in dict.fromkeys(parents):
                if parent == step.name:
                    problems.append((i, f"step {step.name!r} depends on itself"))
                elif parent not in names:
                    problems.append((i, f"step {step.name!r} depends on unknown step {parent!r}"))
        if not problems:
            cycle = _cycle(self.order_or_none, self.dependencies)
            if cycle:
                problems.append((index[cycle[0]], f"depends_on has a cycle among {cycle}"))
        if not problems:
            problems.extend(self._reference_problems(index))
        if problems:
            raise ValidationError.from_exception_data(
                "WorkflowDefinition",
                [
                    InitErrorDetails(
                        type=PydanticCustomError("invalid_step", "{problem}", {"problem": problem}),
                        loc=("steps", i),
                        input=self.steps[i].name,
                    )
                    for i, problem in problems
                ],
            )
        return self

    def _reference_problems(self, index: dict[str, int]) -> list[tuple[int, str]]:
        ancestors = _ancestors(list(self.order), self.dependencies)
        count = sum(len(_step_expressions(step)) for step in self.steps)
        if count > MAX_EXPRESSIONS:
            return [(0, f"the definition holds {count} JMESPath expressions; at most {MAX_EXPRESSIONS} are allowed")]
        problems: list[tuple[int, str]] = []
        for step in self.steps:
            checks: list[tuple[dict[str, Any], str, bool]] = [(step.input, f"steps[{step.name}].input", False)]
            if step.compensation is not None:
                checks.append((step.compensation.input, f"steps[{step.name}].compensation.input", True))
            if step.when is not None:
                checks.append(({"when.$": step.when}, f"steps[{step.name}]", False))
            if isinstance(step, CallbackStep) and step.notify is not None:
                checks.append((step.notify.input, f"steps[{step.name}].notify.input", False))
            if isinstance(step, WaitStep) and step.until is not None:
                checks.append(({"until.$": step.until}, f"steps[{step.name}]", False))
            if isinstance(step, MapStep):
                checks.append(({"items.$": step.items}, f"steps[{step.name}]", False))
            for template, where, allow_step in checks:
                try:
                    _check_template(template, where, ancestors[step.name], allow_step=allow_step)
                except ValueError as exc:
                    problems.append((index[step.name], str(exc)))
        return problems

    @cached_property
    def content_id(self) -> str:
        """The definition's content address: 32 hex digits (128 bits) of the SHA-256 of its canonical JSON.

        Equal definitions (defaults filled in, keys sorted) have the same id, so the store keeps one copy of a
        definition however many workflows run it, and a workflow record carries only this id.
        """
        document = self.model_dump(mode="json")
        if document["tenancy"] is None:  # a definition without it keeps the id it had before tenancy existed
            del document["tenancy"]
        text = json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
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
                result[step.name] = tuple(dict.fromkeys(step.depends_on))  # a duplicate is refused by validation
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
        order = self.order_or_none
        if order is None:  # pragma: no cover - validation refuses a cycle
            raise ValueError("depends_on has a cycle")
        return order

    @property
    def order_or_none(self) -> tuple[str, ...] | None:
        """`order`, or None when ``depends_on`` has a cycle (validation reports it)."""
        return _topological_order([s.name for s in self.steps], self.dependencies)

    def failure_policy(self, name: str) -> str:
        """``compensate`` or ``hold``: what the failure of step ``name`` does (its own policy, or the definition's)."""
        return self.step(name).on_failure or self.on_failure

    def task(self, name: str) -> TaskStep:
        """Return the task step called ``name``.

        Raises
        ------
        KeyError
            When the definition has no task step of that name.
        """
        step = self.step(name)
        if not isinstance(step, TaskStep):
            raise KeyError(name)
        return step

    def agent_calls(self) -> list[tuple[str, str, str]]:
        """Every ``(step, agent, action)`` the definition makes agents do: actions, compensations, notifications."""
        calls = []
        for step in self.steps:
            if isinstance(step, TaskStep):
                calls.append((step.name, step.agent, step.action))
                if step.compensation is not None:
                    calls.append((step.name, step.agent, step.compensation.action))
            elif isinstance(step, CallbackStep) and step.notify is not None:
                calls.append((step.name, step.notify.agent, step.notify.action))
            elif isinstance(step, MapStep):
                calls.extend(
                    (f"{step.name}.{child}", agent, action) for child, agent, action in step.definition.agent_calls()
                )
        return calls

    @property
    def tasks(self) -> list[TaskStep]:
        """The task steps, in written order (the steps that call agents)."""
        return [step for step in self.steps if isinstance(step, TaskStep)]

    def step(self, name: str) -> AnyStep:
        """Return the step called ``name``.

        Raises
        ------
        KeyError
            When the definition has no such step.
        """
        return self._by_name[name]

    @cached_property
    def _by_name(self) -> dict[str, AnyStep]:
        return {step.name: step for step in self.steps}

    def leaves(self) -> tuple[str, ...]:
        """The steps no other step depends on, in order: a child workflow's output is its last leaf's output."""
        return tuple(name for name in self.order if not self.dependents[name])

    def references_needing(self, name: str) -> list[tuple[str, str]]:
        """The references that fail when step ``name`` has no output: ``(where, expression)`` pairs, in order.

        A reference of another step's input, notification input or compensation input (``key.$`` without a
        default), or a wait's ``until`` or a map's ``items``, that reads ``steps.<name>``: rendered with no output,
        it finds nothing (``MISSING_REFERENCE``). A ``when`` never needs it: a condition that finds nothing is false.
        """
        found: list[tuple[str, str]] = []
        for step in self.steps:
            templates = [(f"steps[{step.name}].input", step.input)]
            if isinstance(step, CallbackStep) and step.notify is not None:
                templates.append((f"steps[{step.name}].notify.input", step.notify.input))
            if step.compensation is not None:
                templates.append((f"steps[{step.name}].compensation.input", step.compensation.input))
            references = [ref for where, template in templates for ref in _required_references(template, where)]
            for attribute in ("until", "items"):
                expression = getattr(step, attribute, None)
                if expression is not None:
                    references.append((f"steps[{step.name}].{attribute}", expression))
            found += [(where, e) for where, e in references if name in set(_STEP_REF.findall(e))]
        return found

    def referenced_steps(self, name: str) -> set[str]:
        """Names of the earlier steps whose outputs the input of step ``name`` refers to."""
        return set(_STEP_REF.findall(_expressions_text(self.step(name).input)))


MapStep.model_rebuild()


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


def render(
    template: dict[str, Any],
    context: dict[str, Any],
    *,
    where: str = "input",
    nullable_roots: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Resolve ``key.$`` JMESPath references in ``template`` against ``context``, recursively.

    A reference is ``"key.$": "<expression>"``, or ``"key.$": {"expression": "<expression>", "default": <JSON>}``
    which renders the default when the expression finds nothing. A reference without a default that finds nothing
    (null) is an error, not a silent null (issue 12): the step fails with ``MISSING_REFERENCE``.

    Parameters
    ----------
    template:
        A step or compensation input; keys ending in ``.$`` hold JMESPath expressions.
    context:
        ``{"input": ..., "steps": {name: {"output": ...}}, "step": {...}}``.
    where:
        Where ``template`` sits in the definition (``steps[book].input``): the start of an error's path.
    nullable_roots:
        Roots whose expressions may find nothing and render null: a compensation's ``step`` (the compensated step's
        output is unknown when its action timed out; the agent then finds the action by its original token).

    Returns
    -------
    dict
        A new dict where each ``key.$`` became ``key`` with the expression's value.

    Raises
    ------
    MissingReferenceError
        When a reference without a default finds nothing; it names the path (``steps[book].input.guest``) and the
        expression.
    PayloadTooLargeError
        When an expression would build a value over its limit (``expressions.MAX_BUILT_BYTES``, or
        ``MAX_RENDER_BUILT_BYTES`` for all of them): it is refused before it is built.
    jmespath.exceptions.JMESPathError
        When a function is given a value of the wrong type.
    """
    return _render_value(template, context, RenderBudget(), where, nullable_roots)  # type: ignore[no-any-return]


def _render_value(
    value: Any, context: dict[str, Any], budget: RenderBudget, path: str, nullable: frozenset[str]
) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(key, str) and key.endswith(_REF_SUFFIX) and isinstance(item, (str, dict)):
                name = key[: -len(_REF_SUFFIX)]
                out[name] = _resolve(item, context, budget, f"{path}.{name}", nullable)
            else:
                out[key] = _render_value(item, context, budget, f"{path}.{key}", nullable)
        return out
    if isinstance(value, list):
        return [_render_value(v, context, budget, f"{path}[{i}]", nullable) for i, v in enumerate(value)]
    return value


def _resolve(
    reference: str | dict[str, Any], context: dict[str, Any], budget: RenderBudget, path: str, nullable: frozenset[str]
) -> Any:
    expression = reference if isinstance(reference, str) else reference["expression"]
    result = evaluate(expression, context, budget)
    if result is not None:
        return result
    if isinstance(reference, dict):
        return reference["default"]
    if nullable and expression_roots(expression) <= nullable:
        return None
    raise MissingReferenceError(path, expression)


def expression_roots(expression: str) -> frozenset[str]:
    """The context roots an expression reads (``input``, ``steps``, ``step``), from its cached parse."""
    roots: set[str] = set()
    _walk(compiled(expression).parsed, True, roots, set())
    return frozenset(roots)


def _expressions(value: Any) -> list[str]:
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and key.endswith(_REF_SUFFIX):
                if key == _REF_SUFFIX:
                    raise ValueError(f"{key!r} needs a name before {_REF_SUFFIX!r}: the key its value is rendered as")
                if isinstance(item, dict):
                    if set(item) != {"expression", "default"} or not isinstance(item["expression"], str):
                        raise ValueError(
                            f"{key!r} must hold a JMESPath expression string, or "
                            '{"expression": "<JMESPath>", "default": <value>}'
                        )
                    found.append(item["expression"])
                elif not isinstance(item, str):
                    raise ValueError(f"{key!r} must hold a JMESPath expression string")
                else:
                    found.append(item)
            else:
                found.extend(_expressions(item))
    elif isinstance(value, list):
        for item in value:
            found.extend(_expressions(item))
    return found


def _required_references(value: Any, path: str) -> list[tuple[str, str]]:
    """The ``key.$`` references of a template that have no default, with where each renders to."""
    found: list[tuple[str, str]] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and key.endswith(_REF_SUFFIX) and isinstance(item, str):
                found.append((f"{path}.{key[: -len(_REF_SUFFIX)]}", item))
            elif not (isinstance(key, str) and key.endswith(_REF_SUFFIX)):
                found += _required_references(item, f"{path}.{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _required_references(item, f"{path}[{index}]")
    return found


def _step_expressions(step: AnyStep) -> list[str]:
    found = _expressions(step.input)
    if step.compensation is not None:
        found += _expressions(step.compensation.input)
    if isinstance(step, CallbackStep) and step.notify is not None:
        found += _expressions(step.notify.input)
    found += [e for e in (step.when, getattr(step, "until", None), getattr(step, "items", None)) if e is not None]
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


def _topological_order(names: list[str], deps: dict[str, tuple[str, ...]]) -> tuple[str, ...] | None:
    """Names in a topological order that keeps the written order where it can; None on a cycle."""
    done: list[str] = []
    placed: set[str] = set()
    remaining = list(names)
    while remaining:
        ready = next((n for n in remaining if all(p in placed for p in deps.get(n, ()))), None)
        if ready is None:
            return None
        done.append(ready)
        placed.add(ready)
        remaining.remove(ready)
    return tuple(done)


def _cycle(order: tuple[str, ...] | None, deps: dict[str, tuple[str, ...]]) -> list[str]:
    """The steps that cannot be ordered (sorted), or [] when there is an order."""
    if order is not None:
        return []
    placed: set[str] = set()
    progressed = True
    while progressed:
        progressed = False
        for name, parents in deps.items():
            if name not in placed and all(p in placed for p in parents):
                placed.add(name)
                progressed = True
    return sorted(set(deps) - placed)


def _ancestors(order: list[str], deps: dict[str, tuple[str, ...]]) -> dict[str, set[str]]:
    result: dict[str, set[str]] = {}
    for name in order:
        acc: set[str] = set()
        for parent in deps.get(name, ()):
            acc.add(parent)
            acc |= result[parent]
        result[name] = acc
    return result
