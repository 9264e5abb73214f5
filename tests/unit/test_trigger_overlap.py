"""A trigger's overlap policy: ``skip`` starts no tick while its last run has not ended, ``buffer_one`` keeps one
waiting and starts it when that run ends; the slot moves by conditional writes only, and a crash anywhere leaves
nothing held for ever."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from sasflow.definition import parse_definition
from sasflow.registry import DefinitionRegistry
from sasflow.states import WorkflowStatus
from sasflow.triggers import (
    STARTING_GRACE_SECONDS,
    TriggerConfig,
    TriggerRefusedError,
    TriggerService,
    TriggerState,
    iso_utc,
    occurrence_of,
    run_now_body,
)
from tests.support.pipeline import OWNER, Pipeline, trip_definition

NAME = "hourly-trip"
QUEUE = "queue/hourly-trip"
PRINCIPAL = f"trigger:{NAME}"


@pytest.fixture
def pipeline() -> Pipeline:
    pipeline = Pipeline()
    definition = parse_definition({**trip_definition(), "name": "trip", "version": 1})
    DefinitionRegistry(pipeline.store).publish("trip", 1, definition, owner=OWNER, now=0)
    return pipeline


def service(pipeline: Pipeline, overlap: str, **changes: Any) -> TriggerService:
    document: dict[str, Any] = {
        "name": NAME,
        "kind": "schedule",
        "definition": "trip",
        "input": {"traveller": "Scheduled", "route": "LHR-JFK", "amount": 100, "booked_for.$": "scheduled_time"},
        "overlap": overlap,
        "queue_url": QUEUE,
        "dead_letter_url": "queue/hourly-trip-dlq",
        **changes,
    }
    return TriggerService(
        TriggerConfig.model_validate(document), pipeline.scheduler, pipeline.bus, pipeline.triggers,
        principal=PRINCIPAL, clock=pipeline.clock, metrics=pipeline.count,
    )  # fmt: skip


def tick(trigger: TriggerService, minute: int) -> Any:
    """The tick ``minute`` minutes after the pipeline clock's start, handled now."""
    body = json.dumps({"scheduled_time": iso_utc(1_800_000_000 + 60 * minute)})
    return trigger.handle(occurrence_of(trigger.config, body))


def item(pipeline: Pipeline) -> TriggerState:
    return pipeline.triggers.state(NAME, consistent=True)


def test_skip_starts_no_tick_while_the_last_run_has_not_ended_and_the_next_one_once_it_has(
    pipeline: Pipeline,
) -> None:
    trigger = service(pipeline, "skip")
    first = tick(trigger, 0)
    assert first.created and item(pipeline).running == first.workflow_id
    assert pipeline.snapshot(first.workflow_id).workflow.trigger.slot is True
    busy = tick(trigger, 1)
    assert (busy.workflow_id, busy.created, busy.buffered) == (None, False, False)
    assert busy.skipped == f"{first.workflow_id} runs (skip)"
    assert item(pipeline).skipped == 1 and pipeline.metrics["TriggerTicksSkipped"] == 1
    assert len(pipeline.store.workflows) == 1
    # its end gives the slot back (in the scheduler's call whose write ended it), and nothing waits
    pipeline.settle(first.workflow_id)
    assert pipeline.snapshot(first.workflow_id).workflow.status is WorkflowStatus.COMPLETED
    assert item(pipeline).running is None and pipeline.bus.peek(QUEUE) == []
    later = tick(trigger, 2)
    assert later.created and item(pipeline).running == later.workflow_id


def test_buffer_one_keeps_one_tick_waiting_skips_the_rest_and_starts_it_when_the_run_ends(
    pipeline: Pipeline,
) -> None:
    trigger = service(pipeline, "buffer_one", catch_up_seconds=0)
    first = tick(trigger, 0)
    waiting = tick(trigger, 1)
    assert (waiting.created, waiting.buffered, waiting.skipped) == (False, True, f"waiting: {first.workflow_id} runs")
    skipped = tick(trigger, 2)
    assert (skipped.buffered, skipped.skipped) == (False, f"{first.workflow_id} runs (buffer_one)")
    assert (item(pipeline).buffered, item(pipeline).skipped) == (1, 1)
    assert pipeline.metrics["TriggerTicksBuffered"] == 1
    pipeline.settle(first.workflow_id)
    # the end sent the waiting tick to the trigger's queue; it starts there, however late (catch-up none)
    [message] = pipeline.bus.receive(QUEUE)
    pipeline.clock.advance(3_600)
    second = trigger.handle(occurrence_of(trigger.config, message.body))
    assert second.created
    workflow = pipeline.snapshot(second.workflow_id).workflow
    assert workflow.trigger.occurrence == f"tick {iso_utc(1_800_000_060)}"
    assert workflow.input["booked_for"] == iso_utc(1_800_000_060)
    state = item(pipeline)
    assert (state.running, state.waiting) == (second.workflow_id, None)
    # its message delivered again (SQS, or a resend) is the same occurrence: nothing new
    again = trigger.handle(occurrence_of(trigger.config, message.body))
    assert (again.workflow_id, again.created) == (second.workflow_id, False)
    assert len(pipeline.store.workflows) == 2


