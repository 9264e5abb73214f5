"""Workflow and step states, and which transitions are allowed (DESIGN "States").

Step: ``PENDING → PROCESSING (attempt n, complete_by) → COMPLETED | FAILED``; on timeout PROCESSING again with
attempt n+1 while attempts remain. During compensation: ``COMPENSATING → COMPENSATED | COMPENSATION_FAILED``.
A step never dispatched when compensation starts is sealed as ``SKIPPED`` so that it can never start later; a step
whose ``when`` condition is false is ``SKIPPED`` instead of dispatched, and counts as done for its dependents.

Workflow: ``RUNNING → COMPLETED``, or ``→ COMPENSATING → COMPENSATED | COMPENSATION_FAILED``, or on cancel
``→ CANCELLING → CANCELLED`` (CANCELLING compensates like COMPENSATING). A step that runs out of attempts under the
``hold`` failure policy puts the workflow ``HELD`` instead of unwinding: it waits for a person (or its hold timeout).
A start over its tenant's limit under ``over_limit: queue`` is ``QUEUED`` (nothing dispatched, in no deadline) until
a slot frees: ``QUEUED → RUNNING``, or ``→ CANCELLED`` when cancelled before it starts.
Terminal states never change again, except through an audited operator action (``OPERATOR_*_TRANSITIONS``: a write
that makes one carries the operator's event in the workflow's history, which the store checks).
"""

from __future__ import annotations

from enum import StrEnum
from typing import TypeVar


class StepStatus(StrEnum):
    """Status of one step of a workflow."""

    PENDING = "PENDING"
    PROCESSING = "PROCESSING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    COMPENSATING = "COMPENSATING"
    COMPENSATED = "COMPENSATED"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"


class WorkflowStatus(StrEnum):
    """Status of a workflow."""

    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    COMPENSATING = "COMPENSATING"
    COMPENSATED = "COMPENSATED"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"
    CANCELLING = "CANCELLING"
    CANCELLED = "CANCELLED"
    HELD = "HELD"
    QUEUED = "QUEUED"


class Phase(StrEnum):
    """Which action of a step a message is about: the forward action or its compensation."""

    ACTION = "action"
    COMPENSATION = "compensation"


class Outcome(StrEnum):
    """What an agent reports about one attempt.

    ``SUCCEEDED``: the action happened; ``REJECTED``: the service refused it and nothing happened (definitive);
    ``FAILED``: transient failures outlasted the attempt's budget, the action may have happened;
    ``DEFERRED``: the circuit breaker is open, no call was made and the attempt is not used up.
    """

    SUCCEEDED = "succeeded"
    REJECTED = "rejected"
    FAILED = "failed"
    DEFERRED = "deferred"


StatusT = TypeVar("StatusT", "StepStatus", "WorkflowStatus")

TERMINAL_WORKFLOW = frozenset(
    {
        WorkflowStatus.COMPLETED,
        WorkflowStatus.COMPENSATED,
        WorkflowStatus.COMPENSATION_FAILED,
        WorkflowStatus.CANCELLED,
    }
)
UNWINDING_WORKFLOW = frozenset({WorkflowStatus.COMPENSATING, WorkflowStatus.CANCELLING})
#: The states in which a workflow waits for a person (listed by the operator routes at any table size).
NEEDS_A_PERSON = frozenset({WorkflowStatus.COMPENSATION_FAILED, WorkflowStatus.HELD})
#: The ends after which no step runs again unless a person acts: a trigger's slot (``overlap: skip``, ``buffer_one``)
#: is free once its holder is here (``triggers.py``). HELD and COMPENSATION_FAILED wait for a person: they keep it.
ENDED_RUN = TERMINAL_WORKFLOW - NEEDS_A_PERSON
IN_FLIGHT_STEP = frozenset({StepStatus.PROCESSING, StepStatus.COMPENSATING})
#: What a running workflow's steps count as done for their dependents and for its completion: COMPLETED, or SKIPPED
#: (while a workflow runs, only a step whose ``when`` was false is SKIPPED; unwinding seals the rest SKIPPED too).
DONE_STEP = frozenset({StepStatus.COMPLETED, StepStatus.SKIPPED})

#: Allowed step transitions; the store checks every write against them (`check_step_move`, at the store boundary).
STEP_TRANSITIONS: dict[StepStatus, frozenset[StepStatus]] = {
    # PENDING -> FAILED: the step's first request could not be prepared (its input, a size limit), so it was never sent.
    StepStatus.PENDING: frozenset({StepStatus.PROCESSING, StepStatus.SKIPPED, StepStatus.FAILED}),
    StepStatus.PROCESSING: frozenset({StepStatus.PROCESSING, StepStatus.COMPLETED, StepStatus.FAILED}),
    # -> COMPENSATION_FAILED directly: the compensation's request could not be prepared, so nothing can undo it.
    StepStatus.COMPLETED: frozenset({StepStatus.COMPENSATING, StepStatus.COMPENSATION_FAILED}),
    StepStatus.FAILED: frozenset({StepStatus.COMPENSATING, StepStatus.COMPENSATION_FAILED}),
    StepStatus.SKIPPED: frozenset(),
    StepStatus.COMPENSATING: frozenset(
        {StepStatus.COMPENSATING, StepStatus.COMPENSATED, StepStatus.COMPENSATION_FAILED}
    ),
    StepStatus.COMPENSATED: frozenset(),
    StepStatus.COMPENSATION_FAILED: frozenset(),
}

