"""The handlers with moto and template-built resources: API, scheduler, agents and supervisor, end to end."""

from __future__ import annotations

import io
import json
from typing import Any

import boto3
import pytest
from aws_lambda_powertools.utilities.batch.exceptions import UnexpectedBatchTypeError

from sasflow.batch import one_at_a_time
from sasflow.bootstrap import Lazy, build_agent
from tests.integration.conftest import Deployed
from tests.support.lambdas import FakeContext, load_event, sqs_event
from tests.support.ledgers import ledger_order

TRIP = load_event("trip_booking_request.json")


def workflow_items(deployed: Deployed) -> list[dict[str, Any]]:
    return [i for i in deployed.items() if i["sk"]["S"] == "#WF"]


def test_start_event_from_events_dir_writes_write_ahead_state_then_sends_one_request(deployed: Deployed) -> None:
    # Given the sample start event
    event = load_event("api_start_workflow.json")
    # When the API function handles it
    response = deployed.fn("ApiFunction").invoke(event)
    body = json.loads(response["body"])
    # Then the workflow is RUNNING, its first step PROCESSING at attempt 1, and one request waits for the agent
    assert response["statusCode"] == 201
    assert body["status"] == "RUNNING"
    assert [(s["name"], s["status"], s["attempt"]) for s in body["steps"]] == [
        ("reserve_flight", "PROCESSING", 1),
        ("book_hotel", "PENDING", 0),
        ("charge_card", "PENDING", 0),
    ]
    assert body["steps"][0]["complete_by"] == int(deployed.clock.now()) + 30  # the event's timeout_seconds
    assert deployed.depth("FlightsRequestQueue") == 1
    assert response["headers"]["Location"] == f"/workflows/{body['workflow_id']}"


def test_happy_path_through_every_handler_completes_with_one_attempt_per_step(deployed: Deployed) -> None:
    status, started = deployed.api("POST", "/workflows", TRIP)
    assert status == 201
    deployed.pump()
    status, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    assert status == 200
    assert view["status"] == "COMPLETED"
    assert [(s["name"], s["status"], s["attempt"]) for s in view["steps"]] == [
        ("reserve_flight", "COMPLETED", 1),
        ("book_hotel", "COMPLETED", 1),
        ("charge_card", "COMPLETED", 1),
    ]
    assert view["steps"][1]["output"]["service"] == "hotels"
    # every remote effect happened exactly once
    for name in ("flights", "hotels", "payments"):
        assert list(deployed.remote[name].service.effects().values()) == [1]
    # nothing is left in the sparse deadline index
    assert [i for i in deployed.items() if "dl_shard" in i] == []


def test_business_rejection_compensates_through_the_handlers(deployed: Deployed) -> None:
    # Given a trip whose charge the payments service declines
    trip = json.loads(json.dumps(TRIP))
    trip["input"]["simulate"] = "reject"
    trip["definition"]["steps"][2]["input"]["simulate.$"] = "input.simulate"
    # When it runs through every handler
    status, started = deployed.api("POST", "/workflows", trip)
    assert status == 201
    workflow_id = started["workflow_id"]
    deployed.pump()
    # Then it is COMPENSATED: the two completed steps undone, the declined one not
    _, view = deployed.api("GET", f"/workflows/{workflow_id}")
    assert view["status"] == "COMPENSATED"
    assert [s["status"] for s in view["steps"]] == ["COMPENSATED", "COMPENSATED", "FAILED"]
    assert view["steps"][2]["error"]["code"] == "CARD_DECLINED"
    # And the services' ledgers, in the order they were written, show the effects forward, then the undos in
    # reverse: the hotel was cancelled before the flight
    assert ledger_order(deployed.remote, workflow_id) == [
        ("flights", "effect", "reserve_flight"),
        ("hotels", "effect", "book_hotel"),
        ("hotels", "undo", "book_hotel"),
        ("flights", "undo", "reserve_flight"),
    ]
    assert deployed.remote["payments"].service.compensations() == {}


