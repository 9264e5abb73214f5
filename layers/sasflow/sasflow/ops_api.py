"""The operators' HTTP API (``/ops``): find workflows, read any of them, act on them, redrive dead letters.

Routes
------
- ``GET /ops/workflows``: workflows by ``status``, ``definition`` (and ``version``), ``trigger``, start
  (``started_after``, ``started_before``), ``owner`` and ``error_code``, a page at a time, with counts by status
  (``finding.WorkflowFinder``: the sparse indexes, never a scan unless finished ones are asked for).
- ``GET /ops/workflows/{workflow_id}`` and ``.../history``: any workflow, whoever started it.
- ``POST /ops/workflows/{workflow_id}/{action}``: an operator action (``scheduler.OPERATOR_ACTIONS``), audited in the
  history with the caller's principal and the body's ``reason``. An ``Idempotency-Key`` header makes a retried
  request a no-op; where the action does not apply the answer is 409 with the reason.
- ``POST /ops/callbacks/{token}``: answer any workflow's waiting callback step as an operator: ``approve`` (with an
  output) or ``reject`` (with an error code); audited in the history with the caller's principal and ``reason``.
- ``GET /ops/overdue``: the steps overdue now (the supervisor's own query) and the workflows that look stuck.
- ``GET /ops/dead-letters``: the depth of every dead-letter queue, or one queue's messages (``queue``).
- ``POST /ops/dead-letters/redrive``: move a dead-letter queue's messages back where they came from.
- ``GET /ops/triggers``: every trigger of triggers.yaml, whether it is paused (who, when, why) and what it skipped.
- ``POST /ops/triggers/{name}/{action}``: ``pause`` or ``resume`` it, or ``run-now``: one occurrence as if the tick
  had come (``triggers.py``); the body's ``reason`` is audited, an ``Idempotency-Key`` makes a retried run-now
  start one workflow.

Who may call: API Gateway authorizes the routes like the clients' (IAM or JWT), and IAM grants ``/ops/*`` to
operators only (docs/security.md). This function reads and writes any workflow; the clients' function does not
reach these routes. Errors are the clients' API's refusals table (``api``): each a documented 4xx.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any, Literal

from aws_lambda_powertools.event_handler import content_types
from aws_lambda_powertools.event_handler.api_gateway import APIGatewayHttpResolver, Response
from aws_lambda_powertools.event_handler.openapi.params import Header, Path, Query
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .api import (
    ERROR_RESPONSES,
    MAX_HISTORY_PAGE,
    api_resolver,
    doc,
    history_cursor,
    install_error_handlers,
)
from .api_models import HistoryPage, WorkflowView
from .callbacks import MAX_TOKEN_CHARS, CallbackRequest, CallbackResult
from .claim_check import object_key
from .clock import epoch_seconds
from .definition import render
from .errors import (
    BatchNotFoundError,
    ClaimCheckMissingError,
    ConfigurationError,
    PayloadNotFoundError,
    PayloadTooLargeError,
    RetryableError,
    StepNotDispatchedError,
    StepNotFoundError,
    TriggerNotFoundError,
    TriggerNotRunnableError,
    WorkflowNotFoundError,
)
from .finding import MAX_PAGE, WorkflowFinder, by_complete_by, cursor_key, key_cursor, overdue_before
from .identity import principal_of
from .limits import DEFAULT_BATCH_RATE, MAX_BATCH_RATE, json_size
from .ports import MessageBus, Outgoing, TriggerStore, WorkflowIndex
from .scheduler import SchedulerService
from .settings import TriggerRoute
from .transitions import NO_OUTPUT
from .types import IdempotencyKey, Reason, StepName, TriggerName, WorkflowId

if TYPE_CHECKING:
    # An annotation only: the adapter (and the botocore it imports) loads with the boto3 clients, in build_ops.
    from .adapters.sqs_dead_letters import DeadLetterQueues

    # Annotations only: the batch routes import sasflow.batches on their first request (about 4 ms of a cold start).
    from .batches import Batch, BatchFilter, BatchService

    # Annotations only: the trigger routes import the triggers' runtime when they are first called, not at a cold
    # start of every operator request (bench/cold_start.py: 5 ms of the ops function's import).
    from .triggers import TriggerState

logger = logging.getLogger("sasflow.ops")

#: What ``POST /ops/triggers/{name}/{action}`` takes.
TriggerAction = Literal["pause", "resume", "run-now"]
#: What ``GET /ops/workflows?status=`` takes: every status, and PAUSED (``finding``: the index each is read from).
StatusFilter = Literal[
    "CANCELLED",
    "CANCELLING",
    "COMPENSATED",
    "COMPENSATING",
    "COMPENSATION_FAILED",
    "COMPLETED",
    "HELD",
    "PAUSED",
    "QUEUED",
    "RUNNING",
]
#: What a batch's ``where.status`` takes: the statuses of workflows an action may apply to (in flight or waiting).
BatchStatusFilter = Literal["CANCELLING", "COMPENSATING", "COMPENSATION_FAILED", "HELD", "PAUSED", "QUEUED", "RUNNING"]
#: The operator actions that act on one step of a workflow (its name in ``step``).
STEP_ACTIONS = frozenset({"retry", "skip", "retry-compensation", "resolve"})
#: A batch's id (``batches.batch_id_for``).
BATCH_ID_PATTERN = "^b-[0-9a-f]{20}$"
#: The operator actions (``scheduler.OPERATOR_ACTIONS``).
OperatorAction = Literal["retry", "skip", "compensate", "retry-compensation", "resolve", "pause", "resume", "cancel"]


class _Model(BaseModel):
    """The operators' routes' bodies: their validators are built on first use, not at import (``defer_build``), so
    the ops function's cold start does not pay for the routes a sandbox never serves."""

    model_config = ConfigDict(defer_build=True)


