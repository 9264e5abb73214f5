"""A trigger's overlap policy: ``skip`` starts no tick while its last run has not ended, ``buffer_one`` keeps one
waiting and starts it when that run ends; the slot moves by conditional writes only, and a crash anywhere leaves
nothing held for ever."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from sasflow.states import WorkflowStatus
from sasflow.triggers import (
    CLAIM_SETTLED_SECONDS,
    STARTING_GRACE_SECONDS,
    TriggerConfig,
    TriggerRefusedError,
    TriggerService,
    TriggerState,
    iso_utc,
    occurrence_of,
    run_now_body,
)
from tests.support.pipeline import Pipeline

NAME = "hourly-trip"
QUEUE = "queue/hourly-trip"
PRINCIPAL = f"trigger:{NAME}"


@pytest.fixture
def pipeline() -> Pipeline:
    pipeline = Pipeline()
    pipeline.publish("trip")
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
    return pipeline.trigger(TriggerConfig.model_validate(document), PRINCIPAL)


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


def test_a_tick_that_took_the_slot_and_crashed_is_started_by_its_next_delivery_however_late(
    pipeline: Pipeline,
) -> None:
    """Found by the simulation (seed 50): a delivery of a tick took the slot and crashed before its start; the next
    delivery of that tick came past the catch-up window and was counted missed, so the start never came, and the tick
    kept waiting behind the slot waited until a later tick, past the starting grace, took it over (none came). The
    claim decided the start: its next delivery completes it, however late, and the waiting tick follows its end."""
    trigger = service(pipeline, "buffer_one", catch_up_seconds=300)
    body = json.dumps({"scheduled_time": iso_utc(1_800_000_000)})
    crashed = occurrence_of(trigger.config, body)
    holder = pipeline.scheduler.workflow_id(PRINCIPAL, crashed.idempotency_key(NAME))
    pipeline.triggers.claim(NAME, holder, int(pipeline.clock.now()), expect=None, buffered=None)  # then it crashed
    assert tick(trigger, 1).buffered  # the next tick waits behind it
    # When the crashed tick is delivered again, too late to start a tick of its own
    pipeline.clock.advance(600)
    late = trigger.handle(occurrence_of(trigger.config, body))
    # Then it starts the run its claim decided, which holds the slot
    assert (late.created, late.workflow_id, item(pipeline).running) == (True, holder, holder)
    # and when that run ends, the waiting tick is sent and starts
    pipeline.settle(holder)
    [waiting] = pipeline.bus.receive(QUEUE)
    started = trigger.handle(occurrence_of(trigger.config, waiting.body))
    assert started.created and item(pipeline).running == started.workflow_id
    assert pipeline.snapshot(started.workflow_id).workflow.trigger.occurrence == f"tick {iso_utc(1_800_000_060)}"


def test_a_late_tick_that_took_no_slot_is_missed_and_a_paused_one_skipped(pipeline: Pipeline) -> None:
    trigger = service(pipeline, "buffer_one", catch_up_seconds=300)
    pipeline.clock.advance(600)
    late = tick(trigger, 0)
    assert (late.created, late.skipped) == (False, "missed: handled 600 s after its tick")
    pipeline.triggers.pause(NAME, principal="ops", reason="maintenance", now=int(pipeline.clock.now()))
    paused = tick(trigger, 8)
    assert paused.skipped is not None and paused.skipped.startswith("paused by ops")
    assert item(pipeline).running is None


def test_a_tick_delivered_again_while_paused_finds_the_run_it_started_which_keeps_the_slot(pipeline: Pipeline) -> None:
    """Found by the simulation (seed 22): a tick's run started and holds the slot; the trigger is paused; the same tick
    delivered again (a duplicate, or a redelivery after a crash past the start) a minute later took itself for a
    claim whose start crashed and gave the slot back, and a run-now then started a second run beside the first."""
    trigger = service(pipeline, "skip")
    first = tick(trigger, 0)
    assert first.created and item(pipeline).running == first.workflow_id
    pipeline.triggers.pause(NAME, principal="ops", reason="maintenance", now=int(pipeline.clock.now()))
    pipeline.clock.advance(CLAIM_SETTLED_SECONDS + 1)
    again = tick(trigger, 0)
    assert (again.workflow_id, again.created, again.skipped) == (first.workflow_id, False, None)
    assert item(pipeline).running == first.workflow_id
    assert item(pipeline).skipped == 0  # a repeat is no skipped tick
    run_now = trigger.handle(occurrence_of(trigger.config, run_now_body("again", 1_800_000_100, "ops")))
    assert (run_now.created, run_now.skipped) == (False, f"{first.workflow_id} runs (skip)")


def test_a_delivery_that_took_an_ended_runs_slot_again_and_crashed_leaves_it_to_the_next_delivery_while_paused(
    pipeline: Pipeline,
) -> None:
    """Found by the simulation (seed 46): a tick's run started and ended at once, giving the slot back; a duplicate
    delivery of the tick took the slot again for that run and crashed before its start found the run ended; the
    next delivery came while the trigger was paused, found the run, and returned, leaving the slot held by a run
    that had ended: no later tick could start."""
    trigger = service(pipeline, "skip")
    first = tick(trigger, 0)
    pipeline.settle(first.workflow_id)
    assert item(pipeline).running is None  # its end gave the slot back
    # the duplicate's claim, then its crash (nothing else of it happened)
    pipeline.triggers.claim(NAME, first.workflow_id, int(pipeline.clock.now()), expect=None, buffered=None)
    pipeline.triggers.pause(NAME, principal="ops", reason="maintenance", now=int(pipeline.clock.now()))
    again = tick(trigger, 0)
    assert (again.workflow_id, again.created) == (first.workflow_id, False)
    assert item(pipeline).running is None
    pipeline.triggers.resume(NAME)
    assert tick(trigger, 2).created  # the next tick starts


def test_a_tick_that_took_the_slot_and_crashed_then_met_a_pause_gives_the_slot_back_once_its_claim_settled(
    pipeline: Pipeline,
) -> None:
    """Found by the simulation (seed 50, again): the crashed tick's next delivery found the trigger paused; skipped,
    it left the slot held by a run that never comes. A pause starts nothing, so it gives the slot back instead, once
    no invocation can still be starting that run (its claim is older than the trigger function's timeout)."""
    trigger = service(pipeline, "buffer_one")
    body = json.dumps({"scheduled_time": iso_utc(1_800_000_000)})
    holder = pipeline.scheduler.workflow_id(PRINCIPAL, occurrence_of(trigger.config, body).idempotency_key(NAME))
    pipeline.triggers.claim(NAME, holder, int(pipeline.clock.now()), expect=None, buffered=None)
    assert tick(trigger, 1).buffered
    pipeline.triggers.pause(NAME, principal="ops", reason="maintenance", now=int(pipeline.clock.now()))
    # Within the claim's settling time, another delivery may still be starting it: the slot stays
    assert trigger.handle(occurrence_of(trigger.config, body)).skipped.startswith("paused by ops")
    assert item(pipeline).running == holder
    pipeline.clock.advance(CLAIM_SETTLED_SECONDS + 1)
    skipped = trigger.handle(occurrence_of(trigger.config, body))
    assert (skipped.created, skipped.skipped.startswith("paused by ops")) == (False, True)
    assert item(pipeline).running is None
    [waiting] = pipeline.bus.receive(QUEUE)  # the tick waiting behind it is sent (it starts once resumed or not:
    assert json.loads(waiting.body)["buffered"]["identity"] == f"tick {iso_utc(1_800_000_060)}"  # it came before)
