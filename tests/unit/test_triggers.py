"""sasflow.triggers: one workflow per occurrence of a schedule's tick, owned by the trigger, named in its history;
an occurrence it cannot start goes to the trigger's dead-letter queue with its reason."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from devstack.events import envelope
from sasflow.adapters.memory import InMemoryTriggerStore
from sasflow.definition import parse_definition
from sasflow.errors import TenantLimitError
from sasflow.history import decode
from sasflow.registry import DefinitionRegistry
from sasflow.states import WorkflowStatus
from sasflow.triggers import (
    TriggerConfig,
    TriggerRefusedError,
    TriggerService,
    iso_utc,
    occurrence_of,
    run_now_body,
    trigger_input,
)
from tests.support.pipeline import OWNER, Pipeline, trip_definition

DEAD_LETTERS = "queue/every-minute-trip-dlq"
PRINCIPAL = "trigger:every-minute-trip"


def config(**changes: Any) -> TriggerConfig:
    document: dict[str, Any] = {
        "name": "every-minute-trip",
        "kind": "schedule",
        "definition": "trip",
        "input": {"traveller": "Scheduled", "route": "LHR-JFK", "amount": 100, "booked_for.$": "scheduled_time"},
        "dead_letter_url": DEAD_LETTERS,
    }
    return TriggerConfig.model_validate({**document, **changes})


def tick(at: str) -> str:
    return json.dumps({"scheduled_time": at})


@pytest.fixture
def pipeline() -> Pipeline:
    pipeline = Pipeline()
    pipeline.publish("trip")
    return pipeline


def service(pipeline: Pipeline, items: InMemoryTriggerStore | None = None, **changes: Any) -> TriggerService:
    return pipeline.trigger(config(**changes), PRINCIPAL, items or InMemoryTriggerStore())


def test_a_tick_starts_one_workflow_owned_by_the_trigger_whose_history_names_the_occurrence(
    pipeline: Pipeline,
) -> None:
    trigger = service(pipeline)
    outcome = trigger.handle(occurrence_of(trigger.config, tick("2026-12-06T09:00:00Z")))
    assert outcome.created
    snapshot = pipeline.snapshot(outcome.workflow_id)
    workflow = snapshot.workflow
    assert workflow.owner == PRINCIPAL
    assert (workflow.trigger.name, workflow.trigger.occurrence) == ("every-minute-trip", "tick 2026-12-06T09:00:00Z")
    assert workflow.input == {
        "traveller": "Scheduled",
        "route": "LHR-JFK",
        "amount": 100,
        "booked_for": "2026-12-06T09:00:00Z",
    }
    first = decode(snapshot.history, workflow.created_at, workflow.definition.order)[0]
    assert (first.kind, first.detail) == (
        "started",
        {"trigger": "every-minute-trip", "occurrence": "tick 2026-12-06T09:00:00Z"},
    )
    # its first step was sent, and the trip completes as any other
    assert [r.step for r in pipeline.requests("flights")] == ["reserve_flight"]
    pipeline.settle(outcome.workflow_id)
    assert pipeline.snapshot(outcome.workflow_id).workflow.status is WorkflowStatus.COMPLETED
    assert pipeline.metrics["TriggerWorkflowsStarted"] == 1


def test_the_same_tick_delivered_again_starts_nothing_new_and_another_tick_does(pipeline: Pipeline) -> None:
    trigger = service(pipeline)
    first = trigger.handle(occurrence_of(trigger.config, tick("2026-12-06T09:00:00Z")))
    # the same tick: redelivered by SQS, retried by EventBridge Scheduler, or written another way
    again = trigger.handle(occurrence_of(trigger.config, tick("2026-12-06T09:00:00Z")))
    same = trigger.handle(occurrence_of(trigger.config, tick("2026-12-06T10:00:00+01:00")))
    later = trigger.handle(occurrence_of(trigger.config, tick("2026-12-06T09:01:00Z")))
    assert (again.workflow_id, again.created) == (first.workflow_id, False)
    assert (same.workflow_id, same.created) == (first.workflow_id, False)
    assert later.created and later.workflow_id != first.workflow_id
    assert len(pipeline.store.workflows) == 2
    assert pipeline.metrics["TriggerWorkflowsStarted"] == 2
    assert len(pipeline.requests("flights")) == 2  # a repeat sends nothing


def test_a_crash_between_the_start_write_and_the_send_leaves_one_workflow_that_the_supervisor_completes(
    pipeline: Pipeline,
) -> None:
    trigger = service(pipeline)
    occurrence = occurrence_of(trigger.config, tick("2026-12-06T09:00:00Z"))
    # the first delivery writes the workflow and dies before its send (nothing acknowledged)
    lost = TriggerService(
        config(), pipeline.scheduler, _DeadBus(), InMemoryTriggerStore(), principal=PRINCIPAL, clock=pipeline.clock
    )
    with pytest.raises(ConnectionError):
        lost.handle(occurrence)
    # the redelivery finds it: no second workflow, no second send
    again = trigger.handle(occurrence)
    assert not again.created and len(pipeline.store.workflows) == 1
    assert pipeline.requests("flights") == []
    # the first step is PROCESSING with its complete-by: the supervisor resends it (Rule 1)
    pipeline.settle(again.workflow_id)
    assert pipeline.snapshot(again.workflow_id).workflow.status is WorkflowStatus.COMPLETED


class _DeadBus:
    def send(self, messages: Any) -> list[int]:
        raise ConnectionError("the function died before its send")


def test_a_trigger_and_a_client_with_the_same_key_get_different_workflows(pipeline: Pipeline) -> None:
    trigger = service(pipeline)
    occurrence = occurrence_of(trigger.config, tick("2026-12-06T09:00:00Z"))
    started = trigger.handle(occurrence)
    key = occurrence.idempotency_key("every-minute-trip")
    assert key.startswith("trigger:every-minute-trip:") and len(key) == len("trigger:every-minute-trip:") + 32
    client = pipeline.start(key=key)
    assert client != started.workflow_id


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("not json", "not JSON"),
        ("[1]", "not a JSON object"),
        ("{}", "names no scheduled_time"),
        ('{"scheduled_time": 7}', "must be an ISO-8601 time \\(text\\), not int"),
        ('{"scheduled_time": "yesterday"}', "is not an ISO-8601 time"),
    ],
)
def test_a_message_that_is_not_a_tick_is_refused_as_malformed(body: str, why: str) -> None:
    with pytest.raises(TriggerRefusedError, match=why) as refused:
        occurrence_of(config(), body)
    assert refused.value.code == "MALFORMED_OCCURRENCE"


def test_a_refused_occurrence_redriven_from_the_dead_letter_queue_is_the_same_occurrence() -> None:
    original = tick("2026-12-06T09:00:00Z")
    redriven = json.dumps({"refused": {"code": "DEFINITION_NOT_REGISTERED"}, "body": original})
    assert occurrence_of(config(), redriven) == occurrence_of(config(), original)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, {"trigger": "every-minute-trip", "scheduled_time": "2026-12-06T09:00:00Z", "at": 1796547600}),
        ({"day.$": "scheduled_time", "fixed": 1}, {"day": "2026-12-06T09:00:00Z", "fixed": 1}),
        ("{when: at, who: trigger}", {"when": 1796547600, "who": "every-minute-trip"}),
        ({"format.$": {"expression": "detail.format", "default": "pdf"}}, {"format": "pdf"}),  # docs/triggers.md
    ],
)
def test_the_input_renders_from_the_tick(template: Any, expected: dict[str, Any]) -> None:
    trigger = config(input=template)
    assert trigger_input(trigger, occurrence_of(trigger, tick("2026-12-06T09:00:00Z"))) == expected


@pytest.mark.parametrize(
    ("template", "why"),
    [
        ({"x.$": "nothing_here"}, "nothing_here"),
        ("at", "must be a JSON object, got a number"),
        ({"x.$": "length(at)"}, "triggers\\[every-minute-trip\\].input"),
    ],
)
def test_an_input_that_cannot_render_is_refused_as_invalid_input(template: Any, why: str) -> None:
    trigger = config(input=template)
    with pytest.raises(TriggerRefusedError, match=why) as refused:
        trigger_input(trigger, occurrence_of(trigger, tick("2026-12-06T09:00:00Z")))
    assert refused.value.code == "INVALID_INPUT"


def test_an_occurrence_the_definition_refuses_goes_to_the_dead_letter_queue_with_its_reason(
    pipeline: Pipeline,
) -> None:
    # no such definition; then an input without the route the first step reads
    for changes, code in (({"definition": "nowhere"}, "DEFINITION_NOT_REGISTERED"), ({"input": {}}, "INVALID_INPUT")):
        trigger = service(pipeline, **changes)
        body = tick("2026-12-06T09:00:00Z")
        with pytest.raises(TriggerRefusedError) as refused:
            trigger.handle(occurrence_of(trigger.config, body))
        assert refused.value.code == code
        trigger.refuse(body, refused.value, "message-1")
        [dead] = pipeline.bus.peek(DEAD_LETTERS)[-1:]
        record = json.loads(dead.body)
        assert record["refused"]["code"] == code and record["body"] == body
        assert record["refused"]["trigger"] == "every-minute-trip"
    reason = json.loads(pipeline.bus.peek(DEAD_LETTERS)[0].body)["refused"]["reason"]
    assert "(or sasflow definitions push FILE), then redrive" in reason
    assert reason.count("publish it") == 1  # found by a trial: the advice was given twice
    assert "input" in json.loads(pipeline.bus.peek(DEAD_LETTERS)[1].body)["refused"]["reason"]
    assert pipeline.store.workflows == {}  # nothing half-started
    assert pipeline.metrics["TriggerOccurrencesRefused"] == 2


def test_a_pinned_version_is_read_once_and_the_latest_again_after_a_minute(pipeline: Pipeline) -> None:
    latest = service(pipeline)
    latest.handle(occurrence_of(latest.config, tick("2026-12-06T09:00:00Z")))
    v2 = parse_definition({**trip_definition(), "name": "trip", "version": 2})
    DefinitionRegistry(pipeline.store).publish("trip", 2, v2, owner=OWNER, now=0)
    within = latest.handle(occurrence_of(latest.config, tick("2026-12-06T09:01:00Z")))
    pipeline.clock.advance(61)
    after = latest.handle(occurrence_of(latest.config, tick("2026-12-06T09:02:00Z")))
    pinned = service(pipeline, version=1).handle(occurrence_of(latest.config, tick("2026-12-06T09:03:00Z")))
    versions = [pipeline.snapshot(o.workflow_id).workflow.definition.version for o in (within, after, pinned)]
    assert versions == [1, 2, 1]


def test_a_configuration_that_is_not_one_is_a_configuration_error() -> None:
    from sasflow.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="TRIGGER is not a trigger configuration"):
        TriggerConfig.from_env('{"name": "Bad Name", "kind": "schedule"}')


def test_a_paused_trigger_skips_and_counts_its_ticks_and_a_run_now_starts_all_the_same(pipeline: Pipeline) -> None:
    items = InMemoryTriggerStore()
    trigger = service(pipeline, items)
    items.pause("every-minute-trip", "arn:aws:sts::123456789012:assumed-role/oncall/ada", "flights migration", 100)
    skipped = trigger.handle(occurrence_of(trigger.config, tick("2026-12-06T09:00:00Z")))
    assert (skipped.workflow_id, skipped.created) == (None, False)
    assert skipped.skipped == "paused by arn:aws:sts::123456789012:assumed-role/oncall/ada: flights migration"
    assert items.state("every-minute-trip").skipped == 1 and pipeline.store.workflows == {}
    assert pipeline.metrics["TriggerTicksSkipped"] == 1
    # an operator's run-now starts while paused; the same request again starts nothing new
    body = run_now_body("key-1", 1796547630, "arn:aws:sts::123456789012:assumed-role/oncall/ada")
    ran = trigger.handle(occurrence_of(trigger.config, body))
    again = trigger.handle(occurrence_of(trigger.config, body))
    assert ran.created and (again.workflow_id, again.created) == (ran.workflow_id, False)
    workflow = pipeline.snapshot(ran.workflow_id).workflow
    assert workflow.trigger.occurrence == "run-now key-1 by arn:aws:sts::123456789012:assumed-role/oncall/ada"
    assert workflow.input["booked_for"] == "2026-12-06T09:00:30Z"  # the tick of its time, as if it had come
    # resumed: ticks start again
    items.resume("every-minute-trip")
    assert trigger.handle(occurrence_of(trigger.config, tick("2026-12-06T09:01:00Z"))).created
    assert items.state("every-minute-trip").paused is False


@pytest.mark.parametrize(
    "request_",
    [{}, {"key": "", "at": 1, "by": "x"}, {"key": "k", "at": -1, "by": "x"}, {"key": "k", "at": 1}, "now"],
)
def test_a_run_now_without_its_key_time_and_principal_is_refused_as_malformed(request_: Any) -> None:
    with pytest.raises(TriggerRefusedError, match="run-now names no key") as refused:
        occurrence_of(config(), json.dumps({"run_now": request_}))
    assert refused.value.code == "MALFORMED_OCCURRENCE"


@pytest.mark.parametrize(
    ("window", "late", "starts"),
    [
        (None, 86_400, True),  # all: however late
        (0, 60, True),  # none: a minute late is still on time (delivery through SQS)
        (0, 61, False),
        (900, 900, True),
        (900, 901, False),
    ],
)
def test_a_tick_handled_later_than_its_catch_up_window_is_missed_and_counted(
    pipeline: Pipeline, window: int | None, late: int, starts: bool
) -> None:
    items = InMemoryTriggerStore()
    trigger = service(pipeline, items, catch_up_seconds=window)
    occurrence = occurrence_of(trigger.config, tick(iso_utc(int(pipeline.clock.now()))))
    pipeline.clock.advance(late)
    outcome = trigger.handle(occurrence)
    assert outcome.created is starts
    assert items.state("every-minute-trip").missed == (0 if starts else 1)
    if not starts:
        assert outcome.skipped == f"missed: handled {late} s after its tick"
        assert pipeline.metrics["TriggerTicksMissed"] == 1
    # a run-now is never late: it is the operator's request, now
    run_now = occurrence_of(trigger.config, run_now_body("k", occurrence.at, "ops"))
    assert trigger.handle(run_now).created


def event_body(event_id: str = "6a7e8feb-b491-4cf7-a9f1-bf3703467718", **detail: Any) -> str:
    """An event as an EventBridge rule delivers it to the trigger's queue."""
    event_detail = {"traveller": "Ada", "route": "CDG-NRT", "amount": 240, **detail}
    when = datetime(2027, 1, 15, 8, 0, 5, tzinfo=UTC)
    return json.dumps(
        envelope("sasflow.demo", "TripRequested", event_detail, region="us-east-1", event_id=event_id, time=when)
    )


