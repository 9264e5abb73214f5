"""API request and response models (kept apart from queue messages and store records)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .definition import WorkflowDefinition
from .records import Snapshot
from .states import StepStatus, WorkflowStatus

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


class StartWorkflowRequest(BaseModel):
    """Body of ``POST /workflows``: the definition to run and the workflow input."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [_TRIP_EXAMPLE]})

    definition: WorkflowDefinition
    input: dict[str, Any] = Field(default_factory=dict, description="Workflow input; steps refer to it as input.*")


class StepView(BaseModel):
    """One step as the API shows it. Times are epoch seconds."""

    name: str
    agent: str
    action: str
    status: StepStatus
    attempt: int = Field(description="Dispatches of the action so far.")
    compensation_attempt: int = Field(description="Dispatches of the compensation so far.")
    complete_by: int | None = Field(default=None, description="Deadline of the attempt in flight (epoch seconds).")
    resends: int = Field(description="Times the supervisor resent this step after its complete-by.")
    output: Any = None
    error: dict[str, Any] | None = None
    compensation_output: Any = None


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
    input: dict[str, Any]
    steps: list[StepView]

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> WorkflowView:
        """Build the view of a store snapshot; steps never dispatched show as PENDING."""
        workflow = snapshot.workflow
        steps = []
        for step in workflow.definition.steps:
            record = snapshot.steps.get(step.name)
            steps.append(
                StepView(
                    name=step.name,
                    agent=step.agent,
                    action=step.action,
                    status=record.status if record else StepStatus.PENDING,
                    attempt=record.attempt if record else 0,
                    compensation_attempt=record.comp_attempt if record else 0,
                    complete_by=record.complete_by if record else None,
                    resends=record.resends if record else 0,
                    output=record.output if record else None,
                    error=record.error if record else None,
                    compensation_output=record.comp_output if record else None,
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
            input=workflow.input,
            steps=steps,
        )


class ErrorResponse(BaseModel):
    """Every error body (always a 4xx): a stable ``error`` code, a human ``message`` and, for a request that failed
    validation, ``details`` with the ``loc``, ``msg`` and ``type`` of each problem."""

    error: str
    message: str
    details: list[dict[str, Any]] | None = None
