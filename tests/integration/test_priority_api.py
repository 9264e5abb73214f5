"""Priorities through the template's functions on moto: a start's priority is checked, shown and carried to the
agents, with its tenant as the SQS message group (what SQS fair queues share a standard queue by)."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest

from tests.integration.conftest import Deployed
from tests.support.lambdas import load_event

TRIP = load_event("trip_booking_request.json")


def body(**extra: Any) -> dict[str, Any]:
    copy = json.loads(json.dumps(TRIP))
    copy["definition"]["tenancy"] = {"max_running": 5, "tenant_key": "customer"}
    copy["input"]["customer"] = "acme"
    return {**copy, **extra}


@pytest.mark.parametrize(
    ("priority", "says"), [(0, "greater than or equal to 1"), (6, "less than or equal to 5"), ("2", "valid integer")]
)
def test_a_priority_out_of_1_to_5_is_refused_422_and_writes_nothing(
    deployed: Deployed, priority: Any, says: str
) -> None:
    status, answer = deployed.api("POST", "/workflows", body(priority=priority))
    assert status == 422
    assert says in json.dumps(answer)
    assert [item for item in deployed.items() if item["sk"]["S"] == "#WF"] == []


def test_a_start_with_a_priority_shows_it_and_its_requests_carry_it_and_the_tenant_as_their_group(
    deployed: Deployed,
) -> None:
    status, started = deployed.api("POST", "/workflows", body(priority=1), headers={"Idempotency-Key": "order-1"})
    assert (status, started["priority"]) == (201, 1)
    sqs = boto3.client("sqs")
    [message] = sqs.receive_message(
        QueueUrl=deployed.queue_url("FlightsRequestQueue"),
        MaxNumberOfMessages=10,
        MessageSystemAttributeNames=["MessageGroupId"],
    )["Messages"]
    request = json.loads(message["Body"])
    assert (request["priority"], request["tenant"]) == (1, "key#acme")
    assert message["Attributes"]["MessageGroupId"] == "key#acme"

    # A start without one is of priority 3; the same key with another priority is another body (409)
    _, plain = deployed.api("POST", "/workflows", body())
    assert plain["priority"] == 3
    status, _ = deployed.api("POST", "/workflows", body(priority=2), headers={"Idempotency-Key": "order-1"})
    assert status == 409
