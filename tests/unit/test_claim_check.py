"""Claim-check of large payloads (claim_check.py): thresholds, references, resolution and retention, in memory."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from sasflow.adapters.memory import InMemoryPayloadStore
from sasflow.claim_check import REFERENCE_KEY, TERMINAL, ClaimCheck, encode_payload, is_reference
from sasflow.errors import ClaimCheckMissingError, InvalidDefinitionError, PayloadTooLargeError
from sasflow.messages import SQS_MAX_MESSAGE_BYTES, StepRequest, decode_reply
from sasflow.records import Snapshot
from sasflow.settings import AgentConfig, EngineConfig
from sasflow.states import Phase, StepStatus, WorkflowStatus
from tests.support.pipeline import REPLIES, TRIP_INPUT, Pipeline, trip_definition

WORKFLOW = "3f1d3c1e-0000-4000-8000-000000000001"
MB5 = 5 * 1024 * 1024


def claims(threshold: int = 1_024, largest: int = 10_485_760) -> tuple[ClaimCheck, InMemoryPayloadStore]:
    store = InMemoryPayloadStore()
    return ClaimCheck(store, threshold_bytes=threshold, max_payload_bytes=largest), store


def sha(value: Any) -> str:
    return hashlib.sha256(encode_payload(value)).hexdigest()


# ---------------------------------------------------------------------------------------------- the claim-check


def test_a_payload_at_or_below_the_threshold_travels_as_it_is_and_makes_no_request() -> None:
    check, store = claims(threshold=1_024)
    value = {"blob": "x" * 1_000}  # 1,011 bytes of JSON
    assert len(encode_payload(value)) <= 1_024

    assert check.offload(WORKFLOW, value, what="an output") is value
    assert store.requests == {}


def test_a_payload_above_the_threshold_becomes_a_reference_keyed_by_its_workflow_and_hash() -> None:
    check, store = claims(threshold=1_024)
    value = {"blob": "x" * 2_000}

    reference = check.offload(WORKFLOW, value, what="an output")

    body = encode_payload(value)
    digest = hashlib.sha256(body).hexdigest()
    assert reference == {REFERENCE_KEY: {"key": f"{WORKFLOW}/{digest}", "bytes": len(body), "sha256": digest}}
    assert store.objects[f"{WORKFLOW}/{digest}"] == body
    assert store.tags[f"{WORKFLOW}/{digest}"] == "live"
    assert store.requests == {"PUT": 1}
    assert len(json.dumps(reference)) < 256  # what the item and the message carry instead of 2,011 bytes


def test_a_reference_resolves_to_the_payload_once_per_sandbox() -> None:
    writer, store = claims()
    reader = ClaimCheck(store, threshold_bytes=1_024, max_payload_bytes=10_485_760)
    value = {"rows": list(range(1_000))}
    reference = writer.offload(WORKFLOW, value, what="an output")

    assert reader.resolve(reference, WORKFLOW) == value
    assert reader.resolve(reference, WORKFLOW) == value
    assert store.requests == {"PUT": 1, "GET": 1}  # the second read came from the cache


def test_a_missing_object_a_tampered_one_and_another_workflows_key_are_refused() -> None:
    writer, store = claims()
    reference = writer.offload(WORKFLOW, {"blob": "y" * 5_000}, what="an output")
    key = reference[REFERENCE_KEY]["key"]
    fresh = ClaimCheck(store, threshold_bytes=1_024, max_payload_bytes=10_485_760, cache_bytes=0)

    with pytest.raises(ClaimCheckMissingError, match="not an object of workflow other"):
        fresh.resolve(reference, "other")
    store.objects[key] = store.objects[key].replace(b"y", b"z")
    with pytest.raises(ClaimCheckMissingError, match="do not match"):
        fresh.resolve(reference, WORKFLOW)
    store.delete(key)
    with pytest.raises(ClaimCheckMissingError, match="no such object"):
        fresh.resolve(reference, WORKFLOW)


def test_a_payload_above_the_largest_is_refused_before_anything_is_written() -> None:
    check, store = claims(threshold=1_024, largest=100_000)

    with pytest.raises(PayloadTooLargeError) as refused:
        check.offload(WORKFLOW, {"blob": "x" * 100_000}, what="the workflow input")

    assert refused.value.limit == 100_000
    assert refused.value.size > 100_000
    assert store.requests == {}


def test_settle_restamps_every_object_of_the_workflow_and_no_other() -> None:
    check, store = claims()
    first = check.offload(WORKFLOW, {"a": "1" * 2_000}, what="x")[REFERENCE_KEY]["key"]
    second = check.offload(WORKFLOW, {"b": "2" * 2_000}, what="x")[REFERENCE_KEY]["key"]
    other = check.offload("another-workflow", {"c": "3" * 2_000}, what="x")[REFERENCE_KEY]["key"]

    assert check.settle(WORKFLOW, TERMINAL) == 2

    assert store.tags == {first: "terminal", second: "terminal", other: "live"}
    assert store.requests == {"PUT": 3, "LIST": 1, "COPY": 2}


def test_the_settings_refuse_a_threshold_at_or_above_the_largest_payload() -> None:
    with pytest.raises(ValueError, match="below MAX_PAYLOAD_BYTES"):
        EngineConfig(claim_check_threshold_bytes=100_000, max_payload_bytes=100_000)
    config = AgentConfig.from_env(
        {
            "AGENT_NAME": "flights",
            "AGENT_ACTIONS": "reserve",
            "IDEMPOTENCY_TABLE": "t",
            "RESPONSE_QUEUE_URL": "q",
            "PAYLOAD_BUCKET": "payloads",
            "CLAIM_CHECK_THRESHOLD_BYTES": "4096",
        }
    )
    assert (config.payload_bucket, config.claim_check_threshold_bytes, config.max_payload_bytes) == (
        "payloads",
        4_096,
        10_485_760,
    )


# ---------------------------------------------------------------------------------------------- through the engine


def big_output(pipeline: Pipeline, agent: str, blob: str) -> None:
    """Make ``agent``'s service answer its forward action with ``blob`` (its compensation as the fake does)."""
    service = pipeline.services[agent]
    original = service.call

    def call(request: StepRequest, timeout_seconds: float) -> dict[str, Any]:
        if request.phase is not Phase.ACTION:
            return original(request, timeout_seconds)
        service.calls.append((request.action, request.token))
        return {"confirmation": "FL-1", "blob": blob}

    service.call = call  # type: ignore[method-assign]