def event_trigger(pipeline: Pipeline) -> TriggerService:
    return service(
        pipeline,
        kind="event",
        input={"traveller.$": "detail.traveller", "route.$": "detail.route", "amount.$": "detail.amount"},
    )


def test_an_event_starts_one_workflow_named_by_its_id_however_often_it_is_delivered(pipeline: Pipeline) -> None:
    trigger = event_trigger(pipeline)
    first = trigger.handle(occurrence_of(trigger.config, event_body()))
    # EventBridge delivers at least once: the same event (its id) again, even with another body, is the same one
    again = trigger.handle(occurrence_of(trigger.config, event_body()))
    other = trigger.handle(occurrence_of(trigger.config, event_body("e-2")))
    assert first.created and (again.workflow_id, again.created) == (first.workflow_id, False)
    assert other.created and other.workflow_id != first.workflow_id
    workflow = pipeline.snapshot(first.workflow_id).workflow
    assert (workflow.owner, workflow.trigger.occurrence) == (PRINCIPAL, "event 6a7e8feb-b491-4cf7-a9f1-bf3703467718")
    assert workflow.input == {"traveller": "Ada", "route": "CDG-NRT", "amount": 240}
    # an event is never late: a catch-up window is a schedule's
    pipeline.clock.advance(30 * 86_400)
    assert trigger.handle(occurrence_of(trigger.config, event_body("e-3"))).created


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ('{"id": "e-1", "time": "2027-01-15T08:00:05Z"}', "needs an id \\(text\\) and a detail"),
        ('{"detail": {}, "time": "2027-01-15T08:00:05Z"}', "needs an id \\(text\\) and a detail"),
        ('{"id": "e-1", "detail": {}}', "names no time"),
        ('{"id": "e-1", "detail": {}, "time": "yesterday"}', "is not an ISO-8601 time"),
        ('{"scheduled_time": "2027-01-15T08:00:00Z"}', "needs an id \\(text\\) and a detail"),
    ],
)
def test_a_message_that_is_not_an_event_is_refused_as_malformed_by_an_event_trigger(body: str, why: str) -> None:
    with pytest.raises(TriggerRefusedError, match=why) as refused:
        occurrence_of(config(kind="event"), body)
    assert refused.value.code == "MALFORMED_OCCURRENCE"


