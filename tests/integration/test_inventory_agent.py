"""The sample Python agent (functions/inventory, ``sasflow.python_agent.AgentApp``) through its real handler on
moto: the second sample workflow (definitions/order-fulfilment.json), and the failure-catalogue cases the HTTP agent
passes: duplicate delivery, an agent killed after its effect, the circuit breaker."""

from __future__ import annotations

import json
from typing import Any

import boto3
import pytest
from botocore.exceptions import ClientError

from devstack.inprocess import environment, function_environment
from sasflow.messages import decode_request, remote_token
from simulation.world import powertools_on_clock
from tests.integration.conftest import Deployed
from tests.integration.test_agent_wiring import LambdaKilled, _kill_on_idempotency_result
from tests.support.lambdas import ROOT, load_event
from tests.support.pipeline import FakeLambdaContext

ORDER = json.loads((ROOT / "definitions" / "order-fulfilment.json").read_text())
GRACE = 30
INITIAL_STOCK = 100  # the sample's default INITIAL_STOCK


def order(quantity: int = 3, amount: int = 30) -> dict[str, Any]:
    return {"definition": ORDER, "input": {"sku": "BOOK-1", "quantity": quantity, "amount": amount}}


def inventory(deployed: Deployed) -> Any:
    """The inventory agent's module, its services built (its cold start reads the function's environment)."""
    function = deployed.fn("InventoryAgentFunction")
    with environment(function_environment(function.spec)):
        function.module.app.services()
    return function.module


def stock(deployed: Deployed) -> int:
    module = inventory(deployed)
    with environment(function_environment(deployed.fn("InventoryAgentFunction").spec)):
        return int(module.stock("BOOK-1"))


def test_an_order_reserves_stock_and_completes(deployed: Deployed) -> None:
    status, started = deployed.api("POST", "/workflows", order(quantity=3))
    assert status == 201
    deployed.pump()
    _, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    assert view["status"] == "COMPLETED"
    [reserve] = [s for s in view["steps"] if s["name"] == "reserve_stock"]
    token = remote_token(started["workflow_id"], "reserve_stock", "reserve_stock")
    assert reserve["output"] == {"reservation": token, "sku": "BOOK-1", "quantity": 3}
    assert stock(deployed) == INITIAL_STOCK - 3


def test_out_of_stock_is_a_business_rejection_and_nothing_else_runs(deployed: Deployed) -> None:
    status, started = deployed.api("POST", "/workflows", order(quantity=INITIAL_STOCK + 1))
    assert status == 201
    deployed.pump()
    _, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    assert (view["status"], view["reason"]) == ("COMPENSATED", "step reserve_stock failed: OUT_OF_STOCK")
    assert deployed.remote["payments"].service.stats()["calls"] == 0
    assert stock(deployed) == INITIAL_STOCK


def test_a_declined_payment_releases_the_reservation(deployed: Deployed) -> None:
    deployed.remote["payments"].service.update_knobs({"rejection_rate": 1.0})
    status, started = deployed.api("POST", "/workflows", order(quantity=5))
    assert status == 201
    deployed.pump()
    _, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    assert view["status"] == "COMPENSATED"
    [reserve] = [s for s in view["steps"] if s["name"] == "reserve_stock"]
    assert reserve["status"] == "COMPENSATED"
    assert stock(deployed) == INITIAL_STOCK


def test_a_duplicate_delivery_reserves_once_and_both_replies_are_the_same(deployed: Deployed) -> None:
    deployed.api("POST", "/workflows", order(quantity=2))
    queue = deployed.queue_url("InventoryRequestQueue")
    sqs = boto3.client("sqs")
    [message] = sqs.receive_message(QueueUrl=queue, MaxNumberOfMessages=10)["Messages"]
    sqs.send_message(QueueUrl=queue, MessageBody=message["Body"])
    sqs.change_message_visibility(QueueUrl=queue, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0)
    driver = deployed.driver("InventoryAgentFunction")
    copies = driver.receive() + driver.receive()
    assert len(copies) == 2 and copies[0]["MessageId"] != copies[1]["MessageId"]
    assert driver.deliver([copies[0]]) == driver.deliver([copies[1]]) == {"batchItemFailures": []}
    replies = sqs.receive_message(QueueUrl=deployed.queue_url("ResponseQueue"), MaxNumberOfMessages=10)["Messages"]
    bodies = [json.loads(r["Body"]) for r in replies]
    assert len(bodies) == 2 and bodies[0] == bodies[1] and bodies[0]["outcome"] == "succeeded"
    assert stock(deployed) == INITIAL_STOCK - 2


def test_an_agent_killed_after_its_effect_is_resent_and_reserves_once(deployed: Deployed) -> None:
    with powertools_on_clock(deployed.clock):
        status, started = deployed.api("POST", "/workflows", order(quantity=4), headers={"Idempotency-Key": "k"})
        assert status == 201
        module = inventory(deployed)
        client = module.app.services().runtime.breaker.store.client
        killed = _kill_on_idempotency_result(client)
        with pytest.raises(LambdaKilled):
            deployed.driver("InventoryAgentFunction").deliver()
        client.meta.events.unregister("before-parameter-build.dynamodb.UpdateItem", unique_id="kill")
        assert len(killed) == 1
        assert stock(deployed) == INITIAL_STOCK - 4  # the effect happened before the kill
        deployed.clock.set(started["steps"][0]["complete_by"] + GRACE + 1)
        report = deployed.fn("SupervisorFunction").invoke(load_event("supervisor_scheduled.json"))
        assert report["messages"] == 1
        deployed.pump()
        _, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    assert view["status"] == "COMPLETED"
    assert [(s["name"], s["attempt"], s["resends"]) for s in view["steps"]] == [
        ("reserve_stock", 2, 1),
        ("charge_card", 1, 0),
    ]
    assert stock(deployed) == INITIAL_STOCK - 4  # the resend found its reservation: once


def test_transient_failures_open_the_shared_circuit_breaker_and_defer_the_attempt(deployed: Deployed) -> None:
    # Given the inventory's DynamoDB throttling every transaction (a transient failure of the action)
    deployed.api("POST", "/workflows", order(quantity=1))
    [message] = boto3.client("sqs").receive_message(QueueUrl=deployed.queue_url("InventoryRequestQueue"))["Messages"]
    request = decode_request(message["Body"])
    module = inventory(deployed)

    def throttled(**_: Any) -> None:
        raise ClientError({"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "TransactWriteItems")

    module.dynamodb().meta.events.register("before-call.dynamodb.TransactWriteItems", throttled, unique_id="throttle")
    services = module.app.services()
    services.idempotency_config.register_lambda_context(FakeLambdaContext(remaining_ms=60_000))
    runtime = services.runtime
    # When three attempts of the step are made (each may call 3 times, with backoff on the test's clock)
    with environment(function_environment(deployed.fn("InventoryAgentFunction").spec)):
        replies = [
            runtime.handle(request.model_copy(update={"attempt": attempt}), lambda: 60.0) for attempt in (1, 2, 3)
        ]
    module.dynamodb().meta.events.unregister("before-call.dynamodb.TransactWriteItems", unique_id="throttle")
    # Then the first failed after its 3 calls, the breaker opened at the 5th consecutive failure (the template's
    # BREAKER_FAILURE_THRESHOLD), and the third attempt was deferred without a call: the step is not used up
    assert [(r.outcome.value, r.calls) for r in replies] == [("failed", 3), ("deferred", 2), ("deferred", 0)]
    assert runtime.breaker.store.get("inventory").state == "open"
    assert stock(deployed) == INITIAL_STOCK