def test_same_idempotency_key_and_body_returns_the_same_workflow(deployed: Deployed) -> None:
    headers = {"Idempotency-Key": "order-77"}
    first_status, first = deployed.api("POST", "/workflows", TRIP, headers=headers)
    second_status, second = deployed.api("POST", "/workflows", TRIP, headers=headers)
    assert (first_status, second_status) == (201, 200)
    assert first["workflow_id"] == second["workflow_id"]
    assert len(workflow_items(deployed)) == 1
    assert deployed.depth("FlightsRequestQueue") == 1


def test_same_key_with_another_body_is_409_and_the_original_is_unchanged(deployed: Deployed) -> None:
    headers = {"Idempotency-Key": "order-78"}
    _, first = deployed.api("POST", "/workflows", TRIP, headers=headers)
    other = json.loads(json.dumps(TRIP))
    other["input"]["amount"] = 1
    status, body = deployed.api("POST", "/workflows", other, headers=headers)
    assert status == 409
    assert body["error"] == "IDEMPOTENCY_KEY_REUSED"
    _, view = deployed.api("GET", f"/workflows/{first['workflow_id']}")
    assert view["input"]["amount"] == 420
    assert len(workflow_items(deployed)) == 1


def test_two_starts_without_a_key_create_two_workflows(deployed: Deployed) -> None:
    _, first = deployed.api("POST", "/workflows", TRIP)
    _, second = deployed.api("POST", "/workflows", TRIP)
    assert first["workflow_id"] != second["workflow_id"]
    assert len(workflow_items(deployed)) == 2


def _definition(**step_changes: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(TRIP))
    body["definition"]["steps"][0].update(step_changes)
    return body


BAD_BODIES = [
    ("empty", "", 422, "VALIDATION_ERROR"),
    ("null", "null", 422, "VALIDATION_ERROR"),
    ("array", "[]", 422, "VALIDATION_ERROR"),
    ("truncated", json.dumps(TRIP)[:40], 400, "MALFORMED_JSON"),
    ("wrong types", json.dumps({"definition": "trip", "input": 3}), 422, "VALIDATION_ERROR"),
    ("no steps", json.dumps({"definition": {"name": "x", "steps": []}}), 422, "VALIDATION_ERROR"),
    ("negative timeout", json.dumps(_definition(timeout_seconds=-5)), 422, "VALIDATION_ERROR"),
    ("unknown agent", json.dumps(_definition(agent="trains")), 422, "INVALID_DEFINITION"),
    ("unknown dependency", json.dumps(_definition(depends_on=["nope"])), 422, "VALIDATION_ERROR"),
    ("bad jmespath", json.dumps(_definition(input={"x.$": "input.[["})), 422, "VALIDATION_ERROR"),
    ("extra field", json.dumps({**TRIP, "surprise": 1}), 422, "VALIDATION_ERROR"),
]


