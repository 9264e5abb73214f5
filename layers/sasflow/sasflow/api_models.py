"""API request and response models (kept apart from queue messages and store records)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidatorFunctionWrapHandler, WrapValidator
from pydantic_core import PydanticCustomError

from .callbacks import task_token
from .cost import Tally
from .definition import WorkflowDefinition
from .history import HistoryEvent, StepTimes, decode, step_times
from .messages import DEFAULT_PRIORITY
from .records import Snapshot, StepRecord
from .registry import DefinitionRef
from .states import Phase, StepStatus, WorkflowStatus

#: The sample saga of the README (events/trip_booking_request.json, shortened): the document's example request.
_TRIP_EXAMPLE: dict[str, Any] = {
    "definition": {
        "name": "trip-booking",
        "version": 1,
        "steps": [
            {
                "name": "reserve_flight",
                "agent": "flights",
                "action": "reserve",
                "input": {"traveller.$": "input.traveller"},
                "timeout_seconds": 30,
                "retry": {"max_attempts": 3, "backoff_base_seconds": 1, "backoff_cap_seconds": 8, "jitter": True},
                "compensation": {
                    "action": "cancel_reservation",
                    "input": {"confirmation.$": "step.output.confirmation"},
                },
            },
            {
                "name": "book_hotel",
                "agent": "hotels",
                "action": "book",
                "input": {"flight.$": "steps.reserve_flight.output.confirmation"},
                "compensation": {"action": "cancel_booking"},
            },
        ],
    },
    "input": {"traveller": "Ada Lovelace"},
}


def _inline_or_registered(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
    """A definition with ``steps`` is inline, one without names a registered one; errors keep their own path.
    Anything but an object (a bare name, the most likely slip) is one error that shows both forms."""
    if isinstance(value, dict):
        return (WorkflowDefinition if "steps" in value else DefinitionRef).model_validate(value)
    if isinstance(value, WorkflowDefinition | DefinitionRef):
        return handler(value)
    raise PydanticCustomError(
        "definition_not_an_object",
        'expected an object: a registered definition as {"name": "<name>", "version": <n>} (no version: the '
        "latest), or the definition itself with its steps; got {given}",
        {"given": f"the string {value[:64]!r}" if isinstance(value, str) else _JSON_KINDS.get(type(value), "a value")},
    )


_JSON_KINDS: dict[type, str] = {
    list: "an array",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


class StartWorkflowRequest(BaseModel):
    """Body of ``POST /workflows``: the definition to run and the workflow input."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_TRIP_EXAMPLE]})

    definition: Annotated[WorkflowDefinition | DefinitionRef, WrapValidator(_inline_or_registered)] = Field(
        description="The definition itself (with its steps), or a registered one: {name, version} (version null: "
        "the latest)."
    )
    input: dict[str, Any] = Field(default_factory=dict, description="Workflow input; steps refer to it as input.*")
    priority: StrictInt | None = Field(
        default=None,
        ge=1,
        le=5,
        description="1 (served first) to 5 (last); omitted: 3. Where an agent's calls are limited, its steps are "
        "called before those of workflows of a lower priority (docs/tenants.md).",
    )


class MapView(BaseModel):
    """A map step's progress over its children (forward, and while they unwind)."""

    total: int = Field(description="Items: one child each.")
    started: int
    ended: int = Field(description="Children that reported their end.")
    failed: int = Field(description="Children that ended without completing.")
    unwound: int | None = Field(default=None, description="While the step is undone: children that have unwound.")
    id_prefix: str = Field(description="The children's ids are this prefix followed by the item index.")


