"""A schedule's ticks start workflows through the trigger function as template.yaml deploys it (its own queue, its
own role, every call checked against it), one per tick, however often the tick is delivered."""

from __future__ import annotations

import json
from typing import Any

import boto3

from tests.integration.conftest import Deployed
from tests.support.lambdas import ROOT

FUNCTION = "EveryMinuteTripTriggerFunction"
QUEUE = "EveryMinuteTripTriggerQueue"
DEAD_LETTERS = "EveryMinuteTripTriggerDeadLetterQueue"
TRIP = json.loads((ROOT / "definitions" / "trip-booking.json").read_text())


def tick(deployed: Deployed, at: str) -> None:
    # what EventBridge Scheduler sends: the template's target input with the tick's time
    boto3.client("sqs").send_message(QueueUrl=deployed.queue_url(QUEUE), MessageBody=json.dumps({"scheduled_time": at}))


def started(deployed: Deployed) -> list[dict[str, Any]]:
    """Every workflow in the table, as the operators read it."""
    ids = [item["pk"]["S"][3:] for item in deployed.items() if item["sk"]["S"] == "#WF"]
    return [deployed.ops("GET", f"/ops/workflows/{wid}")[1] for wid in ids]


def publish(deployed: Deployed) -> None:
    status, _ = deployed.api("PUT", "/definitions/trip-booking/versions/1", TRIP)
    assert status == 201


def test_a_tick_delivered_three_times_starts_one_workflow_of_the_trigger_that_completes(deployed: Deployed) -> None:
    publish(deployed)
    driver = deployed.driver(FUNCTION)
    # the same tick three times: a retried delivery of the scheduler, and one redelivered by SQS after a crash
    # between the start's write and the acknowledgement (the function ran, nothing was deleted)
    for _ in range(2):
        tick(deployed, "2026-12-06T09:00:00Z")
    driver.deliver()
    tick(deployed, "2026-12-06T09:00:00Z")
    crashed = driver.receive()
    assert len(crashed) == 1
    driver.function.invoke(_event(driver, crashed))
    sqs = boto3.client("sqs")
    sqs.change_message_visibility(
        QueueUrl=deployed.queue_url(QUEUE), ReceiptHandle=crashed[0]["ReceiptHandle"], VisibilityTimeout=0
    )
    assert driver.deliver() is not None
    assert deployed.depth(QUEUE) == 0
    deployed.pump()
    [workflow] = started(deployed)
    assert workflow["status"] == "COMPLETED"
    assert workflow["owner"] == "trigger:every-minute-trip"
    assert workflow["trigger"] == {"name": "every-minute-trip", "occurrence": "tick 2026-12-06T09:00:00Z"}
    assert workflow["input"]["booked_for"] == "2026-12-06T09:00:00Z"
    _, history = deployed.ops("GET", f"/ops/workflows/{workflow['workflow_id']}/history")
    first = history["events"][0]
    assert (first["kind"], first["detail"]) == (
        "started",
        {"trigger": "every-minute-trip", "occurrence": "tick 2026-12-06T09:00:00Z"},
    )
    # the next tick is another workflow
    tick(deployed, "2026-12-06T09:01:00Z")
    driver.deliver()
    assert len(started(deployed)) == 2
    # a client of the API does not see the trigger's workflows
    assert deployed.api("GET", f"/workflows/{workflow['workflow_id']}")[0] == 404


def test_a_tick_before_its_definition_is_published_waits_in_the_dead_letter_queue_then_starts_once(
    deployed: Deployed,
) -> None:
    tick(deployed, "2026-12-06T09:00:00Z")
    deployed.driver(FUNCTION).deliver()
    assert deployed.depth(QUEUE) == 0 and deployed.items() == []  # acknowledged, nothing half-started
    # the operator finds it, with its reason
    status, listing = deployed.ops("GET", "/ops/dead-letters", query=f"queue={DEAD_LETTERS}")
    assert status == 200
    [letter] = listing["queues"][0]["messages"]
    body = json.loads(letter["body"]) if "body" in letter else None
    assert letter["kind"] == "trigger.refused", letter
    assert "DEFINITION_NOT_REGISTERED" in json.dumps(letter)
    assert body is None or body["refused"]["trigger"] == "every-minute-trip"
    # publishes the definition and redrives: the tick starts its workflow, the same one a later delivery would
    publish(deployed)
    status, _ = deployed.ops("POST", "/ops/dead-letters/redrive", {"queue": DEAD_LETTERS, "reason": "published"})
    assert status == 202
    deployed.driver(FUNCTION).deliver()
    tick(deployed, "2026-12-06T09:00:00Z")
    deployed.driver(FUNCTION).deliver()
    [workflow] = started(deployed)
    assert workflow["trigger"]["occurrence"] == "tick 2026-12-06T09:00:00Z"


def _event(driver: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    from tests.support.lambdas import sqs_event

    return sqs_event(messages, driver.event.queue_arn)
