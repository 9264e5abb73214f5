"""The state machine's transition tables are enforced at the store boundary."""

from __future__ import annotations

import pytest

from sasflow.adapters.memory import InMemoryStateStore
from sasflow.records import StepRecord
from sasflow.states import StepStatus, WorkflowStatus, check_step_transition, check_workflow_transition


@pytest.mark.parametrize(
    ("current", "target"),
    [
        (StepStatus.COMPLETED, StepStatus.PROCESSING),
        (StepStatus.COMPENSATED, StepStatus.COMPENSATING),
        (StepStatus.SKIPPED, StepStatus.PROCESSING),
        (StepStatus.PENDING, StepStatus.COMPLETED),
        (StepStatus.FAILED, StepStatus.COMPLETED),
    ],
)
def test_illegal_step_transitions_are_refused(current: StepStatus, target: StepStatus) -> None:
    with pytest.raises(ValueError, match=f"{current.value} -> {target.value} is not allowed"):
        check_step_transition(current, target)


def test_terminal_workflows_never_change() -> None:
    for terminal in (WorkflowStatus.COMPLETED, WorkflowStatus.COMPENSATED, WorkflowStatus.CANCELLED):
        with pytest.raises(ValueError, match="is not allowed"):
            check_workflow_transition(terminal, WorkflowStatus.RUNNING)


def test_the_store_refuses_an_illegal_step_write_before_touching_anything() -> None:
    store = InMemoryStateStore()
    done = StepRecord(workflow_id="w", step="s", agent="a", status=StepStatus.COMPLETED, attempt=1)
    with pytest.raises(ValueError, match="PENDING -> COMPLETED"):
        store.put_step(done, expect=None)
    assert store.steps == {}
