"""Failure catalogue (issue 3 §2), moto tier: the handlers against template-built resources."""

from __future__ import annotations

import json
from typing import Any

import boto3
from botocore.exceptions import ClientError

from devstack.agents import load_agents
from devstack.inprocess import environment, function_environment
from devstack.template import SqsEventSpec, Stack
from devstack.triggers import load_triggers
from tests.integration.conftest import Deployed
from tests.support.lambdas import ROOT, load_event

TRIP = load_event("trip_booking_request.json")


def test_scheduler_send_failing_after_the_write_is_repaired_by_one_supervisor_run(deployed: Deployed) -> None:
    # Given SQS answers ServiceUnavailable to the start's send, after the state was written
    def unavailable(**_: Any) -> None:
        raise ClientError({"Error": {"Code": "ServiceUnavailable", "Message": "try later"}}, "SendMessageBatch")

    api = deployed.fn("ApiFunction")
    with environment(function_environment(api.spec)):  # its cold start reads the function's environment
        bus = api.module.engine().bus
    bus.client.meta.events.register("before-call.sqs.SendMessageBatch", unavailable, unique_id="unavailable")
    headers = {"Idempotency-Key": "send-fails"}
    status, started = deployed.api("POST", "/workflows", TRIP, headers=headers)
    bus.client.meta.events.unregister("before-call.sqs.SendMessageBatch", unique_id="unavailable")
    assert status == 201
    assert deployed.depth("FlightsRequestQueue") == 0
    # When the supervisor runs once after complete-by + grace
    deployed.clock.set(started["steps"][0]["complete_by"] + 31)
    report = deployed.fn("SupervisorFunction").invoke(load_event("supervisor_scheduled.json"))
    # Then there is exactly 1 message; repeating the start returns the same workflow, and the table holds 1
    assert report["messages"] == 1
    assert deployed.depth("FlightsRequestQueue") == 1
    again_status, again = deployed.api("POST", "/workflows", TRIP, headers=headers)
    assert (again_status, again["workflow_id"]) == (200, started["workflow_id"])
    assert len([i for i in deployed.items() if i["sk"]["S"] == "#WF"]) == 1
    deployed.pump()
    _, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    assert view["status"] == "COMPLETED"


def test_a_6_mb_body_gets_a_4xx_json_error_and_writes_nothing(deployed: Deployed) -> None:
    body = json.dumps({**TRIP, "input": {"blob": "x" * 6_000_000}})
    status, error = deployed.api("POST", "/workflows", raw_body=body)
    assert 400 <= status < 500
    assert error["error"] == "PAYLOAD_TOO_LARGE"
    assert deployed.items() == []


def test_template_queues_are_sane_for_their_consumers() -> None:
    # Read from template.yaml: every consumed queue's visibility timeout is >= 6 x its consumer's timeout (AWS's
    # guidance for Lambda event source mappings) and every queue with a consumer has a redrive policy with
    # maxReceiveCount > 1.
    stack = Stack.from_file(ROOT / "template.yaml", parameters={"DeploySampleServices": "false"})
    consumers = {
        event.queue_logical_id: function
        for function in stack.functions()
        for event in function.events
        if isinstance(event, SqsEventSpec)
    }
    triggers = {f"{trigger.pascal}TriggerQueue" for trigger in load_triggers(ROOT / "triggers.yaml")}
    assert triggers
    engine = {"ResponseQueue", "BatchQueue"}
    assert set(consumers) == engine | {f"{agent.pascal}RequestQueue" for agent in load_agents()} | triggers
    for queue, function in consumers.items():
        properties = stack.properties(queue)
        assert int(properties["VisibilityTimeout"]) >= 6 * function.timeout_seconds, queue
        redrive = properties["RedrivePolicy"]
        assert int(redrive["maxReceiveCount"]) > 1, queue
        assert redrive["deadLetterTargetArn"].endswith(
            queue.replace("RequestQueue", "DeadLetterQueue")
            .replace("ResponseQueue", "ResponseDeadLetterQueue")
            .replace("TriggerQueue", "TriggerDeadLetterQueue")
            .replace("BatchQueue", "BatchDeadLetterQueue")
        )
    for event in (e for f in stack.functions() for e in f.events if isinstance(e, SqsEventSpec)):
        assert event.report_batch_item_failures, event.queue_logical_id


def test_every_complete_by_written_is_an_integer_number(deployed: Deployed) -> None:
    deployed.api("POST", "/workflows", TRIP)
    raw = boto3.client("dynamodb").scan(TableName=deployed.physical["StateTable"])["Items"]
    deadlines = [item["complete_by"] for item in raw if "complete_by" in item]
    assert len(deadlines) == 1  # the workflow's index entry: its first step's complete-by
    [workflow] = [item for item in raw if item["sk"]["S"] == "#WF"]
    deadlines.append(workflow["steps"]["M"]["reserve_flight"]["M"]["complete_by"])  # the step's own
    assert deadlines[0] == deadlines[1]
    for value in deadlines:
        assert list(value) == ["N"]
        assert value["N"].isdigit() and len(value["N"]) == 10  # epoch seconds, not milliseconds
