"""Store records: what the state store holds for a workflow and its steps.

These are the domain's view of the items; ``adapters.dynamodb_store`` converts them to and from DynamoDB items
explicitly (keys, JSON-encoded documents, sparse deadline attributes). API and queue models live elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .definition import WorkflowDefinition
from .states import IN_FLIGHT_STEP, Phase, StepStatus, WorkflowStatus


@dataclass(frozen=True)
class WorkflowRecord:
    """One workflow.

    Attributes
    ----------
    workflow_id, status, definition, input:
        Identity, status, the validated definition and the workflow input (a JSON object).
    request_hash:
        SHA-256 (hex) of the canonical start request; compares repeated starts with one Idempotency-Key.
    idempotency_key:
        The client's Idempotency-Key header, if any.
    created_at, updated_at:
        Epoch seconds.
    reason:
        Why the workflow is unwinding (failed step and error), or null.
    stall_at:
        Safety-net deadline (epoch seconds) while the workflow is not terminal; the supervisor re-examines the
        workflow after it. Null once terminal.
    """

    workflow_id: str
    status: WorkflowStatus
    definition: WorkflowDefinition
    input: dict[str, Any]
    request_hash: str
    created_at: int
    updated_at: int
    idempotency_key: str | None = None
    reason: str | None = None
    stall_at: int | None = None


@dataclass(frozen=True)
class StepRecord:
    """One step of one workflow.

    ``attempt`` counts dispatches of the forward action and ``comp_attempt`` those of its compensation.
    ``complete_by`` (epoch seconds) and ``dl_shard`` are set exactly while the step is in flight (PROCESSING or
    COMPENSATING): they are the sparse deadline index's keys (DESIGN Rule 3).
    ``may_have_happened`` is true for a FAILED step whose outcome is unknown (timeouts, transient errors), which
    must therefore be compensated (Rule 6).
    """

    workflow_id: str
    step: str
    agent: str
    status: StepStatus
    attempt: int = 0
    comp_attempt: int = 0
    complete_by: int | None = None
    dl_shard: str | None = None
    input: dict[str, Any] = field(default_factory=dict)
    output: Any = None
    error: dict[str, Any] | None = None
    may_have_happened: bool = False
    resends: int = 0
    deferrals: int = 0
    comp_output: Any = None
    updated_at: int = 0

    @property
    def in_flight(self) -> bool:
        """True while the forward action or the compensation is in flight."""
        return self.status in IN_FLIGHT_STEP

    @property
    def phase(self) -> Phase:
        """The phase of the step's current or last attempt."""
        if self.status in (StepStatus.COMPENSATING, StepStatus.COMPENSATED, StepStatus.COMPENSATION_FAILED):
            return Phase.COMPENSATION
        return Phase.ACTION

    def attempt_for(self, phase: Phase) -> int:
        """Return the attempt counter of ``phase``."""
        return self.comp_attempt if phase is Phase.COMPENSATION else self.attempt

    def evolve(self, **changes: Any) -> StepRecord:
        """Return a copy with ``changes`` applied."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Snapshot:
    """A workflow and all its step records, read together with a strongly consistent query."""

    workflow: WorkflowRecord
    steps: dict[str, StepRecord]

    def with_step(self, record: StepRecord) -> Snapshot:
        """Return a snapshot where ``record`` replaces the step of the same name."""
        return Snapshot(self.workflow, {**self.steps, record.step: record})

    def with_workflow(self, workflow: WorkflowRecord) -> Snapshot:
        """Return a snapshot with ``workflow`` replaced."""
        return Snapshot(workflow, self.steps)

    def status_of(self, step: str) -> StepStatus:
        """Return the status of ``step``; a step with no record is PENDING."""
        record = self.steps.get(step)
        return record.status if record else StepStatus.PENDING


@dataclass(frozen=True)
class DeadlineEntry:
    """An entry of the deadline index and its complete-by (epoch seconds).

    ``step`` is the in-flight step, or None for a workflow's own safety-net (stall) deadline. ``status`` is the
    step's or the workflow's status as the (eventually consistent) index saw it.
    """

    workflow_id: str
    step: str | None
    attempt: int
    status: str
    complete_by: int