@pytest.mark.parametrize(("case", "raw", "status", "code"), BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_bad_start_bodies_get_a_4xx_json_error_and_write_nothing(
    deployed: Deployed, case: str, raw: str, status: int, code: str
) -> None:
    got_status, body = deployed.api("POST", "/workflows", raw_body=raw)
    assert (got_status, body["error"]) == (status, code)
    assert isinstance(body["message"], str) and body["message"]
    assert deployed.items() == []
    assert deployed.depth("FlightsRequestQueue") == 0


def test_input_too_large_for_one_message_is_claim_checked_and_a_body_over_the_limit_is_413(deployed: Deployed) -> None:
    # A 300 KB input (and the first step's input rendered from it) no longer fits one SQS message: claim-checked
    body = json.loads(json.dumps(TRIP))
    body["input"]["traveller"] = "x" * 300_000
    status, started = deployed.api("POST", "/workflows", body)
    assert status == 201
    assert set(started["input"]) == {"$claim_check"}
    [message] = boto3.client("sqs").receive_message(QueueUrl=deployed.queue_url("FlightsRequestQueue"))["Messages"]
    assert len(message["Body"]) < 2_000
    # A body over the API's 393,216 bytes is refused before it is read, and writes nothing
    body["input"]["traveller"] = "x" * 400_000
    status, error = deployed.api("POST", "/workflows", body)
    assert (status, error["error"]) == (413, "PAYLOAD_TOO_LARGE")
    assert len([i for i in deployed.items() if i["pk"]["S"].startswith("WF#")]) == 1


def test_get_unknown_workflow_is_404_json(deployed: Deployed) -> None:
    status, body = deployed.api("GET", "/workflows/3f2504e0-4f89-41d3-9a0c-0305e82c3301")
    assert (status, body["error"]) == (404, "WORKFLOW_NOT_FOUND")


def test_openapi_document_lists_the_routes(deployed: Deployed) -> None:
    status, spec = deployed.api("GET", "/openapi.json")
    assert status == 200
    assert spec["openapi"].startswith("3.")
    assert {"/workflows", "/workflows/{workflow_id}", "/workflows/{workflow_id}/cancel"} <= set(spec["paths"])


def test_cancel_a_running_workflow_compensates_and_ends_cancelled(deployed: Deployed) -> None:
    _, started = deployed.api("POST", "/workflows", TRIP)
    deployed.driver("FlightsAgentFunction").deliver()
    deployed.driver("SchedulerFunction").deliver()
    status, view = deployed.api("POST", f"/workflows/{started['workflow_id']}/cancel")
    assert (status, view["status"]) == (202, "CANCELLING")
    deployed.pump()
    _, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    assert view["status"] == "CANCELLED"
    assert [s["status"] for s in view["steps"]] == ["COMPENSATED", "COMPENSATED", "SKIPPED"]
    # A second cancel (a client retrying) answers the same and changes nothing
    events = view["events"]
    status, again = deployed.api("POST", f"/workflows/{started['workflow_id']}/cancel")
    assert (status, again["status"], again["events"]) == (202, "CANCELLED", events)


def test_batch_with_malformed_records_fails_only_those_records(deployed: Deployed) -> None:
    # Given a started workflow whose first reply is valid, next to two poison records
    _, started = deployed.api("POST", "/workflows", TRIP)
    deployed.driver("FlightsAgentFunction").deliver()
    scheduler = deployed.driver("SchedulerFunction")
    [valid] = scheduler.receive()
    poison = [
        {**valid, "MessageId": "poison-not-json", "Body": "not-json"},
        {**valid, "MessageId": "poison-no-step", "Body": json.dumps({"kind": "step.reply", "workflow_id": "x"})},
    ]
    # When the scheduler handles the batch
    result = scheduler.deliver([valid, *poison])
    # Then exactly the two bad ids fail, and the valid reply was applied
    assert result is not None
    assert sorted(f["itemIdentifier"] for f in result["batchItemFailures"]) == ["poison-no-step", "poison-not-json"]
    _, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    assert view["steps"][0]["status"] == "COMPLETED"
    assert deployed.depth("HotelsRequestQueue") == 1


def test_an_event_without_records_is_an_error_not_an_empty_success(deployed: Deployed) -> None:
    with pytest.raises(UnexpectedBatchTypeError):
        deployed.fn("SchedulerFunction").invoke({"foo": "bar"})
    with pytest.raises(UnexpectedBatchTypeError):
        deployed.fn("FlightsAgentFunction").invoke({"Records": []})


@pytest.mark.parametrize(
    ("function", "queue", "dead_letter_queue", "body"),
    [
        ("SchedulerFunction", "ResponseQueue", "ResponseDeadLetterQueue", "not-json"),
        (
            "FlightsAgentFunction",
            "FlightsRequestQueue",
            "FlightsDeadLetterQueue",
            '{"workflow_id": "w-1", "step": "reserve_flight"}',
        ),
    ],
)
def test_a_poison_message_is_delivered_again_at_once_and_ends_in_the_dead_letter_queue(
    deployed: Deployed, function: str, queue: str, dead_letter_queue: str, body: str
) -> None:
    # Given a poison message on a queue with template.yaml's settings (VisibilityTimeout 180 s, maxReceiveCount 5)
    sqs = boto3.client("sqs")
    sqs.send_message(QueueUrl=deployed.queue_url(queue), MessageBody=body)
    consumer = deployed.driver(function)
    # When it is delivered, without the clock moving: each failed receive makes it visible again at once (not after
    # 180 s), under the function's own role (ChangeMessageVisibility on its queue)
    failures = 0
    for _ in range(10):
        result = consumer.deliver()
        if result is None:
            break
        failures += len(result["batchItemFailures"])
    # Then it failed five receives and moto's redrive policy moved it to the dead-letter queue: not lost, and in
    # seconds, not 5 x 180 s
    assert failures == 5
    dead = sqs.receive_message(QueueUrl=deployed.queue_url(dead_letter_queue), MaxNumberOfMessages=10)
    assert [m["Body"] for m in dead["Messages"]] == [body]
    assert deployed.depth(queue) == 0


def test_agent_event_from_events_dir_replies_once_for_a_duplicated_request(deployed: Deployed) -> None:
    # Given the sample request event, delivered twice (at-least-once delivery)
    event = load_event("agent_request.json")
    event["Records"][0]["body"] = event["Records"][0]["body"].replace("1795860030", str(int(deployed.clock.now()) + 30))
    agent = deployed.fn("FlightsAgentFunction")
    # When the agent handles both deliveries
    first = agent.invoke(event)
    second = agent.invoke(event)
    # Then both succeed, the remote effect happened once, and two identical replies went out
    assert first == second == {"batchItemFailures": []}
    assert list(deployed.remote["flights"].service.effects().values()) == [1]
    replies = boto3.client("sqs").receive_message(QueueUrl=deployed.queue_url("ResponseQueue"), MaxNumberOfMessages=10)
    bodies = [json.loads(m["Body"]) for m in replies["Messages"]]
    assert [(b["step"], b["attempt"], b["outcome"]) for b in bodies] == [("reserve_flight", 1, "succeeded")] * 2


def test_supervisor_resends_an_overdue_step_after_a_lost_reply(deployed: Deployed) -> None:
    # Given the flight agent's reply was lost
    _, started = deployed.api("POST", "/workflows", TRIP)
    deployed.driver("FlightsAgentFunction").deliver()
    sqs = boto3.client("sqs")
    sqs.purge_queue(QueueUrl=deployed.queue_url("ResponseQueue"))
    _, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    complete_by = view["steps"][0]["complete_by"]
    supervisor = deployed.fn("SupervisorFunction")
    # When the scheduled supervisor runs at complete_by + grace (30), then one second later
    deployed.clock.set(complete_by + 30)
    at_boundary = supervisor.invoke(load_event("supervisor_scheduled.json"))
    deployed.clock.set(complete_by + 31)
    after = supervisor.invoke(load_event("supervisor_scheduled.json"))
    # Then only the second run resends, and the workflow completes with attempt 2
    assert (at_boundary["overdue"], at_boundary["messages"]) == (0, 0)
    assert (after["overdue"], after["messages"], after["acquired"]) == (1, 1, True)
    deployed.pump()
    _, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    assert view["status"] == "COMPLETED"
    assert (view["steps"][0]["attempt"], view["steps"][0]["resends"]) == (2, 1)
    assert list(deployed.remote["flights"].service.effects().values()) == [1]


def test_a_batch_that_runs_out_of_time_after_six_records_retries_only_the_last_four(deployed: Deployed) -> None:
    # Given ten started workflows whose flight requests arrive in one batch, at an agent that works on one record at
    # a time (AGENT_CONCURRENCY=1; at 10 every record starts at once, test_agent_concurrency)
    for _ in range(10):
        deployed.api("POST", "/workflows", TRIP)
    agent = deployed.driver("FlightsAgentFunction")
    clock = agent.function.clock
    agent.function.module.agent = Lazy(lambda: build_agent(clock=clock, records=one_at_a_time))
    messages: list[dict[str, Any]] = []
    while len(messages) < 10:
        messages += agent.receive()
    flights = deployed.remote["flights"].service

    class RunningOut(FakeContext):
        def get_remaining_time_in_millis(self) -> int:
            # plenty of time for the first six calls, then only one second
            return 60_000 if len(flights.effects()) < 6 else 1_000

    # When the invocation runs out of time after the sixth record
    event = sqs_event(messages, agent.event.queue_arn)
    result = agent.function.invoke(event, context=RunningOut("FlightsAgentFunction", 30))
    failed = [f["itemIdentifier"] for f in result["batchItemFailures"]]
    # Then records 7 to 10 failed without calling out, and their redelivery calls out for those four only
    assert failed == [m["MessageId"] for m in messages[6:]]
    assert len(flights.effects()) == 6
    retry = agent.function.invoke(sqs_event(messages[6:], agent.event.queue_arn))
    assert retry == {"batchItemFailures": []}
    assert flights.stats()["calls"] == 10
    assert sorted(flights.effects().values()) == [1] * 10


def test_each_transition_logs_one_lean_line_whose_correlation_id_is_the_workflow(deployed: Deployed) -> None:
    # Given the scheduler's log stream captured (powertools' handler, as Lambda would ship it)
    _, started = deployed.api("POST", "/workflows", TRIP)
    deployed.driver("FlightsAgentFunction").deliver()
    scheduler = deployed.fn("SchedulerFunction")
    handler = scheduler.module.logger.registered_handler
    buffer = io.StringIO()
    previous = handler.setStream(buffer)
    try:
        deployed.driver("SchedulerFunction").deliver()
    finally:
        handler.setStream(previous)
    lines = [json.loads(line) for line in buffer.getvalue().splitlines() if line.startswith("{")]
    moves = [line for line in lines if line.get("message") == "moved"]
    # Then the flight's reply and the hotel's dispatch are one line, naming the workflow, the steps, attempts, moves
    wid = started["workflow_id"]
    assert [m["steps"] for m in moves] == ["reserve_flight#1 PROCESSING>COMPLETED, book_hotel#1 PENDING>PROCESSING"]
    assert {(m["correlation_id"], m["level"]) for m in moves} == {(wid, "INFO")}
    assert "workflow_id" not in moves[0]  # named once, by the correlation id (CloudWatch bills by the byte)
    assert "from" not in moves[0] and "to" not in moves[0]  # the workflow stayed RUNNING
    # without what CloudWatch already knows, and without any input or output
    for line in moves:
        assert not set(line) & {
            "function_arn",
            "function_memory_size",
            "function_name",
            "location",
            "cold_start",
            "service",
            "timestamp",
        }
        assert "function_request_id" in line
        assert "Ada" not in json.dumps(line)


def test_a_start_naming_its_definition_by_a_bare_string_is_one_error_that_shows_both_forms(deployed: Deployed) -> None:
    # From a new user's trial: {"definition": "trip-booking"} answered pydantic's union internals
    # (body.definition.function-after[_valid_graph_and_references(), ...]) and "a valid dictionary"
    status, body = deployed.api("POST", "/workflows", {"definition": "trip-booking", "input": {}})
    assert (status, body["error"]) == (422, "VALIDATION_ERROR")
    [detail] = body["details"]
    assert detail["loc"] == ["body", "definition"]
    assert detail["msg"] == (
        'expected an object: a registered definition as {"name": "<name>", "version": <n>} (no version: the latest),'
        " or the definition itself with its steps; got the string 'trip-booking'"
    )
    assert deployed.items() == []