class StepView(BaseModel):
    """One step as the API shows it. Times are epoch seconds, from the workflow's history."""

    name: str
    type: str = Field(
        default="task", description="task (an agent's action), wait (a timer), callback or map (a child per item)."
    )
    depends_on: list[str] = Field(
        default_factory=list, description="The steps it waits for (the previous one unless its definition says)."
    )
    agent: str | None = Field(default=None, description="The task's agent; null for a wait.")
    action: str | None = Field(default=None, description="The task's action; null for a wait.")
    status: StepStatus
    task_token: str | None = Field(
        default=None, description="A callback step's token while it waits (POST /callbacks/{token} answers it)."
    )
    attempt: int = Field(description="Dispatches of the action so far.")
    compensation_attempt: int = Field(description="Dispatches of the compensation so far.")
    complete_by: int | None = Field(
        default=None, description="Deadline of the attempt in flight; a waiting step's resume time (epoch seconds)."
    )
    resends: int = Field(description="Times the supervisor resent this step after its complete-by.")
    deferrals: int = Field(default=0, description="Dispatches an open circuit deferred (action and compensation).")
    limit_deferrals: int = Field(
        default=0, description="Dispatches the agent's call limits deferred (max_in_flight, rate): a busy service."
    )
    started_at: int | None = Field(default=None, description="First dispatch of the action (epoch seconds).")
    finished_at: int | None = Field(
        default=None, description="When the action's last attempt ended: its reply applied, or timed out."
    )
    output: Any = None
    error: dict[str, Any] | None = Field(default=None, description="The action's last error (code, message).")
    compensation_status: str | None = Field(
        default=None, description="COMPENSATING, COMPENSATED or COMPENSATION_FAILED once the step is being undone."
    )
    compensation_started_at: int | None = Field(default=None, description="First dispatch of the compensation.")
    compensation_finished_at: int | None = Field(default=None, description="When the compensation ended.")
    compensation_output: Any = None
    compensation_error: dict[str, Any] | None = Field(default=None, description="The compensation's last error.")
    children: MapView | None = Field(
        default=None,
        description="A map step's children: how many started, ended and failed (each is a workflow "
        "of its own, id <workflow id>:<step index>:<item index>).",
    )


class TriggerView(BaseModel):
    """The trigger (triggers.yaml) that started a workflow, and the occurrence it started it for."""

    name: str
    occurrence: str = Field(description="What made it this occurrence: a schedule's tick (tick <ISO time>).")


class CostLineView(BaseModel):
    """One line of what a workflow's work has cost: what, how much of it, and its dollars."""

    name: str = Field(description="The AWS service and what of it: DynamoDB writes, SQS, Lambda compute, ...")
    quantity: str = Field(description="How much of it the workflow's work used: 12 WRU, 0.0421 GB-s, ...")
    dollars: float


class CostView(BaseModel):
    """What a workflow's work has cost on AWS so far (`sasflow.cost`): tallied on its item by every write, message
    and invocation of the engine and the agents for it, priced at the list prices of ``prices``."""

    dollars: float = Field(description="The sum of the lines, in US dollars.")
    prices: str = Field(
        description="Whose list prices, read when: us-east-1, read 2026-11-29 (the PriceRegion parameter's; a region "
        "without a list of its own is priced at us-east-1's and says so)."
    )
    lines: list[CostLineView]
    units: dict[str, float] = Field(
        default_factory=dict,
        description="What the lines count, as numbers for scripts: dynamodb_write_units, dynamodb_read_units, "
        "sqs_requests, s3_writes, s3_reads, s3_bytes_written, lambda_invocations, lambda_gb_seconds, log_bytes, "
        "api_requests, events.",
    )

    @classmethod
    def of(cls, tally: Tally) -> CostView:
        """The priced view of ``tally``, at the deployment's price list (`sasflow.prices.price_list`)."""
        from .prices import price_list

        prices = price_list()
        lines = [
            CostLineView(name=line.name, quantity=line.quantity, dollars=line.dollars) for line in tally.lines(prices)
        ]
        units = {
            "dynamodb_write_units": tally.wru,
            "dynamodb_read_units": tally.rru,
            "sqs_requests": tally.sqs,
            "s3_writes": tally.s3_writes,
            "s3_reads": tally.s3_reads,
            "s3_bytes_written": tally.s3_bytes,
            "lambda_invocations": tally.invocations,
            "lambda_gb_seconds": tally.gb_seconds,
            "log_bytes": tally.log_bytes,
            "api_requests": tally.api,
            "events": tally.events,
        }
        return cls(dollars=sum(line.dollars for line in lines), prices=prices.label, lines=lines, units=units)