def recording(pipeline: Pipeline, agent: str) -> list[dict[str, Any]]:
    """Record the inputs ``agent``'s service is given (it still answers as the fake does)."""
    service = pipeline.services[agent]
    original = service.call
    seen: list[dict[str, Any]] = []

    def call(request: StepRequest, timeout_seconds: float) -> dict[str, Any]:
        seen.append(request.input)
        return original(request, timeout_seconds)

    service.call = call  # type: ignore[method-assign]
    return seen


def test_below_the_threshold_a_workflow_makes_no_payload_request_at_all() -> None:
    pipeline = Pipeline(claim_check_threshold=32_768)
    workflow_id = pipeline.start()

    pipeline.settle(workflow_id)

    assert pipeline.snapshot(workflow_id).workflow.status is WorkflowStatus.COMPLETED
    assert pipeline.payloads.requests == {}
    assert not pipeline.snapshot(workflow_id).workflow.claim_checked


def test_a_5_mb_output_of_step_1_reaches_step_2_intact_and_the_item_and_messages_hold_references() -> None:
    pipeline = Pipeline(claim_check_threshold=32_768)
    blob = "0123456789abcdef" * (MB5 // 16)
    big_output(pipeline, "flights", blob)
    hotel_inputs = recording(pipeline, "hotels")
    definition = trip_definition(
        book_hotel={"input": {"traveller.$": "input.traveller", "blob.$": "steps.reserve_flight.output.blob"}}
    )
    workflow_id = pipeline.start(definition)

    pipeline.pump()

    snapshot = pipeline.snapshot(workflow_id)
    assert snapshot.workflow.status is WorkflowStatus.COMPLETED
    [hotel_input] = hotel_inputs
    assert hashlib.sha256(hotel_input["blob"].encode()).hexdigest() == hashlib.sha256(blob.encode()).hexdigest()
    assert hotel_input["traveller"] == "Ada Lovelace"
    output = snapshot.steps["reserve_flight"].output
    assert is_reference(output)
    assert output[REFERENCE_KEY]["bytes"] > MB5
    assert "blob" not in json.dumps(snapshot.steps["reserve_flight"].output)
    # The flights agent PUTs its output (pending), which the scheduler makes live (COPY) when it applies the reply;
    # the scheduler GETs it to render step 2's input and PUTs that; the hotels agent GETs its input. When the
    # workflow ends: one LIST and one COPY per object.
    assert pipeline.payloads.requests == {"PUT": 2, "GET": 2, "LIST": 1, "COPY": 3}
    assert set(pipeline.payloads.tags.values()) == {"terminal"}


def test_a_claim_checked_request_stays_a_small_message() -> None:
    pipeline = Pipeline(claim_check_threshold=32_768)
    definition = trip_definition(reserve_flight={"input": {"blob.$": "input.blob"}})
    workflow_id = pipeline.start(definition, {**TRIP_INPUT, "blob": "b" * 1_000_000})

    [message] = pipeline.bus.peek("queue/flights")

    assert len(message.body) < 1_000 < SQS_MAX_MESSAGE_BYTES
    snapshot = pipeline.snapshot(workflow_id)
    assert is_reference(snapshot.workflow.input)  # the workflow input left the item too
    assert snapshot.workflow.claim_checked


def test_a_start_input_that_uses_the_reserved_key_is_refused() -> None:
    pipeline = Pipeline(claim_check_threshold=32_768)
    forged = {REFERENCE_KEY: {"key": "someone-else/abc", "bytes": 1, "sha256": "abc"}}

    with pytest.raises(InvalidDefinitionError, match="reserved"):
        pipeline.start(workflow_input=forged)


def test_an_output_above_the_largest_payload_fails_its_step_and_the_workflow_compensates() -> None:
    pipeline = Pipeline(claim_check_threshold=4_096, max_payload_bytes=100_000)
    big_output(pipeline, "hotels", "h" * 200_000)
    workflow_id = pipeline.start()

    pipeline.settle(workflow_id)

    snapshot = pipeline.snapshot(workflow_id)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    assert snapshot.steps["book_hotel"].error is not None
    assert snapshot.steps["book_hotel"].error["code"] == "OUTPUT_TOO_LARGE"
    assert pipeline.payloads.requests == {}


def test_a_missing_object_fails_the_step_that_needs_it_with_claim_check_missing() -> None:
    pipeline = Pipeline(claim_check_threshold=32_768)
    definition = trip_definition(reserve_flight={"input": {"blob.$": "input.blob"}})
    workflow_id = pipeline.start(definition, {**TRIP_INPUT, "blob": "b" * 100_000})
    for key in list(pipeline.payloads.objects):
        pipeline.payloads.delete(key)  # what an early expiry would do

    pipeline.settle(workflow_id)

    snapshot = pipeline.snapshot(workflow_id)
    assert snapshot.steps["reserve_flight"].status is StepStatus.FAILED
    assert snapshot.steps["reserve_flight"].error is not None
    assert snapshot.steps["reserve_flight"].error["code"] == "CLAIM_CHECK_MISSING"
    assert pipeline.services["flights"].calls == []  # the service never saw a request without its payload
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED


def test_a_workflow_that_outlives_the_retention_keeps_its_objects_until_it_ends() -> None:
    pipeline = Pipeline(claim_check_threshold=32_768)
    big_output(pipeline, "flights", "f" * 100_000)
    definition = trip_definition(book_hotel={"timeout_seconds": 30})
    workflow_id = pipeline.start(definition)
    pipeline.run_agent("flights")
    pipeline.run_scheduler()
    pipeline.clock.advance(90 * 86_400)  # three times TerminalRetentionDays while the hotel step is in flight

    assert set(pipeline.payloads.tags.values()) == {"live"}  # nothing expires while it runs
    pipeline.settle(workflow_id)

    assert pipeline.snapshot(workflow_id).workflow.status in {WorkflowStatus.COMPLETED, WorkflowStatus.COMPENSATED}
    assert set(pipeline.payloads.tags.values()) == {"terminal"}


def test_a_late_claim_checked_reply_of_an_ended_workflow_is_restamped_terminal() -> None:
    pipeline = Pipeline(claim_check_threshold=32_768)
    big_output(pipeline, "hotels", "h" * 100_000)
    workflow_id = pipeline.start()
    pipeline.run_agent("flights")
    pipeline.run_scheduler()
    pipeline.scheduler.cancel(workflow_id, owner=None, principal="ops")
    pipeline.run_agent("hotels")  # the hotel's reply (a reference) comes after the cancel

    pipeline.settle(workflow_id)

    assert pipeline.snapshot(workflow_id).workflow.status is WorkflowStatus.CANCELLED
    assert pipeline.payloads.tags and set(pipeline.payloads.tags.values()) == {"terminal"}


def test_outputs_below_the_threshold_that_fill_the_item_are_claim_checked_by_the_scheduler() -> None:
    # Given a store whose items hold 40,000 bytes of outputs (DynamoDB's 400 KB, scaled down) and outputs of 24 KB
    pipeline = Pipeline(claim_check_threshold=32_768)
    original_save = pipeline.store.save

    def save(snapshot: Snapshot, expect: Snapshot) -> Snapshot:
        outputs = [r.output for r in snapshot.steps.values()]
        size = len(json.dumps(outputs))
        if size > 40_000:
            raise PayloadTooLargeError("the workflow's record", size, 40_000)
        return original_save(snapshot, expect)

    pipeline.store.save = save  # type: ignore[method-assign]
    for agent in ("flights", "hotels"):
        big_output(pipeline, agent, agent[0] * 24_000)
    workflow_id = pipeline.start()

    # When the second output would overflow the item
    pipeline.settle(workflow_id)

    # Then the scheduler claim-checked it instead of failing the step, and the trip completed
    snapshot = pipeline.snapshot(workflow_id)
    assert snapshot.workflow.status is WorkflowStatus.COMPLETED
    assert not is_reference(snapshot.steps["reserve_flight"].output)
    assert is_reference(snapshot.steps["book_hotel"].output)
    assert pipeline.metrics["OutputsClaimCheckedByScheduler"] == 1


def test_a_crash_between_the_ending_write_and_the_restamp_is_repaired_by_the_message_coming_again() -> None:
    # Regression (the simulation, seed 2): the scheduler stored the write that ended the workflow, then crashed
    # before re-stamping its objects, which stayed live (never expiring). The reply was not deleted, so it comes back.
    pipeline = Pipeline(claim_check_threshold=32_768)
    big_output(pipeline, "flights", "f" * 100_000)
    workflow_id = pipeline.start()
    pipeline.run_agent("flights")
    pipeline.run_scheduler()
    pipeline.run_agent("hotels")
    pipeline.run_scheduler()
    last = pipeline.run_agent("payments")[0]
    settle = pipeline.scheduler._settle_payloads
    pipeline.scheduler._settle_payloads = lambda *args: None  # type: ignore[method-assign]  # the crash
    pipeline.scheduler.on_reply(decode_reply(pipeline.bus.receive(REPLIES)[0].body))
    pipeline.scheduler._settle_payloads = settle  # type: ignore[method-assign]
    assert pipeline.snapshot(workflow_id).workflow.status is WorkflowStatus.COMPLETED
    assert set(pipeline.payloads.tags.values()) == {"live"}
    # When the same reply is delivered again
    assert pipeline.scheduler.on_reply(last) == []
    # Then nothing is written, and the objects are re-stamped to expire with the workflow
    assert set(pipeline.payloads.tags.values()) == {"terminal"}


# ---------------------------------------------------------------------------------------------- leftover objects


def big_input() -> dict[str, Any]:
    return {**TRIP_INPUT, "manifest": "m" * 40_000}


def test_a_start_that_fails_before_its_workflow_exists_leaves_only_an_object_that_expires() -> None:
    # Regression: the claim-checked input was written live, then the create failed (a throttle, a crash), and the
    # object, of no workflow, never expired.
    # Given a store whose create fails once
    pipeline = Pipeline(claim_check_threshold=32_768)
    create = pipeline.store.create

    def throttled(snapshot: Snapshot) -> Snapshot:
        pipeline.store.create = create  # type: ignore[method-assign]
        raise RuntimeError("ProvisionedThroughputExceededException")

    pipeline.store.create = throttled  # type: ignore[method-assign]
    # When a start with a large input fails before its workflow exists
    with pytest.raises(RuntimeError):
        pipeline.start(workflow_input=big_input(), key="leftover-1")
    # Then its object is tagged pending (the bucket's PendingPayloads rule expires it after a day)
    [key] = pipeline.payloads.objects
    assert pipeline.payloads.tags == {key: "pending"}
    assert pipeline.store.workflows == {}
    # And a retry that creates the workflow makes the same object its own: live while it runs
    workflow_id = pipeline.start(workflow_input=big_input(), key="leftover-1")
    assert key.startswith(f"{workflow_id}/") and pipeline.payloads.tags == {key: "live"}


def test_a_start_whose_restamp_is_lost_after_the_create_is_made_live_by_the_next_write() -> None:
    # Given a start that created its workflow and crashed before making its input live (the restamp lost)
    pipeline = Pipeline(claim_check_threshold=32_768)
    restamp = pipeline.payloads.restamp

    def lost(key: str, state: str) -> None:
        pipeline.payloads.restamp = restamp  # type: ignore[method-assign]
        raise RuntimeError("the sandbox died")

    pipeline.payloads.restamp = lost  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        pipeline.start(workflow_input=big_input(), key="leftover-2")
    [(key, tag)] = pipeline.payloads.tags.items()
    workflow_id = key.split("/")[0]
    assert tag == "pending" and pipeline.snapshot(workflow_id).version == 1
    # When the supervisor resends its first step (never sent) and the workflow's next write is stored
    pipeline.clock.advance(3_600)
    pipeline.sweep()
    # Then its input is live: it no longer expires under the running workflow
    assert pipeline.snapshot(workflow_id).version > 1
    assert pipeline.payloads.tags[key] == "live"
    pipeline.settle(workflow_id)
    assert pipeline.payloads.tags[key] == "terminal"


def test_an_agents_output_is_pending_until_the_scheduler_applies_its_reply() -> None:
    # Given an agent whose large output is written before its reply
    pipeline = Pipeline(claim_check_threshold=32_768)
    big_output(pipeline, "flights", "f" * 100_000)
    workflow_id = pipeline.start()
    [reply] = pipeline.run_agent("flights")
    key = reply.output[REFERENCE_KEY]["key"]
    # Then it is pending (a reply that never reaches a workflow leaves an object that expires)
    assert pipeline.payloads.tags[key] == "pending"
    # When the scheduler applies the reply, the workflow holds the reference and the object is live
    pipeline.run_scheduler()
    assert is_reference(pipeline.snapshot(workflow_id).steps["reserve_flight"].output)
    assert pipeline.payloads.tags[key] == "live"
    # And a reply whose workflow is gone makes nothing live
    orphan = reply.model_copy(
        update={"workflow_id": "gone", "output": {REFERENCE_KEY: {**reply.output[REFERENCE_KEY], "key": "gone/x"}}}
    )
    pipeline.payloads.put("gone/x", b"{}", "pending")
    assert pipeline.scheduler.on_reply(orphan) == []
    assert pipeline.payloads.tags["gone/x"] == "pending"


def test_a_repeated_start_leaves_the_existing_workflows_input_live() -> None:
    # Given a running workflow whose claim-checked input is live
    pipeline = Pipeline(claim_check_threshold=32_768)
    workflow_id = pipeline.start(workflow_input=big_input(), key="repeat-1")
    [key] = pipeline.payloads.keys(f"{workflow_id}/")
    assert pipeline.payloads.tags[key] == "live"
    # When the client repeats the start (its PUT writes the same object again, pending, and the create finds it)
    assert pipeline.start(workflow_input=big_input(), key="repeat-1") == workflow_id
    # Then the object is the running workflow's again: live, never left to expire under it
    assert pipeline.payloads.tags[key] == "live"
