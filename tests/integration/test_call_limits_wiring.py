"""Call limits through the real agent handler on moto (issue 38): the hotels sample declares 5 in flight and 10 calls
a second, and its instances share one item that its role allows it, and no other agent."""

from __future__ import annotations

from typing import Any

import boto3
import pytest

from devstack.iam.policy import AuthRequest, evaluate
from devstack.inprocess import environment, function_environment
from sasflow.adapters.limits_dynamodb import DynamoDBLimitsStore, limits_key
from sasflow.call_limits import Lease, LimitsRecord
from tests.integration.conftest import Deployed
from tests.support.lambdas import load_event

TRIP = load_event("trip_booking_request.json")


def _hotels(deployed: Deployed) -> Any:
    function = deployed.fn("HotelsAgentFunction")
    with environment(function_environment(function.spec)):  # its cold start reads the function's environment
        return function.module.agent()


def test_the_hotels_agent_takes_its_units_in_the_shared_item_and_defers_when_another_instance_holds_them(
    deployed: Deployed,
) -> None:
    services = _hotels(deployed)
    limiter = services.runtime.limiter
    assert limiter is not None and limiter.limits.describe() == "5 in flight, 10/s (burst 10)"
    table = deployed.physical["IdempotencyTable"]
    store = DynamoDBLimitsStore(table, boto3.client("dynamodb"))
    # Given another instance holding all five units for the next 30 s
    now = deployed.clock.now()
    assert store.write("hotels", 0, LimitsRecord({"other": Lease(5, 5, now + 30)}, version=1)) is None
    # When a trip reaches its hotel step
    status, started = deployed.api("POST", "/workflows", TRIP, headers={"Idempotency-Key": "limited"})
    assert status == 201
    workflow_id = started["workflow_id"]
    deployed.driver("FlightsAgentFunction").deliver()
    deployed.driver("SchedulerFunction").deliver()
    deployed.driver("HotelsAgentFunction").deliver()
    deployed.driver("SchedulerFunction").deliver()
    # Then the hotel step is deferred without an attempt, its complete-by past the wait, the service not called
    step = _step(deployed, workflow_id, "book_hotel")
    assert (step["status"], step["attempt"], step["limit_deferrals"]) == ("PROCESSING", 1, 1)
    assert step["complete_by"] > now + 30
    assert deployed.remote["hotels"].service.effects() == {}
    record = store.read("hotels")
    # it is listed as waiting for one unit (its batch's one record), so the holder gives one back when it renews
    assert record.leases["other"].units == 5 and record.leases[limiter.holder] == Lease(0, 1, pytest.approx(now + 25))
    queue = deployed.queue_url("HotelsRequestQueue")
    waiting = boto3.client("sqs").get_queue_attributes(
        QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessagesDelayed"]
    )
    assert waiting["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"  # the same attempt, sent again later


def test_a_crashed_instances_lease_lapses_and_the_next_instance_takes_its_units(deployed: Deployed) -> None:
    limiter = _hotels(deployed).runtime.limiter
    store = DynamoDBLimitsStore(deployed.physical["IdempotencyTable"], boto3.client("dynamodb"))
    # Given an instance that held all five units and crashed: its lease ended 5 s ago (1 s past the guard)
    now = deployed.clock.now()
    assert store.write("hotels", 0, LimitsRecord({"crashed": Lease(5, 5, now - 5)}, version=1)) is None
    # When a trip reaches its hotel step
    status, started = deployed.api("POST", "/workflows", TRIP, headers={"Idempotency-Key": "lapsed"})
    assert status == 201
    deployed.driver("FlightsAgentFunction").deliver()
    deployed.driver("SchedulerFunction").deliver()
    deployed.driver("HotelsAgentFunction").deliver()
    # Then this instance takes a unit, all its batch of one needs (the lapsed lease is gone), and the hotel is booked,
    # on its first attempt
    record = store.read("hotels")
    assert set(record.leases) == {limiter.holder} and record.leases[limiter.holder].units == 1
    assert record.released_at == pytest.approx(now - 1)  # its units earn tokens from its lease's end and the guard
    assert len(deployed.remote["hotels"].service.effects()) == 1
    deployed.driver("SchedulerFunction").deliver()
    step = _step(deployed, started["workflow_id"], "book_hotel")
    assert (step["status"], step["attempt"], step["limit_deferrals"]) == ("COMPLETED", 1, 0)


def test_each_agent_role_allows_its_own_call_limits_item_only_when_it_declares_limits(deployed: Deployed) -> None:
    table = f"arn:aws:dynamodb:us-east-1:123456789012:table/{deployed.physical['IdempotencyTable']}"

    def allowed(function: str, key: str) -> bool:
        request = AuthRequest("dynamodb:UpdateItem", table, {"dynamodb:LeadingKeys": [key]})
        return evaluate(deployed.roles[function].statements, request).allowed

    assert allowed("HotelsAgentFunction", limits_key("hotels"))
    assert not allowed("HotelsAgentFunction", limits_key("flights"))
    assert not allowed("FlightsAgentFunction", limits_key("flights"))  # flights declares no limits


def _step(deployed: Deployed, workflow_id: str, name: str) -> dict[str, Any]:
    status, body = deployed.api("GET", f"/workflows/{workflow_id}")
    assert status == 200
    [step] = [s for s in body["steps"] if s["name"] == name]
    return step