class WorkflowView(BaseModel):
    """A workflow and its steps, in definition order."""

    workflow_id: str
    status: WorkflowStatus
    definition_name: str
    definition_version: int
    created_at: int = Field(description="Epoch seconds.")
    updated_at: int = Field(description="Epoch seconds.")
    reason: str | None = None
    owner: str | None = Field(default=None, description="The principal that started it.")
    trigger: TriggerView | None = Field(default=None, description="The trigger that started it, if one did.")
    tenant: str | None = Field(
        default=None,
        description="The tenant whose slot it holds until it ends (its definition's tenancy): principal#<owner> or "
        "key#<tenant_key's value>.",
    )
    priority: int = Field(default=3, description="1 (served first) to 5 (last), as it was started.")
    queue_ticket: int | None = Field(
        default=None,
        description="Started QUEUED behind its tenant's running workflows (tenancy.over_limit: queue): its ticket; "
        "the queue starts its workflows in ticket order.",
    )
    queue_position: int | None = Field(
        default=None,
        description="A QUEUED workflow's place in its tenant's queue (1: it starts next), in a start's answer and in "
        "GET /workflows/{id}.",
    )
    paused: bool = Field(default=False, description="An operator paused it: nothing new is dispatched.")
    hold_until: int | None = Field(
        default=None, description="HELD under a hold timeout: when it is compensated (epoch seconds)."
    )
    events: int = Field(default=0, description="Events in its history (GET /workflows/{id}/history).")
    input: dict[str, Any]
    steps: list[StepView]
    cost: CostView | None = Field(
        default=None, description="What its work has cost so far; none on a workflow written before the tally."
    )

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot, *, queue_position: int | None = None) -> WorkflowView:
        """Build the view of a store snapshot; steps never dispatched show as PENDING. ``queue_position``: a QUEUED
        workflow's place in its tenant's queue, when the caller read it."""
        workflow = snapshot.workflow
        times = step_times(events_of(snapshot))
        steps = []
        for step in workflow.definition.steps:
            record = snapshot.steps.get(step.name)
            when = times.get(step.name, StepTimes())
            compensating = record is not None and record.phase is Phase.COMPENSATION
            steps.append(
                StepView(
                    name=step.name,
                    type=step.type,
                    depends_on=list(workflow.definition.dependencies[step.name]),
                    agent=getattr(step, "agent", None),
                    action=getattr(step, "action", None),
                    status=record.status if record else StepStatus.PENDING,
                    task_token=_token_of(workflow.workflow_id, record),
                    attempt=record.attempt if record else 0,
                    compensation_attempt=record.comp_attempt if record else 0,
                    complete_by=record.complete_by if record else None,
                    resends=record.resends if record else 0,
                    deferrals=(record.deferrals + record.comp_deferrals) if record else 0,
                    limit_deferrals=record.limit_deferrals if record else 0,
                    started_at=when.started_at,
                    finished_at=when.finished_at if record is not None and not _action_in_flight(record) else None,
                    output=record.output if record else None,
                    error=record.error if record else None,
                    compensation_status=record.status.value if compensating and record else None,
                    compensation_started_at=when.compensation_started_at,
                    compensation_finished_at=when.compensation_finished_at
                    if record is not None and record.status is not StepStatus.COMPENSATING
                    else None,
                    compensation_output=record.comp_output if record else None,
                    compensation_error=record.comp_error if record else None,
                    children=_children(workflow.workflow_id, workflow.definition.order.index(step.name), record),
                )
            )
        return cls(
            workflow_id=workflow.workflow_id,
            status=workflow.status,
            definition_name=workflow.definition.name,
            definition_version=workflow.definition.version,
            created_at=workflow.created_at,
            updated_at=workflow.updated_at,
            reason=workflow.reason,
            owner=workflow.owner,
            trigger=TriggerView(name=workflow.trigger.name, occurrence=workflow.trigger.occurrence)
            if workflow.trigger is not None
            else None,
            tenant=workflow.tenant,
            queue_ticket=workflow.queue_ticket,
            queue_position=queue_position,
            priority=workflow.priority or DEFAULT_PRIORITY,
            paused=workflow.paused,
            hold_until=workflow.hold_until,
            events=len(snapshot.history),
            input=workflow.input,
            steps=steps,
            cost=CostView.of(snapshot.cost) if snapshot.cost else None,
        )