def test_two_ticks_that_read_the_slot_free_start_one_run_the_condition_decides(pipeline: Pipeline) -> None:
    trigger = service(pipeline, "skip")
    stale = TriggerState(NAME)  # what the later tick read before the first one's claim
    first = tick(trigger, 0)
    reads = iter([stale])
    real = pipeline.triggers.state
    pipeline.triggers.state = lambda name, consistent=False: next(reads, None) or real(name, consistent=consistent)  # type: ignore[method-assign]
    second = tick(trigger, 1)
    assert (second.created, second.skipped) == (False, f"{first.workflow_id} runs (skip)")
    assert len(pipeline.store.workflows) == 1


def test_a_run_that_ended_without_giving_the_slot_back_is_taken_over_by_the_next_tick(pipeline: Pipeline) -> None:
    trigger = service(pipeline, "skip")
    first = tick(trigger, 0)
    pipeline.settle(first.workflow_id)
    # as if the scheduler had crashed between the write that ended it and the give-back
    pipeline.triggers.claim(NAME, first.workflow_id, 0, expect=None, buffered=None)
    later = tick(trigger, 1)
    assert later.created and item(pipeline).running == later.workflow_id


def test_a_later_call_on_an_ended_run_gives_its_slot_back_again(pipeline: Pipeline) -> None:
    trigger = service(pipeline, "skip")
    first = tick(trigger, 0)
    pipeline.settle(first.workflow_id)
    pipeline.triggers.claim(NAME, first.workflow_id, 0, expect=None, buffered=None)
    # a message delivered again to the scheduler (its first delivery crashed after the ending write)
    assert pipeline.scheduler.on_overdue(first.workflow_id) == []
    assert item(pipeline).running is None


def test_a_holder_that_never_started_is_taken_over_after_the_starting_grace(pipeline: Pipeline) -> None:
    trigger = service(pipeline, "skip")
    now = int(pipeline.clock.now())
    # a start that took the slot, then failed for good (its message went to the dead-letter queue)
    pipeline.triggers.claim(NAME, "wf-never-started", now, expect=None, buffered=None)
    within = tick(trigger, 0)
    assert (within.created, within.skipped) == (False, "wf-never-started runs (skip)")
    pipeline.clock.advance(STARTING_GRACE_SECONDS)
    after = tick(trigger, 1)
    assert after.created and item(pipeline).running == after.workflow_id


def test_a_waiting_tick_whose_message_was_lost_is_sent_again_by_the_next_tick(pipeline: Pipeline) -> None:
    trigger = service(pipeline, "buffer_one")
    first = tick(trigger, 0)
    assert tick(trigger, 1).buffered
    pipeline.settle(first.workflow_id)
    pipeline.bus.receive(QUEUE)  # lost: the give-back's send never arrived
    assert (item(pipeline).running, item(pipeline).waiting is not None) == (None, True)
    next_tick = tick(trigger, 2)
    assert (next_tick.created, next_tick.buffered) == (False, False)  # the buffer is full: skipped
    [resent] = pipeline.bus.receive(QUEUE)
    waited = trigger.handle(occurrence_of(trigger.config, resent.body))
    assert waited.created
    assert pipeline.snapshot(waited.workflow_id).workflow.trigger.occurrence == f"tick {iso_utc(1_800_000_060)}"


def test_a_refused_start_gives_the_slot_back_and_a_run_now_obeys_the_policy(pipeline: Pipeline) -> None:
    refused = service(pipeline, "skip", input={})  # the first step reads a route the input does not have
    with pytest.raises(TriggerRefusedError) as error:
        tick(refused, 0)
    assert error.value.code == "INVALID_INPUT"
    assert item(pipeline).running is None and pipeline.store.workflows == {}
    trigger = service(pipeline, "skip")
    first = tick(trigger, 1)
    run_now = trigger.handle(occurrence_of(trigger.config, run_now_body("k", 1_800_000_100, "ops")))
    assert (run_now.created, run_now.skipped) == (False, f"{first.workflow_id} runs (skip)")


@pytest.mark.parametrize(
    ("status", "keeps"),
    [(WorkflowStatus.HELD, True), (WorkflowStatus.COMPENSATION_FAILED, True), (WorkflowStatus.CANCELLED, False)],
)
def test_a_run_waiting_for_a_person_keeps_the_slot_and_an_ended_one_does_not(
    pipeline: Pipeline, status: WorkflowStatus, keeps: bool
) -> None:
    trigger = service(pipeline, "skip")
    first = tick(trigger, 0)
    snapshot = pipeline.snapshot(first.workflow_id)
    # the run as it stands when a person must act, or once cancelled (only its status matters to the slot)
    pipeline.store.workflows[first.workflow_id] = replace(snapshot, workflow=replace(snapshot.workflow, status=status))
    assert tick(trigger, 1).created is not keeps
