"""Wiring that only the real handlers provide, driven through them on moto (issue "Tests that bite").

The unit harness (tests/support/pipeline.py) builds the agent runtime itself: it registers the Lambda context with
the idempotency config and picks the idempotency key. These tests go through ``agent_handler.handler`` and
``bootstrap.build_agent`` instead, so removing ``register_lambda_context`` from the handler, or keying idempotency
on anything but the business identity, fails here.
"""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from devstack.inprocess import environment, function_environment
from sasflow.messages import remote_token
from simulation.world import powertools_on_clock
from tests.integration.conftest import Deployed
from tests.support.lambdas import load_event

TRIP = load_event("trip_booking_request.json")
GRACE = 30  # template default DeadlineGraceSeconds


class LambdaKilled(BaseException):
    """Lambda ending the sandbox mid-invocation (timeout, out of memory): no ``except Exception`` runs."""


def _agent_client(deployed: Deployed, logical_id: str) -> Any:
    function = deployed.fn(logical_id)
    with environment(function_environment(function.spec)):  # its cold start reads the function's environment
        services = function.module.agent()
    return services.runtime.breaker.store.client  # the one DynamoDB client of the agent (idempotency + breaker)


def _kill_on_idempotency_result(client: Any) -> list[str]:
    """Kill the invocation at its first idempotency-record update (the result, written after the remote call)."""
    killed: list[str] = []

    def kill(params: dict[str, Any], **_: Any) -> None:
        key = params["Key"]["id"]["S"]
        if not key.startswith("circuit-breaker#") and not killed:
            killed.append(key)
            raise LambdaKilled(f"killed before recording the result of {key}")

    client.meta.events.register("before-parameter-build.dynamodb.UpdateItem", kill, unique_id="kill")
    return killed


def test_an_agent_killed_after_its_remote_effect_is_resent_after_the_in_progress_expiry_and_completes_once(
    deployed: Deployed,
) -> None:
    with powertools_on_clock(deployed.clock):  # powertools' in-progress expiry reads the test's clock
        # Given a started trip whose flights agent calls the service and is killed before recording the result
        status, started = deployed.api("POST", "/workflows", TRIP, headers={"Idempotency-Key": "killed-agent"})
        assert status == 201
        workflow_id = started["workflow_id"]
        client = _agent_client(deployed, "FlightsAgentFunction")
        killed = _kill_on_idempotency_result(client)
        with pytest.raises(LambdaKilled):
            deployed.driver("FlightsAgentFunction").deliver()
        client.meta.events.unregister("before-parameter-build.dynamodb.UpdateItem", unique_id="kill")
        token = remote_token(workflow_id, "reserve_flight", "reserve")
        assert deployed.remote["flights"].service.effects() == {token: 1}
        assert len(killed) == 1
        [record] = [
            item
            for item in boto3.client("dynamodb").scan(TableName=deployed.physical["IdempotencyTable"])["Items"]
            if item["id"]["S"] == killed[0]
        ]
        # the record is left IN_PROGRESS, expiring with the killed invocation (register_lambda_context)
        assert record["status"]["S"] == "INPROGRESS"
        assert "in_progress_expiration" in record
        complete_by = started["steps"][0]["complete_by"]

        # When the supervisor finds the step overdue and resends it, after the killed invocation's deadline
        deployed.clock.set(complete_by + GRACE + 1)
        report = deployed.fn("SupervisorFunction").invoke(load_event("supervisor_scheduled.json"))
        assert report["messages"] == 1
        deployed.pump()

        # Then the resend is not refused as in progress: the step completes at attempt 2 with one remote effect
        status, view = deployed.api("GET", f"/workflows/{workflow_id}")
    assert status == 200
    assert view["status"] == "COMPLETED"
    assert [(s["name"], s["status"], s["attempt"], s["resends"]) for s in view["steps"]] == [
        ("reserve_flight", "COMPLETED", 2, 1),
        ("book_hotel", "COMPLETED", 1, 0),
        ("charge_card", "COMPLETED", 1, 0),
    ]
    assert deployed.remote["flights"].service.effects() == {token: 1}
    assert deployed.depth("FlightsRequestQueue") == 1  # the killed invocation's message, still invisible


def test_the_agent_keys_idempotency_on_the_business_identity_not_the_sqs_message(deployed: Deployed) -> None:
    # Given one step request delivered twice as two different SQS messages (a duplicate send)
    status, _ = deployed.api("POST", "/workflows", TRIP)
    assert status == 201
    flights_queue = deployed.queue_url("FlightsRequestQueue")
    sqs = boto3.client("sqs")
    [message] = sqs.receive_message(QueueUrl=flights_queue, MaxNumberOfMessages=10)["Messages"]
    sqs.send_message(QueueUrl=flights_queue, MessageBody=message["Body"])
    sqs.change_message_visibility(QueueUrl=flights_queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
    driver = deployed.driver("FlightsAgentFunction")
    # When the agent handler gets each copy in its own invocation
    copies = driver.receive()
    copies += driver.receive()
    assert len(copies) == 2 and copies[0]["MessageId"] != copies[1]["MessageId"]
    first = driver.deliver([copies[0]])
    second = driver.deliver([copies[1]])
    # Then both copies succeed, the service is called once, and the two replies are the same
    assert first == second == {"batchItemFailures": []}
    assert deployed.remote["flights"].service.stats()["calls"] == 1
    replies = sqs.receive_message(QueueUrl=deployed.queue_url("ResponseQueue"), MaxNumberOfMessages=10)["Messages"]
    bodies = [json.loads(r["Body"]) for r in replies]
    assert len(bodies) == 2 and bodies[0] == bodies[1]
    assert bodies[0]["outcome"] == "succeeded" and bodies[0]["attempt"] == 1