def _children(workflow_id: str, step_index: int, record: StepRecord | None) -> MapView | None:
    if record is None or record.map is None:
        return None
    progress = record.map
    return MapView(
        total=progress.total,
        started=progress.launched,
        ended=progress.reported,
        failed=progress.failed,
        unwound=record.comp_map.reported if record.comp_map is not None else None,
        id_prefix=f"{workflow_id}:{step_index}:",
    )


def _action_in_flight(record: StepRecord) -> bool:
    return record.status is StepStatus.PROCESSING


def _token_of(workflow_id: str, record: StepRecord | None) -> str | None:
    if record is None or record.callback_nonce is None or record.status is not StepStatus.PROCESSING:
        return None
    return task_token(workflow_id, record.step, record.attempt, record.callback_nonce)


def events_of(snapshot: Snapshot) -> list[HistoryEvent]:
    """The workflow's history, decoded, oldest first."""
    workflow = snapshot.workflow
    return decode(snapshot.history, workflow.created_at, [s.name for s in workflow.definition.steps])


class HistoryEventView(BaseModel):
    """One event of a workflow's history (see ``history.HistoryEvent``). Times are epoch seconds."""

    seq: int = Field(description="Its place in the history, from 1.")
    time: int = Field(description="When it happened (epoch seconds).")
    kind: str = Field(description="started, dispatched, reply_applied, resent, timed_out, operator_action, ...")
    step: str | None = None
    phase: str | None = Field(default=None, description="action or compensation")
    attempt: int | None = None
    complete_by: int | None = Field(default=None, description="A dispatched attempt's deadline (epoch seconds).")
    outcome: str | None = Field(default=None, description="An applied reply's outcome.")
    calls: int | None = Field(default=None, description="Remote calls the attempt made.")
    error_code: str | None = None
    status: str | None = Field(default=None, description="The terminal status of a finished event.")
    detail: dict[str, Any] | None = Field(
        default=None, description="An operator action's action, principal, reason, step and id."
    )


class HistoryPage(BaseModel):
    """One page of a workflow's history, oldest first; ``next_cursor`` continues it (null on the last page)."""

    workflow_id: str
    status: WorkflowStatus
    events: list[HistoryEventView]
    next_cursor: str | None = None

    @classmethod
    def of(cls, snapshot: Snapshot, *, after: int, limit: int) -> HistoryPage:
        """The events with ``seq > after``, at most ``limit`` of them."""
        events = events_of(snapshot)
        page = [e for e in events if e.seq > after][:limit]
        more = bool(page) and page[-1].seq < len(events)
        return cls(
            workflow_id=snapshot.workflow.workflow_id,
            status=snapshot.workflow.status,
            events=[HistoryEventView.model_validate(asdict(e)) for e in page],
            next_cursor=str(page[-1].seq) if more else None,
        )


class ErrorResponse(BaseModel):
    """Every error body (always a 4xx): a stable ``error`` code, a human ``message`` and, for a request that failed
    validation, ``details`` with the ``loc``, ``msg`` and ``type`` of each problem."""

    error: str
    message: str
    details: list[dict[str, Any]] | None = None
