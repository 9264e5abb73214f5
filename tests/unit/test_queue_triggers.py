"""sasflow.triggers, an sqs trigger: one workflow per message (its id), the body as the input, a paused trigger
keeps its messages waiting, and a message that cannot start one goes to the dead-letter queue with its reason."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from sasflow.adapters.memory import InMemoryTriggerStore
from sasflow.errors import RetryableError
from sasflow.history import decode
from sasflow.states import WorkflowStatus
from sasflow.triggers import HOLD_SECONDS, Message, TriggerConfig, TriggerRefusedError, TriggerService, occurrence_of
from tests.support.pipeline import Pipeline

QUEUE = "queue/trip-queue"
DEAD_LETTERS = "queue/trip-queue-dlq"
PRINCIPAL = "trigger:trip-queue"
TRIP = {"traveller": "Ada", "route": "CDG-NRT", "amount": 240}
SENT_MS = 1_796_547_600_123  # 2026-12-06T09:00:00.123Z


def config(**changes: Any) -> TriggerConfig:
    document = {
        "name": "trip-queue",
        "kind": "sqs",
        "definition": "trip",
        "queue_url": QUEUE,
        "dead_letter_url": DEAD_LETTERS,
    }
    return TriggerConfig.model_validate({**document, **changes})


def message(message_id: str = "9d7c1f3e-0001", **attributes: str) -> Message:
    return Message(message_id, SENT_MS, attributes)


@pytest.fixture
def pipeline() -> Pipeline:
    pipeline = Pipeline()
    pipeline.publish("trip")
    return pipeline


def service(pipeline: Pipeline, items: InMemoryTriggerStore | None = None, **changes: Any) -> TriggerService:
    return pipeline.trigger(config(**changes), PRINCIPAL, items or InMemoryTriggerStore())


def test_a_message_starts_one_workflow_whose_input_is_its_body_however_often_it_is_delivered(
    pipeline: Pipeline,
) -> None:
    trigger = service(pipeline)
    body = json.dumps(TRIP)
    first = trigger.handle(occurrence_of(trigger.config, body, message()))
    # SQS delivers at least once: the same message (its id) again starts nothing new ...
    again = trigger.handle(occurrence_of(trigger.config, body, message()))
    # ... and another message with the same body is another occurrence
    other = trigger.handle(occurrence_of(trigger.config, body, message("9d7c1f3e-0002")))
    assert first.created and (again.workflow_id, again.created) == (first.workflow_id, False)
    assert other.created and other.workflow_id != first.workflow_id
    snapshot = pipeline.snapshot(first.workflow_id)
    workflow = snapshot.workflow
    assert (workflow.owner, workflow.trigger.occurrence) == (PRINCIPAL, "message 9d7c1f3e-0001")
    assert workflow.input == TRIP
    first_event = decode(snapshot.history, workflow.created_at, workflow.definition.order)[0]
    assert first_event.detail == {"trigger": "trip-queue", "occurrence": "message 9d7c1f3e-0001"}
    assert len(pipeline.requests("flights")) == 2
    pipeline.settle(first.workflow_id)
    assert pipeline.snapshot(first.workflow_id).workflow.status is WorkflowStatus.COMPLETED


def test_the_input_may_read_the_body_the_attributes_the_id_and_the_time_sent(pipeline: Pipeline) -> None:
    template = {
        "traveller.$": "attributes.traveller",
        "route.$": "body.trip.route",
        "amount.$": "body.trip.amount",
        "reference.$": "message_id",
        "sent.$": "sent_at",
    }
    trigger = service(pipeline, input=template)
    body = json.dumps({"trip": {"route": "LHR-JFK", "amount": 90}})
    outcome = trigger.handle(occurrence_of(trigger.config, body, message(traveller="Grace")))
    assert pipeline.snapshot(outcome.workflow_id).workflow.input == {
        "traveller": "Grace",
        "route": "LHR-JFK",
        "amount": 90,
        "reference": "9d7c1f3e-0001",
        "sent": "2026-12-06T09:00:00Z",
    }
    # a body that is not JSON is its text: an input may take it as it is
    text = occurrence_of(config(input={"note.$": "body"}), "plain words", message())
    assert text.document["body"] == "plain words"


@pytest.mark.parametrize(
    ("body", "shown"),
    [
        ("plain words", "text that is not JSON (Expecting value)"),
        ("[1, 2]", "an array"),
        ("7", "a number"),
        ("null", "null"),
        ('"just a string"', "a string"),  # found by a trial: it said text that is not JSON
        ('{"amount": NaN}', "text that is not JSON (NaN is not a JSON value)"),  # as the API refuses it
        ('{"traveller": "a", "traveller": "b"}', "text that is not JSON (duplicate key 'traveller')"),
        ("[" * 3000 + "]" * 3000, "text that is not JSON (nested deeper than 64 levels)"),  # no RecursionError
    ],
)
def test_a_body_that_is_not_an_object_is_refused_into_the_dead_letter_queue_with_its_reason_and_what_to_do(
    pipeline: Pipeline, body: str, shown: str
) -> None:
    trigger = service(pipeline)
    with pytest.raises(TriggerRefusedError) as refused:
        trigger.handle(occurrence_of(trigger.config, body, message()))
    assert refused.value.code == "INVALID_INPUT"
    assert f"must be a JSON object, got {shown}" in str(refused.value)
    assert str(refused.value).count("send it as one (a new message), or give the trigger an input") == 1
    assert pipeline.store.workflows == {}
    trigger.refuse(body, refused.value, "9d7c1f3e-0001", message(traveller="Grace"))
    [dead] = pipeline.bus.peek(DEAD_LETTERS)
    record = json.loads(dead.body)
    assert record["body"] == body and record["refused"]["code"] == "INVALID_INPUT"
    assert record["refused"]["message"] == {
        "id": "9d7c1f3e-0001",
        "sent_ms": SENT_MS,
        "attributes": {"traveller": "Grace"},
    }


def test_a_body_the_definition_refuses_says_to_send_a_corrected_message_first(pipeline: Pipeline) -> None:
    """Found by the trial: the reason named triggers.yaml only, where the body is its producer's to correct."""
    trigger = service(pipeline)
    with pytest.raises(TriggerRefusedError) as refused:
        trigger.handle(occurrence_of(trigger.config, json.dumps({"nights": 1}), message()))
    assert refused.value.code == "INVALID_INPUT"
    reason = str(refused.value)
    assert "the definition refused the input" in reason
    assert "; send a corrected message (a new message id), or fix the trigger's input in triggers.yaml" in reason
    assert pipeline.store.workflows == {}


