"""The state machine's transition tables are enforced at the store boundary."""

from __future__ import annotations

import pytest

from sasflow.records import StepRecord
from sasflow.states import (
    StepStatus,
    WorkflowStatus,
    check_step_move,
    check_workflow_move,
)
from tests.support.pipeline import Pipeline


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
        check_step_move(current, target)


def test_terminal_workflows_never_change() -> None:
    for terminal in (WorkflowStatus.COMPLETED, WorkflowStatus.COMPENSATED, WorkflowStatus.CANCELLED):
        with pytest.raises(ValueError, match="is not allowed"):
            check_workflow_move(terminal, WorkflowStatus.RUNNING)


def test_one_write_may_carry_an_event_and_the_schedulers_follow_up_but_no_more() -> None:
    # A reply that fails a step of an unwinding workflow starts its compensation in the same write
    check_step_move(StepStatus.PROCESSING, StepStatus.COMPENSATING)
    check_step_move(StepStatus.PROCESSING, StepStatus.PROCESSING)
    # A reply needs a dispatch written before it; a finished compensation never starts again
    for current, target in [
        (StepStatus.PENDING, StepStatus.COMPLETED),
        (StepStatus.PENDING, StepStatus.COMPENSATING),
        (StepStatus.PROCESSING, StepStatus.COMPENSATED),
        (StepStatus.COMPENSATED, StepStatus.COMPENSATING),
    ]:
        with pytest.raises(ValueError, match=f"{current.value} -> {target.value} is not allowed"):
            check_step_move(current, target)


def test_the_store_refuses_an_illegal_step_write_before_touching_anything() -> None:
    # Given a stored workflow whose charge step was never dispatched
    p = Pipeline()
    wid = p.start()
    base = p.snapshot(wid)
    done = StepRecord(step="charge_card", status=StepStatus.COMPLETED, attempt=1)
    # When a write would make it COMPLETED without a dispatch
    with pytest.raises(ValueError, match="PENDING -> COMPLETED"):
        p.store.save(base.with_step(done), expect=base)
    # Then nothing changed
    assert p.snapshot(wid) == base
    assert p.store.writes == {"put_definition": 1, "create": 1}


def test_a_terminal_workflow_is_never_written_again() -> None:
    p = Pipeline()
    wid = p.start()
    p.pump()
    final = p.snapshot(wid)
    assert final.workflow.status is WorkflowStatus.COMPLETED
    with pytest.raises(ValueError, match="terminal states never change"):
        p.store.save(final.with_workflow(final.workflow.evolve(reason="edited")), expect=final)


def test_both_stores_refuse_a_complete_by_that_is_not_int_epoch_seconds() -> None:
    # The in-memory store applies the DynamoDB adapter's check (records.check_deadlines), so unit tests catch what
    # AWS would reject
    p = Pipeline()
    wid = p.start()
    base = p.snapshot(wid)
    flight = base.steps["reserve_flight"]
    assert flight.complete_by is not None
    with pytest.raises(TypeError, match="complete_by of reserve_flight must be int epoch seconds, got str"):
        p.store.save(base.with_step(flight.evolve(complete_by=str(flight.complete_by))), expect=base)
    with pytest.raises(ValueError, match="looks like milliseconds"):
        p.store.save(base.with_step(flight.evolve(complete_by=flight.complete_by * 1000)), expect=base)
    assert p.snapshot(wid) == base