def test_overlap_and_catch_up_are_a_schedules_not_an_event_triggers() -> None:
    from pydantic import ValidationError

    for changes in ({"overlap": "skip"}, {"catch_up_seconds": 60}):
        with pytest.raises(ValidationError, match="a schedule's"):
            config(kind="event", **changes)


def test_a_refused_event_names_the_sender_as_the_fix_once_and_a_copy_of_a_started_one_is_not_refused(
    pipeline: Pipeline,
) -> None:
    trigger = event_trigger(pipeline)
    without_route = json.loads(event_body("e-5"))
    del without_route["detail"]["route"]
    with pytest.raises(TriggerRefusedError) as refused:
        trigger.handle(occurrence_of(trigger.config, json.dumps(without_route)))
    message = str(refused.value)
    assert message.count("triggers[every-minute-trip].input") == 1  # found by the trial: the place said twice
    assert "put a corrected event on the bus (a new id)" in message
    with pytest.raises(TriggerRefusedError, match="its rule delivers the event as it was put on the bus"):
        occurrence_of(trigger.config, '{"id": 5, "detail": {}}')
    # the same event id put again by hand with a detail the input cannot read: its workflow exists, nothing refused
    started = trigger.handle(occurrence_of(trigger.config, event_body("e-6")))
    again = json.loads(event_body("e-6"))
    del again["detail"]["route"]
    outcome = trigger.handle(occurrence_of(trigger.config, json.dumps(again)))
    assert (outcome.workflow_id, outcome.created) == (started.workflow_id, False)