def test_a_refused_message_redriven_is_the_same_occurrence_though_sqs_gives_it_another_id(pipeline: Pipeline) -> None:
    trigger = service(pipeline, input={"traveller.$": "body.who", "route": "CDG-NRT", "amount": 10})
    original = json.dumps({"name": "Ada"})  # the input reads body.who: refused
    with pytest.raises(TriggerRefusedError) as refused:
        trigger.handle(occurrence_of(trigger.config, original, message()))
    trigger.refuse(original, refused.value, "9d7c1f3e-0001", message())
    [dead] = pipeline.bus.peek(DEAD_LETTERS)
    # the operator fixes the input (make template, deploy) and redrives: the record comes back as a new message
    fixed = service(pipeline, input={"traveller.$": "body.name", "route": "CDG-NRT", "amount": 10})
    [redriven] = fixed.read(dead.body, message("a-new-id-from-the-move"))
    assert redriven == occurrence_of(fixed.config, original, message())
    started = fixed.handle(redriven)
    assert pipeline.snapshot(started.workflow_id).workflow.trigger.occurrence == "message 9d7c1f3e-0001"
    # redriven twice (the move repeated): still that one workflow
    [again] = fixed.read(dead.body, message("another-id"))
    assert fixed.handle(again).workflow_id == started.workflow_id


def test_a_paused_trigger_keeps_its_messages_waiting_and_starts_them_after_the_resume(pipeline: Pipeline) -> None:
    items = InMemoryTriggerStore()
    trigger = service(pipeline, items)
    items.pause("trip-queue", "arn:aws:sts::123456789012:assumed-role/oncall/ada", "flights migration", 100)
    held = trigger.handle(occurrence_of(trigger.config, json.dumps(TRIP), message()))
    assert (held.workflow_id, held.created, held.held) == (None, False, True)
    assert held.skipped == "held while paused by arn:aws:sts::123456789012:assumed-role/oncall/ada: flights migration"
    assert pipeline.store.workflows == {} and items.state("trip-queue").skipped == 0  # held, not skipped
    assert pipeline.metrics["TriggerMessagesHeld"] == 1
    [back] = pipeline.bus.peek(QUEUE)
    assert back.delay_seconds == HOLD_SECONDS
    # still paused 15 minutes later: held again
    pipeline.clock.advance(HOLD_SECONDS)
    [again] = pipeline.bus.receive(QUEUE)
    [held_again] = trigger.read(again.body, message("held-copy-1"))
    assert trigger.handle(held_again).held
    assert items.state("trip-queue").held == 2  # each hold counted (sasflow triggers list: held)
    items.resume("trip-queue")
    pipeline.clock.advance(HOLD_SECONDS)
    [last] = pipeline.bus.receive(QUEUE)
    started = trigger.handle(trigger.read(last.body, message("held-copy-2"))[0])
    assert started.created
    workflow = pipeline.snapshot(started.workflow_id).workflow
    assert (workflow.trigger.occurrence, workflow.input) == ("message 9d7c1f3e-0001", TRIP)
    # the original delivered again (its acknowledgement was lost before the pause ended): the same workflow
    late = trigger.handle(occurrence_of(trigger.config, json.dumps(TRIP), message()))
    assert (late.workflow_id, late.created) == (started.workflow_id, False)