class OperatorActionRequest(_Model):
    """Body of ``POST /ops/workflows/{id}/{action}``: why (audited), and what the action needs."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    reason: Reason = Field(description="Why: written to the history with your principal.")
    step: str | None = Field(
        default=None,
        max_length=64,
        description="retry, skip, retry-compensation, resolve: the step (needed when more than one applies).",
    )
    input: dict[str, Any] | None = Field(default=None, description="retry: the step's edited input.")
    output: Any = Field(
        default=None,
        description="skip: the output the step completes with (null too). Left out: refused (422 MISSING_REFERENCE) "
        "when a later step's reference needs it.",
    )


class WorkflowSummaryView(_Model):
    """A workflow as a listing shows it (``ports.WorkflowSummary``). Times are epoch seconds."""

    workflow_id: str
    status: str
    definition_name: str
    created_at: int
    complete_by: int | None = Field(default=None, description="Its earliest deadline in flight.")
    trouble: int = Field(description="Resends and deferrals of its steps, in all.")
    attention: str | None = Field(default=None, description="HELD, COMPENSATION_FAILED or PAUSED: waits for a person.")
    attention_since: int | None = None
    reason: str | None = None
    trigger: str | None = Field(default=None, description="The trigger that started it, if one did.")
    owner: str | None = Field(default=None, description="The principal that started it (read from its item).")
    definition_version: int | None = Field(default=None, description="Its definition's version (from its item).")
    error_codes: list[str] = Field(
        default_factory=list, description="The codes of its steps' last errors, sorted (from its item)."
    )
    error_steps: list[str] = Field(
        default_factory=list, description="The steps whose last attempt failed, sorted (from its item)."
    )
    cost: float | None = Field(
        default=None, description="What its work has cost so far, US dollars at list prices (from its item)."
    )


#: The largest payload the read routes answer with (a Lambda response is at most 6 MB, and JSON inside the JSON body
#: grows as it is escaped); a larger one is refused with 413, naming where it is.
MAX_READ_BYTES = 4 * 1024 * 1024


class StepInputView(_Model):
    """``GET /ops/workflows/{id}/steps/{step}/input``: what the step's attempts get, rendered now."""

    workflow_id: str
    step: str
    input: Any = Field(description="The rendered input, claim-checked payloads read.")
    bytes: int = Field(description="Its size as compact JSON.")
    edited: bool = Field(description="An operator's edited input, given with a retry (not rendered).")


class PayloadView(_Model):
    """``GET /ops/workflows/{id}/payloads/{sha256}``: a claim-checked payload of the workflow."""

    workflow_id: str
    key: str = Field(description="Its object's key in the payload bucket.")
    bytes: int
    payload: Any


class MapChildView(WorkflowSummaryView):
    """A map step's child: its item index, and what a listing shows of it."""

    index: int = Field(description="Its item's place in the map's list, from 0.")


class MapChildrenPage(_Model):
    """``GET /ops/workflows/{id}/steps/{step}/children``: children of a map step, in item order."""

    workflow_id: str
    step: str
    total: int = Field(description="Items of the map: one child each.")
    started: int = Field(description="Children started so far (ids prefix + 0 .. started - 1).")
    id_prefix: str
    children: list[MapChildView]
    next_cursor: str | None = None
    examined: int = Field(description="Children this page read (at most 1,000 a request).")


class WorkflowListPage(_Model):
    """One page of ``GET /ops/workflows``; ``next_cursor`` continues it (null on the last page)."""

    workflows: list[WorkflowSummaryView]
    next_cursor: str | None = None
    counts: dict[str, int] | None = Field(
        default=None, description="First page only: workflows in flight or waiting, by status (finished: metrics)."
    )
    source: str = Field(
        description="Where the listing came from: attention index, deadline index, trigger index or table scan."
    )
    notes: list[str] = Field(default_factory=list)


class OverdueView(_Model):
    """``GET /ops/overdue``: what the supervisor finds overdue now, and what looks stuck."""

    now: int = Field(description="Epoch seconds.")
    grace_seconds: int
    older_than_seconds: int = Field(
        description="Listed: overdue by more than this and than the grace (complete-by < now - max of both)."
    )
    stuck_after: int = Field(description="Resends and deferrals from which a workflow is listed as stuck.")
    overdue: list[WorkflowSummaryView]
    stuck: list[WorkflowSummaryView]


class DeadLetterView(_Model):
    """One dead-letter message (``adapters.sqs_dead_letters.DeadLetter``)."""

    queue: str
    message_id: str
    kind: str
    workflow_id: str | None = None
    step: str | None = None
    phase: str | None = None
    attempt: int | None = None
    sent_at: int = Field(description="Epoch seconds.")
    age_seconds: int
    receive_count: int
    body_bytes: int
    reason: str | None = Field(default=None, description="Why a trigger refused the occurrence, when it did.")


class DeadLetterQueueView(_Model):
    """A dead-letter queue: its depth and, when one queue is asked for, its messages and recent move tasks."""

    queue: str
    approximate_messages: int
    messages: list[DeadLetterView] = Field(default_factory=list)
    move_tasks: list[dict[str, Any]] = Field(default_factory=list)


class DeadLetterList(_Model):
    """``GET /ops/dead-letters``."""

    queues: list[DeadLetterQueueView]