class _CountingItems(InMemoryTriggerStore):
    """The triggers' items, counting the reads of the pause."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[bool] = []

    def state(self, name: str, *, consistent: bool = False) -> Any:
        self.reads.append(consistent)
        return super().state(name, consistent=consistent)


def test_a_batch_reads_the_pause_once_and_sends_its_workflows_first_requests_together(pipeline: Pipeline) -> None:
    items = _CountingItems()
    reads = {"traveller.$": "detail.traveller", "route.$": "detail.route", "amount.$": "detail.amount"}
    trigger = service(pipeline, items, kind="event", input=reads)
    outbox: list[Any] = []
    with trigger.batch():
        for index in range(4):
            assert trigger.handle(occurrence_of(trigger.config, event_body(f"e-{index}")), outbox).created
    # one eventually consistent read of the item for the batch, not one an occurrence
    assert items.reads == [False]
    # the first requests wait for the batch's end, then go together (one SendMessageBatch for up to ten)
    assert len(outbox) == 4 and pipeline.requests("flights") == []
    sent = pipeline.bus.sent
    trigger.send_outbox(outbox)
    assert pipeline.bus.sent - sent == 4 and len(pipeline.requests("flights")) == 4
    # the next batch reads the pause again: one that landed since is seen
    items.pause("every-minute-trip", "ada", "migration", 100)
    with trigger.batch():
        skipped = trigger.handle(occurrence_of(trigger.config, event_body("e-9")), outbox)
    assert skipped.skipped is not None and skipped.skipped.startswith("paused by ada")
    assert items.reads == [False, False]
    # outside a batch (a test, a caller of its own), every occurrence reads it
    trigger.handle(occurrence_of(trigger.config, event_body("e-10")))
    trigger.handle(occurrence_of(trigger.config, event_body("e-11")))
    assert items.reads == [False, False, False, False]


def test_a_trigger_with_a_slot_reads_its_item_strongly_for_every_occurrence_even_in_a_batch(pipeline: Pipeline) -> None:
    items = _CountingItems()
    trigger = service(pipeline, items, overlap="skip")
    with trigger.batch():
        trigger.handle(occurrence_of(trigger.config, tick("2026-12-06T09:00:00Z")))
        trigger.handle(occurrence_of(trigger.config, tick("2026-12-06T09:01:00Z")))
    assert items.reads[:2] == [True, True] and False not in items.reads


def test_a_tick_over_its_tenants_limit_starts_nothing_gives_its_slot_back_and_starts_when_delivered_later() -> None:
    # Given a definition allowing 1 running trip per customer, and acme's trip started through the API
    p = Pipeline()
    limited = {**trip_definition(), "name": "trip", "version": 1}
    limited["tenancy"] = {"max_running": 1, "tenant_key": "customer"}
    DefinitionRegistry(p.store).publish("trip", 1, parse_definition(limited), owner=OWNER, now=0)
    acme = {"traveller": "Scheduled", "route": "LHR-JFK", "amount": 100, "customer": "acme"}
    by_api = p.start(limited, acme)
    items = InMemoryTriggerStore()
    trigger = service(p, items, overlap="skip", input={**acme, "booked_for.$": "scheduled_time"})

    # When a tick for acme comes while that trip runs
    occurrence = occurrence_of(trigger.config, tick("2026-12-06T09:00:00Z"))
    with pytest.raises(TenantLimitError, match="tenant key#acme"):
        trigger.handle(occurrence)

    # Then it wrote no workflow, and the trigger's slot it took is free again (its queue delivers it again later)
    assert set(p.store.workflows) == {by_api}
    assert items.state("every-minute-trip").running is None
    # When acme's trip ends and the tick is delivered again
    p.settle(by_api)
    again = trigger.handle(occurrence)
    # Then it starts its workflow, which holds both slots
    assert again.created
    assert items.state("every-minute-trip").running == again.workflow_id
    assert set(p.tenancy.slots("trip", "key#acme").holders) == {again.workflow_id}