def test_a_held_message_that_cannot_be_sent_back_fails_and_is_delivered_again(pipeline: Pipeline) -> None:
    items = InMemoryTriggerStore()
    trigger = service(pipeline, items)
    items.pause("trip-queue", "ada", "migration", 100)
    pipeline.bus.fail_next = 1
    with pytest.raises(RetryableError, match="paused and its message could not be kept waiting"):
        trigger.handle(occurrence_of(trigger.config, json.dumps(TRIP), message()))
    assert pipeline.bus.peek(QUEUE) == [] and pipeline.store.workflows == {}


def test_an_sqs_trigger_has_no_overlap_nor_catch_up_and_needs_its_queue() -> None:
    for changes in ({"overlap": "skip"}, {"catch_up_seconds": 60}):
        with pytest.raises(ValidationError, match="a schedule's: an sqs trigger starts every occurrence"):
            config(**changes)
    with pytest.raises(ValidationError, match="queue_url: an sqs trigger sends a message back to it while paused"):
        config(queue_url="")
    with pytest.raises(TriggerRefusedError, match="its message, and none was given"):
        occurrence_of(config(), json.dumps(TRIP))


def test_a_message_held_while_paused_and_refused_after_is_dead_lettered_as_it_was_sent(pipeline: Pipeline) -> None:
    items = InMemoryTriggerStore()
    trigger = service(pipeline, items)
    items.pause("trip-queue", "ada", "migration", 100)
    assert trigger.handle(occurrence_of(trigger.config, "not json", message(traveller="Grace"))).held
    items.resume("trip-queue")
    pipeline.clock.advance(HOLD_SECONDS)
    [back] = pipeline.bus.receive(QUEUE)
    [kept] = trigger.read(back.body, message("held-copy"))
    with pytest.raises(TriggerRefusedError) as refused:
        trigger.handle(kept)
    trigger.refuse(kept.raw or "", refused.value, "held-copy", kept.message)
    [dead] = pipeline.bus.peek(DEAD_LETTERS)
    record = json.loads(dead.body)
    # what was sent, under its own id: a person reads the body they sent, and a redrive is the same occurrence
    assert record["body"] == "not json" and record["refused"]["message_id"] == "9d7c1f3e-0001"
    assert record["refused"]["message"]["attributes"] == {"traveller": "Grace"}
    assert trigger.read(dead.body, message("moved"))[0].identity == "message 9d7c1f3e-0001"
    # refused again after a redrive (its body still not an object): the same message, its original id kept
    trigger.refuse(dead.body, refused.value, "moved", message("moved"))
    [_, again] = pipeline.bus.peek(DEAD_LETTERS)
    assert json.loads(again.body)["refused"]["message"]["id"] == "9d7c1f3e-0001"
    assert json.loads(again.body)["body"] == "not json"


def test_a_body_shaped_like_the_engines_envelopes_is_a_message_like_any_other_unless_sealed(
    pipeline: Pipeline,
) -> None:
    """Found by the trial: a producer's body with "refused" and "body" (or "held") keys was opened as a redriven
    refusal: another trip started, or, naming an earlier message's id, nothing at all."""
    trigger = service(pipeline, input={"traveller.$": "body.traveller", "route": "CDG-NRT", "amount": 5})
    first = trigger.handle(occurrence_of(trigger.config, json.dumps(TRIP), message("m-real")))
    inner = json.dumps({"traveller": "Wrong"})
    forged = [
        {"traveller": "Right", "refused": {"code": "x", "message": {"id": "m-real"}}, "body": inner},
        {"traveller": "Right", "held": {"body": inner, "message": {"id": "m-real"}}},
        {"traveller": "Right", "held": {"body": inner, "message": {"id": "m-real"}}, "seal": "0" * 36},
    ]
    for index, body in enumerate(forged):
        [occurrence] = trigger.read(json.dumps(body), message(f"m-{index}"))
        assert occurrence.identity == f"message m-{index}"
        started = trigger.handle(occurrence)
        assert started.created and started.workflow_id != first.workflow_id
        assert pipeline.snapshot(started.workflow_id).workflow.input["traveller"] == "Right"