class OperatorCallbackRequest(_Model):
    """Body of ``POST /ops/callbacks/{token}``: an operator's answer to a waiting callback step."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    answer: Literal["approve", "reject"] = Field(
        description="approve: the step completes with output; reject: its attempt fails with code and the reason."
    )
    reason: Reason = Field(description="Why: written to the history with your principal.")
    output: Any = Field(default=None, description="approve: the step's output (any JSON).")
    code: str = Field(
        default="REJECTED",
        min_length=1,
        max_length=64,
        pattern=r"^[A-Z][A-Z0-9_]*$",
        description="reject: the error code the step's attempt fails with (its message is the reason).",
    )

    def as_answer(self) -> CallbackRequest:
        """The callback answer it gives (what a repeat of it must match, as a client's answer)."""
        if self.answer == "approve":
            return CallbackRequest(status="succeeded", output=self.output)
        return CallbackRequest(status="failed", error={"code": self.code, "message": self.reason})  # type: ignore[arg-type]


class RedriveRequest(_Model):
    """Body of ``POST /ops/dead-letters/redrive``."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    queue: str = Field(min_length=1, max_length=80, description="The dead-letter queue's name (GET /ops/dead-letters).")
    reason: Reason = Field(description="Why: written to the operators' audit log line with your principal.")
    max_per_second: int | None = Field(default=None, ge=1, le=500, description="SQS's move rate; default: as fast.")


class TriggerStateView(_Model):
    """A trigger of triggers.yaml as the operators see it."""

    name: str
    kind: str
    definition: str
    source: str = Field(description="What makes it tick: the schedule's expression and time zone.")
    principal: str = Field(description="Who its workflows belong to.")
    paused: bool
    paused_by: str | None = None
    paused_at: int | None = Field(default=None, description="Epoch seconds.")
    pause_reason: str | None = None
    skipped: int = Field(description="Ticks skipped, in all: while it was paused, or while a run held its slot.")
    missed: int = Field(description="Ticks handled later than its catch-up window (after an outage), in all.")
    buffered: int = Field(default=0, description="Ticks kept waiting for the slot (overlap buffer_one), in all.")
    held: int = Field(
        default=0, description="Messages or uploads sent back to wait while it was paused (sqs, s3), in all."
    )
    running: str | None = Field(
        default=None, description="The workflow that holds its slot (overlap skip or buffer_one), if one does."
    )
    waiting: str | None = Field(default=None, description="The occurrence waiting for the slot (buffer_one).")


class TriggerList(_Model):
    """``GET /ops/triggers``."""

    triggers: list[TriggerStateView]


class TriggerActionRequest(_Model):
    """Body of ``POST /ops/triggers/{name}/{action}``."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    reason: Reason = Field(description="Why: kept with a pause, logged for every action.")


class RunNowResult(_Model):
    """A run-now sent: the occurrence and the workflow it starts (its id is known before it starts)."""

    trigger: str
    occurrence: str
    workflow_id: str


class RedriveResult(_Model):
    """The move that started: SQS's task handle, and the queue's depth when it started."""

    queue: str
    task_handle: str
    approximate_messages: int


class BatchWhere(_Model):
    """Which workflows a batch acts on: the listing's filters (``GET /ops/workflows``); a status is needed."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    status: BatchStatusFilter = Field(description="The status of the workflows to act on (in flight or waiting).")
    definition: str | None = Field(default=None, max_length=80)
    version: int | None = Field(default=None, ge=1, le=2_147_483_647)
    error_code: str | None = Field(default=None, max_length=128, description="A code of a step's last error.")
    trigger: TriggerName | None = None
    owner: str | None = Field(default=None, max_length=2048, description="The principal that started it.")
    started_after: int | None = Field(default=None, ge=0, description="Epoch seconds")
    started_before: int | None = Field(default=None, ge=0, description="Epoch seconds")
    step: StepName | None = Field(
        default=None,
        description="A step whose last attempt failed (action or compensation); a retry, skip, retry-compensation or "
        "resolve without its own step acts on this one.",
    )


class BatchRequest(_Model):
    """Body of ``POST /ops/batches``: one operator action on every workflow ``where`` matches."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    action: OperatorAction
    where: BatchWhere
    reason: Reason = Field(description="Why: written to each workflow's history with your principal and the batch.")
    step: StepName | None = Field(
        default=None,
        description="retry, skip, retry-compensation, resolve: the step (a workflow where another "
        "step failed is refused).",
    )
    max_per_second: int = Field(
        default=DEFAULT_BATCH_RATE, ge=1, le=MAX_BATCH_RATE, description="Workflows acted on a second."
    )
    output: Any = Field(
        default=None,
        description="skip: the output each workflow's step completes with (null too). Left out: a workflow whose later "
        "step reads it is refused (MISSING_REFERENCE).",
    )
    dry_run: bool = Field(default=False, description="Count what it would act on; start nothing.")

    @model_validator(mode="after")
    def _output_of_a_skip(self) -> BatchRequest:
        if "output" in self.model_fields_set and self.action != "skip":
            raise ValueError(f"output: only a skip takes one, not a {self.action}")
        return self


class BatchCounts(_Model):
    """A batch's progress."""

    matched: int = Field(description="Workflows its pages claimed so far.")
    done: int = Field(description="Acted on (its history holds the action).")
    refused: int = Field(description="The action did not apply (the reason: GET .../workflows).")
    failed: int = Field(description="An error: see GET .../workflows, and act on them again.")


class BatchView(_Model):
    """A batch of operator actions. Times are epoch seconds."""

    batch_id: str
    action: str
    where: dict[str, Any]
    step: str | None = None
    principal: str
    reason: str
    status: str = Field(description="RUNNING, COMPLETED or CANCELLED.")
    counts: BatchCounts
    pages: int = Field(description="Pages claimed (of at most 25 workflows each).")
    max_per_second: int
    gives_output: bool = Field(default=False, description="A skip that gives its step an output (output).")
    output: Any = Field(default=None, description="The output a skip gives each workflow's step, when it gives one.")
    created_at: int
    updated_at: int
    ended_at: int | None = None
    cancelled_by: str | None = None
    cancel_reason: str | None = None

    @classmethod
    def of(cls, batch: Batch) -> BatchView:
        """The view of a stored batch."""
        return cls(
            batch_id=batch.batch_id,
            action=batch.action,
            where=batch.where.given(),
            step=batch.step,
            principal=batch.principal,
            reason=batch.reason,
            status=batch.status,
            counts=BatchCounts.model_validate(asdict(batch.counts)),
            pages=batch.pages,
            max_per_second=batch.max_per_second,
            created_at=batch.created_at,
            updated_at=batch.updated_at,
            ended_at=batch.ended_at,
            cancelled_by=batch.cancelled_by,
            cancel_reason=batch.cancel_reason,
            gives_output=batch.output is not None,
            output=json.loads(batch.output) if batch.output is not None else None,
        )


class BatchPreview(_Model):
    """A dry run: what the batch would act on now (nothing is written)."""

    action: str
    where: dict[str, Any]
    matched: int = Field(description="Workflows the filter matches now (at most 100,000 counted).")
    by_status: dict[str, int]
    sample: list[str] = Field(description="The first 20 of them.")
    truncated: bool = Field(description="More than were counted match.")
    step: str | None = Field(default=None, description="The step it would act on (a step action).")
    step_not_failed: int = Field(
        default=0, description="Of those matched: whose step has not failed, which the action would refuse."
    )


class BatchList(_Model):
    """``GET /ops/batches``: newest first."""

    batches: list[BatchView]
    next_cursor: str | None = None


class BatchWorkflow(_Model):
    """A workflow a batch claimed, and what became of it."""

    workflow_id: str
    outcome: str | None = Field(
        description="done, refused: <why>, failed: <error>; null while its page is being acted on."
    )


class BatchWorkflowsPage(_Model):
    """``GET /ops/batches/{id}/workflows``: what the batch touched, in the order it claimed them."""

    batch_id: str
    workflows: list[BatchWorkflow]
    next_cursor: str | None = None


class BatchCancelRequest(_Model):
    """Body of ``POST /ops/batches/{id}/cancel``."""

    model_config = ConfigDict(extra="forbid", defer_build=True)

    reason: Reason = Field(description="Why: kept on the batch with your principal.")


def build_ops_app(
    services: Callable[[], tuple[SchedulerService, MessageBus, WorkflowIndex, DeadLetterQueues]],
    triggers: Callable[[], TriggerStore],
    batches: Callable[[], BatchService] | None = None,
) -> APIGatewayHttpResolver:
    """Create the operators' resolver; ``services`` returns the scheduler, the bus, the store's indexes and the
    dead-letter queues, ``triggers`` the triggers' items and ``batches`` the batches' service, built lazily on
    first request.

    Returns
    -------
    APIGatewayHttpResolver
        Resolve HTTP API (payload v2) events with ``app.resolve(event, context)``.
    """
    app = api_resolver()

    def caller() -> str:
        scheduler = services()[0]
        # The audit names the person: an assumed role keeps its session name (the operator's own).
        context = app.current_event.raw_event.get("requestContext") or {}
        return principal_of(context, scheduler.config.api_authorizer, keep_session=True)

    def load(workflow_id: str) -> Any:
        snapshot = services()[0].store.load(workflow_id)
        if snapshot is None:
            raise WorkflowNotFoundError(workflow_id)
        return snapshot

    @app.get(
        "/ops/workflows",
        summary="Find workflows by status, definition and start",
        responses={200: doc(WorkflowListPage, "One page of workflows"), **ERROR_RESPONSES},
    )
    def list_workflows(
        status: Annotated[StatusFilter | None, Query(description="A status, or PAUSED")] = None,
        definition: Annotated[str | None, Query(max_length=80)] = None,
        started_after: Annotated[int | None, Query(ge=0, description="Epoch seconds")] = None,
        started_before: Annotated[int | None, Query(ge=0, description="Epoch seconds")] = None,
        version: Annotated[
            int | None, Query(ge=1, le=2_147_483_647, description="The definition's version (with or without name)")
        ] = None,
        owner: Annotated[str | None, Query(max_length=2048, description="The principal that started it")] = None,
        error_code: Annotated[
            str | None,
            Query(max_length=128, description="A code of a step's last error (action or compensation)"),
        ] = None,
        trigger: Annotated[
            TriggerName | None, Query(description="Only the workflows this trigger started (any status)")
        ] = None,
        step: Annotated[
            StepName | None, Query(description="A step whose last attempt failed (action or compensation)")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
        cursor: Annotated[str | None, Query(max_length=2048)] = None,
        counts: Annotated[
            bool, Query(description="Count by status on a first page (false: a caller that has the counts)")
        ] = True,
    ) -> WorkflowListPage:
        caller()
        scheduler, _, index, _ = services()
        if trigger is not None:
            trigger_route(trigger)  # an unknown trigger is a 404 that names the known ones, not an empty page
        finder = WorkflowFinder(index, scheduler.config.deadline_shards)
        page = finder.find(
            status=status,
            definition=definition,
            started_after=started_after,
            started_before=started_before,
            trigger=trigger,
            version=version,
            owner=owner,
            error_code=error_code,
            step=step,
            limit=limit,
            cursor=cursor,
            counts=counts,
        )
        return WorkflowListPage(
            workflows=[WorkflowSummaryView.model_validate(asdict(s)) for s in page.workflows],
            next_cursor=page.cursor,
            counts=page.counts,
            source=page.source,
            notes=page.notes,
        )

    @app.get(
        "/ops/workflows/<workflow_id>",
        summary="Read any workflow and its steps",
        responses={200: doc(WorkflowView, "The workflow"), **ERROR_RESPONSES},
    )
    def get_workflow(workflow_id: Annotated[WorkflowId, Path()]) -> WorkflowView:
        caller()
        snapshot = load(workflow_id)
        return WorkflowView.from_snapshot(snapshot, queue_position=services()[0].queue_position(snapshot))

    @app.get(
        "/ops/workflows/<workflow_id>/history",
        summary="Read any workflow's history, oldest event first",
        responses={200: doc(HistoryPage, "One page of events"), **ERROR_RESPONSES},
    )
    def get_history(
        workflow_id: Annotated[WorkflowId, Path()],
        cursor: Annotated[str | None, Query(max_length=16)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_HISTORY_PAGE)] = MAX_HISTORY_PAGE,
    ) -> HistoryPage:
        caller()
        after = history_cursor(cursor)
        return HistoryPage.of(load(workflow_id), after=after, limit=limit)

    @app.get(
        "/ops/workflows/<workflow_id>/steps/<step>/children",
        summary="A map step's child workflows, in item order, by status",
        responses={200: doc(MapChildrenPage, "One page of children"), **ERROR_RESPONSES},
    )
    def map_children(
        workflow_id: Annotated[WorkflowId, Path()],
        step: Annotated[StepName, Path()],
        status: Annotated[StatusFilter | None, Query(description="A status, or PAUSED")] = None,
        cursor: Annotated[str | None, Query(max_length=16)] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    ) -> MapChildrenPage:
        caller()
        scheduler, _, index, _ = services()
        snapshot = load(workflow_id)
        definition = snapshot.workflow.definition
        maps = [s.name for s in definition.steps if s.type == "map"]
        if step not in maps:
            raise StepNotFoundError(
                f"workflow {workflow_id} has no map step {step!r}"
                + (f"; its map steps: {', '.join(maps)}" if maps else "; it has no map step")
            )
        record = snapshot.steps.get(step)
        progress = record.map if record is not None else None
        prefix = f"{workflow_id}:{definition.order.index(step)}:"
        started = progress.launched if progress is not None else 0
        found = WorkflowFinder(index, scheduler.config.deadline_shards).children(
            prefix, started, status=status, start=history_cursor(cursor), limit=limit
        )
        return MapChildrenPage(
            workflow_id=workflow_id,
            step=step,
            total=progress.total if progress is not None else 0,
            started=started,
            id_prefix=prefix,
            children=[MapChildView.model_validate({**asdict(s), "index": i}) for i, s in found.children],
            next_cursor=str(found.next_index) if found.next_index is not None else None,
            examined=found.examined,
        )

    @app.get(
        "/ops/workflows/<workflow_id>/steps/<step>/input",
        summary="A step's input as its attempts get it: rendered now from the workflow, claim-checked payloads read",
        responses={200: doc(StepInputView, "The step's input"), **ERROR_RESPONSES},
    )
    def step_input(workflow_id: Annotated[WorkflowId, Path()], step: Annotated[StepName, Path()]) -> StepInputView:
        caller()
        scheduler = services()[0]
        snapshot = load(workflow_id)
        definition = snapshot.workflow.definition
        with_input = [s.name for s in definition.steps if getattr(s, "input", None) is not None]
        if step not in with_input:
            raise StepNotFoundError(
                f"workflow {workflow_id} has no step {step!r} that takes an input; those that do: "
                + (", ".join(with_input) or "none")
            )
        record = snapshot.steps.get(step)
        if record is None or (record.attempt == 0 and record.input_override is None):  # pending, or skipped by when
            raise StepNotDispatchedError(
                f"step {step!r} of workflow {workflow_id} was never dispatched (it is pending, or its when skipped "
                "it): its input renders from the steps it waits for once they complete"
            )
        edited = record.input_override is not None
        if edited:
            value: Any = record.input_override
        else:
            context = snapshot.context()
            if scheduler.claims is not None:
                context = scheduler.claims.resolve_context(context, workflow_id)
            template: dict[str, Any] = getattr(definition.step(step), "input", None) or {}
            value = render(template, context, where=f"steps[{step}].input")
        size = json_size(value, MAX_READ_BYTES + 1, what=f"steps[{step}].input")
        if size > MAX_READ_BYTES:
            raise PayloadTooLargeError(f"step {step!r}'s rendered input (read it with an SDK)", size, MAX_READ_BYTES)
        return StepInputView(workflow_id=workflow_id, step=step, input=value, bytes=size, edited=edited)

    @app.get(
        "/ops/workflows/<workflow_id>/payloads/<digest>",
        summary="A claim-checked payload of the workflow (an input or output above the claim-check threshold)",
        responses={200: doc(PayloadView, "The payload"), **ERROR_RESPONSES},
    )
    def payload(
        workflow_id: Annotated[WorkflowId, Path()],
        digest: Annotated[str, Path(pattern="^[0-9a-f]{64}$", description="The reference's sha256")],
    ) -> PayloadView:
        caller()
        scheduler = services()[0]
        load(workflow_id)  # an unknown workflow is a 404 of its own
        key = object_key(workflow_id, digest)
        if scheduler.claims is None:
            raise PayloadNotFoundError(f"{key}: this stack claim-checks nothing (no payload bucket)")
        try:
            body = scheduler.claims.store.get(key)
        except ClaimCheckMissingError:
            raise PayloadNotFoundError(f"no claim-checked payload {key}") from None
        if len(body) > MAX_READ_BYTES:
            raise PayloadTooLargeError(
                f"payload {key} (read it from the payload bucket with an SDK)", len(body), MAX_READ_BYTES
            )
        return PayloadView(workflow_id=workflow_id, key=key, bytes=len(body), payload=json.loads(body))

    @app.post(
        "/ops/workflows/<workflow_id>/<action>",
        summary="Act on a workflow: retry, skip, compensate, retry-compensation, resolve, pause, resume, cancel",
        responses={200: doc(WorkflowView, "The workflow after the action"), **ERROR_RESPONSES},
    )
    def act(
        workflow_id: Annotated[WorkflowId, Path()],
        action: Annotated[OperatorAction, Path()],
        request: OperatorActionRequest,
        idempotency_key: Annotated[IdempotencyKey | None, Header(alias="idempotency-key")] = None,
    ) -> Response[WorkflowView]:
        principal = caller()
        scheduler, bus, _, _ = services()
        snapshot, messages = scheduler.operate(
            workflow_id,
            action,
            principal=principal,
            reason=request.reason,
            action_id=idempotency_key or str(uuid.uuid4()),
            step=request.step,
            step_input=request.input,
            # An explicit null is an output; a body without one gives none (transitions.NO_OUTPUT).
            output=request.output if "output" in request.model_fields_set else NO_OUTPUT,
        )
        if messages:
            bus.send(messages)  # what is not sent is resent by the supervisor after its complete-by
        return Response(
            status_code=200, content_type=content_types.APPLICATION_JSON, body=WorkflowView.from_snapshot(snapshot)
        )

    @app.post(
        "/ops/callbacks/<token>",
        summary="Answer any workflow's waiting callback step as an operator: approve or reject it (audited)",
        responses={200: doc(CallbackResult, "Applied (or this same answer, applied before)"), **ERROR_RESPONSES},
    )
    def answer_callback(
        token: Annotated[str, Path(min_length=1, max_length=MAX_TOKEN_CHARS)],
        request: OperatorCallbackRequest,
        idempotency_key: Annotated[IdempotencyKey | None, Header(alias="idempotency-key")] = None,
    ) -> Response[CallbackResult]:
        principal = caller()
        scheduler, bus, _, _ = services()
        audit = {
            "action": request.answer,
            "principal": principal,
            "reason": request.reason,
            "id": idempotency_key or str(uuid.uuid4()),
        }
        _, result, messages = scheduler.callback(token, request.as_answer(), owner=None, audit=audit)
        if messages:
            bus.send(messages)  # what the answer let start; a message not sent is resent by the supervisor
        return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=result)

    @app.get(
        "/ops/overdue",
        summary="Steps overdue now, and workflows that look stuck",
        responses={200: doc(OverdueView, "Overdue and stuck workflows"), **ERROR_RESPONSES},
    )
    def overdue(
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
        older_than: Annotated[int, Query(ge=0, le=31_622_400, description="Seconds overdue, at least.")] = 0,
    ) -> OverdueView:
        caller()
        scheduler, _, index, _ = services()
        config = scheduler.config
        now = epoch_seconds(scheduler.clock)
        threshold = overdue_before(now, config.deadline_grace_seconds, older_than)
        found = WorkflowFinder(index, config.deadline_shards).overdue(
            now, config.deadline_grace_seconds, stuck_at=config.stuck_after, limit=limit, older_than=older_than
        )
        # An index key may be a lower bound (records.index_key_for): read each entry's workflow and keep what is
        # overdue by its own complete-by, as the supervisor does before it acts.
        overdue = []
        for summary in found["overdue"]:
            snapshot = scheduler.store.load(summary.workflow_id, consistent=False)
            deadline = snapshot.deadline if snapshot is not None else None
            if deadline is not None and deadline < threshold:
                overdue.append(dataclasses.replace(summary, complete_by=deadline))
        overdue.sort(key=by_complete_by)  # by the re-read complete-by: the worst first (issue 19)
        return OverdueView(
            now=now,
            grace_seconds=config.deadline_grace_seconds,
            older_than_seconds=older_than,
            stuck_after=config.stuck_after,
            overdue=[WorkflowSummaryView.model_validate(asdict(s)) for s in overdue],
            stuck=[WorkflowSummaryView.model_validate(asdict(s)) for s in found["stuck"]],
        )

    @app.get(
        "/ops/dead-letters",
        summary="Dead-letter queues: every queue's depth, or one queue's messages",
        responses={200: doc(DeadLetterList, "The dead-letter queues"), **ERROR_RESPONSES},
    )
    def dead_letters(
        queue: Annotated[str | None, Query(max_length=80)] = None,
        limit: Annotated[
            int, Query(ge=0, le=100, description="Messages to peek at; 0: only the depth and the move tasks.")
        ] = 50,
    ) -> DeadLetterList:
        caller()
        scheduler, _, _, queues = services()
        if queue is None:
            views = [DeadLetterQueueView(queue=name, approximate_messages=n) for name, n in queues.depths().items()]
            return DeadLetterList(queues=views)
        listing = queues.peek(queue, now=epoch_seconds(scheduler.clock), limit=limit)
        return DeadLetterList(
            queues=[
                DeadLetterQueueView(
                    queue=listing.queue,
                    approximate_messages=listing.approximate_messages,
                    messages=[DeadLetterView.model_validate(asdict(m)) for m in listing.messages],
                    move_tasks=listing.move_tasks,
                )
            ]
        )

    @app.post(
        "/ops/dead-letters/redrive",
        summary="Move a dead-letter queue's messages back to the queues they came from",
        responses={202: doc(RedriveResult, "The move started"), **ERROR_RESPONSES},
    )
    def redrive(request: RedriveRequest) -> Response[RedriveResult]:
        principal = caller()
        _, _, _, queues = services()
        result = queues.redrive(request.queue, max_per_second=request.max_per_second)
        body = RedriveResult.model_validate(result)
        # The audit of a redrive: it acts on a queue, not on one workflow's history, so its record is this line (the
        # Logs Insights query of docs/operate.md for operator actions finds it) and SQS's own list of move tasks.
        logger.info(
            "operator action",
            extra={
                "action": "dlq-redrive",
                "queue": request.queue,
                "principal": principal,
                "reason": request.reason,
                "task_handle": body.task_handle,
                "approximate_messages": body.approximate_messages,
            },
        )
        return Response(status_code=202, content_type=content_types.APPLICATION_JSON, body=body)

    def trigger_route(name: str) -> TriggerRoute:
        route = services()[0].config.triggers.get(name)
        if route is None:
            known = ", ".join(sorted(services()[0].config.triggers)) or "none"
            raise TriggerNotFoundError(f"no trigger {name!r} in this stack (triggers.yaml); its triggers: {known}")
        return route

    def trigger_view(name: str, state: TriggerState) -> TriggerStateView:
        route = trigger_route(name)
        return TriggerStateView(
            name=name,
            kind=route.kind,
            definition=route.definition,
            source=route.source,
            principal=route.principal,
            paused=state.paused,
            paused_by=state.paused_by,
            paused_at=state.paused_at,
            pause_reason=state.pause_reason,
            skipped=state.skipped,
            missed=state.missed,
            buffered=state.buffered,
            held=state.held,
            running=state.running,
            waiting=state.waiting_occurrence,
        )

    @app.get(
        "/ops/triggers",
        summary="The triggers: what each starts, whether it is paused, what it skipped",
        responses={200: doc(TriggerList, "Every trigger of triggers.yaml"), **ERROR_RESPONSES},
    )
    def list_triggers() -> TriggerList:
        caller()
        names = sorted(services()[0].config.triggers)
        states = triggers().states(names)
        return TriggerList(triggers=[trigger_view(n, state) for n, state in zip(names, states, strict=True)])

    @app.post(
        "/ops/triggers/<name>/<action>",
        summary="Pause or resume a trigger, or run it now (one occurrence as if its tick had come)",
        responses={
            200: doc(TriggerStateView, "Paused or resumed"),
            202: doc(RunNowResult, "The occurrence was sent to the trigger's queue"),
            **ERROR_RESPONSES,
        },
    )
    def act_on_trigger(
        name: Annotated[TriggerName, Path()],
        action: Annotated[TriggerAction, Path()],
        request: TriggerActionRequest,
        idempotency_key: Annotated[IdempotencyKey | None, Header(alias="idempotency-key")] = None,
    ) -> Response[Any]:
        principal = caller()
        scheduler, bus, _, _ = services()
        route = trigger_route(name)
        now = epoch_seconds(scheduler.clock)
        audit = {"action": f"trigger-{action}", "trigger": name, "principal": principal, "reason": request.reason}
        if action == "run-now" and route.kind == "event":
            raise TriggerNotRunnableError(
                f"trigger {name} starts a workflow for each event its rule matches on its bus: it has no tick to run "
                "now; put an event on the bus (aws events put-events, or python -m devstack emit on the local stack)"
            )
        if action == "run-now" and route.kind == "s3":
            raise TriggerNotRunnableError(
                f"trigger {name} starts a workflow for each upload to its bucket: it has no tick to run now; upload "
                "an object (aws s3 cp, or python -m devstack upload on the local stack)"
            )
        if action == "run-now" and route.kind == "sqs":
            raise TriggerNotRunnableError(
                f"trigger {name} starts a workflow for each message sent to its queue: it has no tick to run now; "
                "send a message to the queue (aws sqs send-message, or python -m devstack send on the local stack)"
            )
        if action == "run-now":
            from .triggers import occurrence_key, run_now_body, run_now_occurrence

            key = idempotency_key or str(uuid.uuid4())
            occurrence = run_now_occurrence(key, principal)
            failed = bus.send([Outgoing(route.queue_url, run_now_body(key, now, principal))])
            if failed:
                raise RetryableError(f"the run-now of trigger {name} was not sent; send it again")
            workflow_id = scheduler.workflow_id(route.principal, occurrence_key(name, occurrence))
            result = RunNowResult(trigger=name, occurrence=occurrence, workflow_id=workflow_id)
            logger.info("operator action", extra={**audit, "occurrence": occurrence})
            return Response(status_code=202, content_type=content_types.APPLICATION_JSON, body=result)
        store = triggers()
        state = store.pause(name, principal, request.reason, now) if action == "pause" else store.resume(name)
        logger.info("operator action", extra=audit)
        return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=trigger_view(name, state))

    def batch_service() -> BatchService:
        if batches is None:
            raise ConfigurationError("this operators' function runs no batches (no BATCH_QUEUE_URL)")
        return batches()

    def where_of(where: BatchWhere) -> BatchFilter:
        from .batches import BatchFilter  # the batch routes' module loads on their first request, not at cold start

        return BatchFilter(**where.model_dump(exclude_none=True))

    @app.post(
        "/ops/batches",
        summary="Act on every workflow a filter matches (a batch), or count them first (dry_run)",
        responses={
            200: doc(BatchPreview, "The dry run's counts, or the batch this Idempotency-Key started already"),
            202: doc(BatchView, "The batch started"),
            **ERROR_RESPONSES,
        },
    )
    def start_batch(
        request: BatchRequest,
        idempotency_key: Annotated[IdempotencyKey | None, Header(alias="idempotency-key")] = None,
    ) -> Response[Any]:
        from .batches import batch_id_for, new_batch, preview

        principal = caller()
        scheduler, _, index, _ = services()
        where = where_of(request.where)
        if request.dry_run:
            step = request.step if request.step is not None or request.action not in STEP_ACTIONS else where.step
            finder = WorkflowFinder(index, scheduler.config.deadline_shards)
            seen = preview(finder, where, step=step if request.action in STEP_ACTIONS else None)
            body: Any = BatchPreview(
                action=request.action,
                where=where.given(),
                matched=seen.matched,
                by_status=seen.by_status,
                sample=seen.sample,
                truncated=seen.truncated,
                step=step,
                step_not_failed=seen.step_not_failed,
            )
            return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=body)
        batch = new_batch(
            batch_id_for(principal, idempotency_key),
            request.action,
            where,
            principal=principal,
            reason=request.reason,
            now=epoch_seconds(scheduler.clock),
            step=request.step if request.step is not None or request.action not in STEP_ACTIONS else where.step,
            max_per_second=request.max_per_second,
            output=request.output if "output" in request.model_fields_set else NO_OUTPUT,
        )
        stored, created = batch_service().start(batch, repeatable=idempotency_key is not None)
        logger.info(
            "operator action",
            extra={
                "action": f"batch-{request.action}",
                "batch_id": stored.batch_id,
                "principal": principal,
                "reason": request.reason,
                "where": where.given(),
            },
        )
        return Response(
            status_code=202 if created else 200,
            content_type=content_types.APPLICATION_JSON,
            body=BatchView.of(stored),
        )

    @app.get(
        "/ops/batches",
        summary="The batches, newest first",
        responses={200: doc(BatchList, "One page of batches"), **ERROR_RESPONSES},
    )
    def list_batches(
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        cursor: Annotated[str | None, Query(max_length=2048)] = None,
    ) -> BatchList:
        caller()
        start = cursor_key(cursor) if cursor else None
        found, after = batch_service().store.list(limit, start)
        return BatchList(
            batches=[BatchView.of(b) for b in found], next_cursor=key_cursor(after) if after is not None else None
        )

    def load_batch(batch_id: str) -> Batch:
        batch = batch_service().store.get(batch_id, consistent=True)
        if batch is None:
            raise BatchNotFoundError(f"no batch {batch_id}")
        return batch

    @app.get(
        "/ops/batches/<batch_id>",
        summary="A batch: its filter, who started it and why, its progress",
        responses={200: doc(BatchView, "The batch"), **ERROR_RESPONSES},
    )
    def get_batch(batch_id: Annotated[str, Path(max_length=64, pattern=BATCH_ID_PATTERN)]) -> BatchView:
        caller()
        return BatchView.of(load_batch(batch_id))

    @app.get(
        "/ops/batches/<batch_id>/workflows",
        summary="The workflows a batch touched, in the order it claimed them, with what became of each",
        responses={200: doc(BatchWorkflowsPage, "One page of workflows"), **ERROR_RESPONSES},
    )
    def batch_workflows(
        batch_id: Annotated[str, Path(max_length=64, pattern=BATCH_ID_PATTERN)],
        cursor: Annotated[str | None, Query(max_length=16, pattern="^[0-9]+$")] = None,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    ) -> BatchWorkflowsPage:
        from .batches import touched

        caller()
        load_batch(batch_id)
        skip = int(cursor or 0)
        rows: list[BatchWorkflow] = []
        more = False
        for n, (workflow_id, outcome) in enumerate(touched(batch_service().store, batch_id)):
            if n < skip:
                continue
            if len(rows) == limit:
                more = True
                break
            rows.append(BatchWorkflow(workflow_id=workflow_id, outcome=outcome))
        return BatchWorkflowsPage(batch_id=batch_id, workflows=rows, next_cursor=str(skip + limit) if more else None)

    @app.post(
        "/ops/batches/<batch_id>/cancel",
        summary="Stop a batch: it claims no more workflows (a page being acted on is finished)",
        responses={200: doc(BatchView, "The batch, CANCELLED"), **ERROR_RESPONSES},
    )
    def cancel_batch(
        batch_id: Annotated[str, Path(max_length=64, pattern=BATCH_ID_PATTERN)], request: BatchCancelRequest
    ) -> BatchView:
        from .batches import cancel

        principal = caller()
        scheduler = services()[0]
        stopped = cancel(
            batch_service().store,
            batch_id,
            principal=principal,
            reason=request.reason,
            now=epoch_seconds(scheduler.clock),
        )
        logger.info(
            "operator action",
            extra={"action": "batch-cancel", "batch_id": batch_id, "principal": principal, "reason": request.reason},
        )
        return BatchView.of(stopped)

    @app.get("/ops/openapi.json", summary="OpenAPI document of the operator routes", include_in_schema=False)
    def openapi() -> Response[str]:
        caller()
        document = json.loads(app.get_openapi_json_schema(title="sasflow operators", version="1.0.0"))
        return Response(status_code=200, content_type=content_types.APPLICATION_JSON, body=json.dumps(document))

    install_error_handlers(app)
    return app