WORKFLOW_TRANSITIONS: dict[WorkflowStatus, frozenset[WorkflowStatus]] = {
    # Waiting for a slot of its tenant (``tenancy.py``, ``over_limit: queue``): it starts, or is cancelled unstarted.
    WorkflowStatus.QUEUED: frozenset({WorkflowStatus.RUNNING, WorkflowStatus.CANCELLED}),
    WorkflowStatus.RUNNING: frozenset(
        {WorkflowStatus.COMPLETED, WorkflowStatus.COMPENSATING, WorkflowStatus.CANCELLING, WorkflowStatus.HELD}
    ),
    # A held workflow's hold timeout passes (the supervisor compensates), or it is cancelled.
    WorkflowStatus.HELD: frozenset({WorkflowStatus.COMPENSATING, WorkflowStatus.CANCELLING}),
    WorkflowStatus.COMPENSATING: frozenset({WorkflowStatus.COMPENSATED, WorkflowStatus.COMPENSATION_FAILED}),
    WorkflowStatus.CANCELLING: frozenset({WorkflowStatus.CANCELLED, WorkflowStatus.COMPENSATION_FAILED}),
    WorkflowStatus.COMPLETED: frozenset(),
    WorkflowStatus.COMPENSATED: frozenset(),
    WorkflowStatus.COMPENSATION_FAILED: frozenset(),
    WorkflowStatus.CANCELLED: frozenset(),
}


def _closure(table: dict[StatusT, frozenset[StatusT]]) -> dict[StatusT, frozenset[StatusT]]:
    """Every status reachable from each status in one or more allowed transitions."""
    result: dict[StatusT, frozenset[StatusT]] = {}
    for start in table:
        seen: set[StatusT] = set()
        frontier = list(table[start])
        while frontier:
            status = frontier.pop()
            if status not in seen:
                seen.add(status)
                frontier.extend(table[status])
        result[start] = frozenset(seen)
    return result


#: Moves only an operator makes, each audited in the history of the write that makes it (``retry``, ``skip``,
#: ``retry-compensation``, ``resolve``): a failed step is tried again or marked done; a failed compensation is tried
#: again or marked done by hand.
OPERATOR_STEP_TRANSITIONS: dict[StepStatus, frozenset[StepStatus]] = {
    StepStatus.FAILED: frozenset({StepStatus.PROCESSING, StepStatus.COMPLETED}),
    StepStatus.COMPENSATION_FAILED: frozenset({StepStatus.COMPENSATING, StepStatus.COMPENSATED}),
}
#: A held workflow goes on (``retry``, ``skip``); a COMPENSATION_FAILED one unwinds again (``retry-compensation``,
#: ``resolve``), which may end it COMPENSATED in the same write.
OPERATOR_WORKFLOW_TRANSITIONS: dict[WorkflowStatus, frozenset[WorkflowStatus]] = {
    WorkflowStatus.HELD: frozenset({WorkflowStatus.RUNNING}),
    WorkflowStatus.COMPENSATION_FAILED: frozenset(
        {WorkflowStatus.COMPENSATING, WorkflowStatus.CANCELLING, WorkflowStatus.COMPENSATED, WorkflowStatus.CANCELLED}
    ),
}

#: Moves the scheduler makes by itself right after a step's own transition, in the same write: a step that completed
#: or failed while its workflow unwinds starts its compensation at once.
STEP_FOLLOW_UPS: dict[StepStatus, frozenset[StepStatus]] = {
    StepStatus.COMPLETED: frozenset({StepStatus.COMPENSATING, StepStatus.COMPENSATION_FAILED}),
    StepStatus.FAILED: frozenset({StepStatus.COMPENSATING, StepStatus.COMPENSATION_FAILED}),
}
#: Where one write may take a workflow: any status reachable through allowed transitions (a rejected first step
#: with nothing to compensate goes RUNNING -> COMPENSATING -> COMPENSATED in one write).
WORKFLOW_REACHABLE = _closure(WORKFLOW_TRANSITIONS)


def check_step_move(current: StepStatus, target: StepStatus, *, audited: bool = False) -> None:
    """Raise ``ValueError`` unless one write may take a step from ``current`` to ``target``.

    One write applies at most one event to a step (a dispatch, a reply, a timeout: one allowed transition), then,
    for a step that was in flight, possibly one of the scheduler's ``STEP_FOLLOW_UPS``. So PENDING -> COMPLETED is
    refused (a reply needs a dispatch written before it), and so is PENDING -> COMPENSATING (a step whose first
    request could not be prepared fails without ever having been sent: there is nothing to compensate).
    """
    allowed = STEP_TRANSITIONS[current]
    if target in allowed:
        return
    if audited and target in OPERATOR_STEP_TRANSITIONS.get(current, frozenset()):
        return
    if current in IN_FLIGHT_STEP and any(target in STEP_FOLLOW_UPS.get(step, frozenset()) for step in allowed):
        return
    raise ValueError(f"step transition {current.value} -> {target.value} is not allowed")


def check_workflow_move(current: WorkflowStatus, target: WorkflowStatus, *, audited: bool = False) -> None:
    """Raise ``ValueError`` unless ``target`` is reachable from ``current`` through allowed workflow transitions.

    With ``audited`` (the write carries an operator's event), an operator's move is allowed too, and what is reachable
    from where it leads (a held workflow resumed may complete in the same write).
    """
    if target in WORKFLOW_REACHABLE[current]:
        return
    if audited and any(
        target == via or target in WORKFLOW_REACHABLE[via] for via in OPERATOR_WORKFLOW_TRANSITIONS.get(current, ())
    ):
        return
    if target not in WORKFLOW_REACHABLE[current]:
        raise ValueError(f"workflow transition {current.value} -> {target.value} is not allowed")
