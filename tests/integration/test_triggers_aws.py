"""A schedule's ticks start workflows through the trigger function as template.yaml deploys it (its own queue, its
own role, every call checked against it), one per tick, however often the tick is delivered."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from devstack.agents import AGENTS_FILE, TEMPLATE_FILE, load_agents, render_template
from devstack.moto_sqs import install as install_sqs_redrive
from devstack.provision import provision
from devstack.template import Stack, load_template, remote_service_parameters
from devstack.triggers import load_triggers, triggers_file
from http_server import RunningServer
from sasflow.triggers import iso_utc
from tests.integration.conftest import Deployed, roles_checked
from tests.support.lambdas import ROOT

FUNCTION = "EveryMinuteTripTriggerFunction"
QUEUE = "EveryMinuteTripTriggerQueue"
DEAD_LETTERS = "EveryMinuteTripTriggerDeadLetterQueue"
TRIP = json.loads((ROOT / "definitions" / "trip-booking.json").read_text())


def tick(deployed: Deployed, at: str) -> None:
    # what EventBridge Scheduler sends: the template's target input with the tick's time
    boto3.client("sqs").send_message(QueueUrl=deployed.queue_url(QUEUE), MessageBody=json.dumps({"scheduled_time": at}))


def minute(deployed: Deployed, offset: int = 0) -> str:
    """A tick's time: the test clock's minute when the test first asked, ``offset`` minutes on (within the sample's
    15-minute catch-up, whatever the clock did meanwhile)."""
    now = int(deployed.clock.now())
    first = int(vars(deployed).setdefault("first_minute", now - now % 60))
    return iso_utc(first + 60 * offset)


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
        tick(deployed, minute(deployed))
    driver.deliver()
    tick(deployed, minute(deployed))
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
    assert workflow["trigger"] == {"name": "every-minute-trip", "occurrence": f"tick {minute(deployed)}"}
    assert workflow["input"]["booked_for"] == minute(deployed)
    _, history = deployed.ops("GET", f"/ops/workflows/{workflow['workflow_id']}/history")
    first = history["events"][0]
    assert (first["kind"], first["detail"]) == (
        "started",
        {"trigger": "every-minute-trip", "occurrence": f"tick {minute(deployed)}"},
    )
    # the next tick is another workflow
    tick(deployed, minute(deployed, 1))
    driver.deliver()
    assert len(started(deployed)) == 2
    # a client of the API does not see the trigger's workflows
    assert deployed.api("GET", f"/workflows/{workflow['workflow_id']}")[0] == 404


def test_a_tick_before_its_definition_is_published_waits_in_the_dead_letter_queue_then_starts_once(
    deployed: Deployed,
) -> None:
    tick(deployed, minute(deployed))
    deployed.driver(FUNCTION).deliver()
    assert deployed.depth(QUEUE) == 0 and deployed.items() == []  # acknowledged, nothing half-started
    # the operator finds it, with its reason
    status, listing = deployed.ops("GET", "/ops/dead-letters", query=f"queue={DEAD_LETTERS}")
    assert status == 200
    [letter] = listing["queues"][0]["messages"]
    body = json.loads(letter["body"]) if "body" in letter else None
    assert letter["kind"] == "trigger.refused", letter
    assert letter["reason"].startswith(f"tick {minute(deployed)}: DEFINITION_NOT_REGISTERED"), letter
    assert body is None or body["refused"]["trigger"] == "every-minute-trip"
    # publishes the definition and redrives: the tick starts its workflow, the same one a later delivery would
    publish(deployed)
    status, _ = deployed.ops("POST", "/ops/dead-letters/redrive", {"queue": DEAD_LETTERS, "reason": "published"})
    assert status == 202
    deployed.driver(FUNCTION).deliver()
    tick(deployed, minute(deployed))
    deployed.driver(FUNCTION).deliver()
    [workflow] = started(deployed)
    assert workflow["trigger"]["occurrence"] == f"tick {minute(deployed)}"


def handled_then_lost(driver: Any, queue_url: str, received: list[dict[str, Any]]) -> None:
    """The function handles ``received`` and dies before their acknowledgement: SQS delivers them again, and every
    delivery is then handled until the queue is empty."""
    driver.function.invoke(_event(driver, received))
    for message in received:
        boto3.client("sqs").change_message_visibility(
            QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
        )
    while driver.deliver() is not None:
        pass


def _event(driver: Any, messages: list[dict[str, Any]]) -> dict[str, Any]:
    from tests.support.lambdas import sqs_event

    return sqs_event(messages, driver.event.queue_arn)


def test_an_operator_pauses_runs_now_and_resumes_a_trigger_and_lists_what_it_started(deployed: Deployed) -> None:
    publish(deployed)
    driver = deployed.driver(FUNCTION)
    status, listing = deployed.ops("GET", "/ops/triggers")
    assert status == 200
    assert [t["name"] for t in listing["triggers"]] == [
        "every-minute-trip",
        "trip-queue",
        "trip-requested",
        "trip-uploads",
    ]
    trigger = listing["triggers"][0]
    assert trigger == {
        "name": "every-minute-trip",
        "kind": "schedule",
        "definition": "trip-booking",
        "source": "rate(1 minute) UTC, catch-up 15m, overlap allow",
        "principal": "trigger:every-minute-trip",
        "paused": False,
        "paused_by": None,
        "paused_at": None,
        "pause_reason": None,
        "skipped": 0,
        "missed": 0,
        "buffered": 0,
        "held": 0,
        "running": None,
        "waiting": None,
    }
    # paused: who and why are kept, and a tick is skipped and counted
    status, paused = deployed.ops("POST", "/ops/triggers/every-minute-trip/pause", {"reason": "flights migration"})
    assert status == 200 and paused["paused"] and paused["pause_reason"] == "flights migration"
    assert paused["paused_by"].startswith("arn:aws:")
    tick(deployed, minute(deployed))
    driver.deliver()
    assert started(deployed) == [] and deployed.depth(QUEUE) == 0
    assert deployed.ops("GET", "/ops/triggers")[1]["triggers"][0]["skipped"] == 1
    # run now, twice with one Idempotency-Key: one occurrence, its workflow id known at once, started while paused
    key = {"Idempotency-Key": "run-now-1"}
    status, ran = deployed.ops("POST", "/ops/triggers/every-minute-trip/run-now", {"reason": "test"}, headers=key)
    assert status == 202 and ran["occurrence"].startswith("run-now run-now-1 by arn:aws:")
    again = deployed.ops("POST", "/ops/triggers/every-minute-trip/run-now", {"reason": "test"}, headers=key)[1]
    assert again["workflow_id"] == ran["workflow_id"]
    driver.deliver()
    deployed.pump()
    [workflow] = started(deployed)
    assert workflow["workflow_id"] == ran["workflow_id"] and workflow["status"] == "COMPLETED"
    # resumed: the next tick starts
    status, resumed = deployed.ops("POST", "/ops/triggers/every-minute-trip/resume", {"reason": "done"})
    assert status == 200 and not resumed["paused"] and resumed["skipped"] == 1
    deployed.clock.advance(5)
    tick(deployed, minute(deployed, 2))
    driver.deliver()
    # the trigger index lists both, newest first, in any status
    status, page = deployed.ops("GET", "/ops/workflows", query="trigger=every-minute-trip")
    assert status == 200 and page["source"] == "trigger index"
    ids = [w["workflow_id"] for w in page["workflows"]]
    assert len(ids) == 2 and ids[1] == ran["workflow_id"]
    assert [w["trigger"] for w in page["workflows"]] == ["every-minute-trip"] * 2
    status, page = deployed.ops("GET", "/ops/workflows", query="trigger=every-minute-trip&status=COMPLETED")
    assert [w["workflow_id"] for w in page["workflows"]] == [ran["workflow_id"]]
    # an unknown trigger, an unknown action, no reason
    status, body = deployed.ops("POST", "/ops/triggers/nightly/pause", {"reason": "x"})
    assert (status, body["error"]) == (404, "TRIGGER_NOT_FOUND") and "every-minute-trip" in body["message"]
    assert deployed.ops("POST", "/ops/triggers/every-minute-trip/stop", {"reason": "x"})[0] == 422
    assert deployed.ops("POST", "/ops/triggers/every-minute-trip/pause", {})[0] == 422


def test_the_cli_lists_pauses_runs_now_and_resumes_a_trigger_and_lists_what_it_started(deployed: Deployed) -> None:
    from tests.integration.test_cli import cli

    publish(deployed)
    listed = cli(deployed, "triggers", "list")["triggers"][0]
    assert (listed["name"], listed["paused"], listed["source"]) == (
        "every-minute-trip",
        False,
        "rate(1 minute) UTC, catch-up 15m, overlap allow",
    )
    paused = cli(deployed, "triggers", "pause", "every-minute-trip", "--reason", "migration")
    assert paused["paused"] and paused["pause_reason"] == "migration"
    ran = cli(deployed, "triggers", "run-now", "every-minute-trip", "--reason", "check", "--idempotency-key", "k1")
    deployed.driver(FUNCTION).deliver()
    resumed = cli(deployed, "triggers", "resume", "every-minute-trip", "--reason", "done")
    assert not resumed["paused"]
    page = cli(deployed, "list", "--trigger", "every-minute-trip")
    assert [w["workflow_id"] for w in page["workflows"]] == [ran["workflow_id"]]
    assert page["source"] == "trigger index"


def test_bad_operator_requests_on_triggers_are_refused_with_their_cause(deployed: Deployed) -> None:
    # Found by the trial: an empty trigger was a 500, an unknown one an empty page, a blank reason was kept, and a
    # second pause replaced the first one's who, when and why
    status, body = deployed.ops("GET", "/ops/workflows", query="trigger=")
    assert (status, body["error"]) == (422, "VALIDATION_ERROR")
    status, body = deployed.ops("GET", "/ops/workflows", query="trigger=nightly")
    assert (status, body["error"]) == (404, "TRIGGER_NOT_FOUND") and "every-minute-trip" in body["message"]
    for reason in ("   ", "line\nbreak", "\x1b[31mred"):
        status, body = deployed.ops("POST", "/ops/triggers/every-minute-trip/pause", {"reason": reason})
        assert (status, body["error"]) == (422, "VALIDATION_ERROR"), reason
    assert deployed.ops("POST", "/ops/triggers/every-minute-trip/pause", {"reason": "migration"})[0] == 200
    again = deployed.ops("POST", "/ops/triggers/every-minute-trip/pause", {"reason": "migration"})
    assert again[0] == 200 and again[1]["pause_reason"] == "migration"  # the same pause again: kept as it is
    status, body = deployed.ops("POST", "/ops/triggers/every-minute-trip/pause", {"reason": "another"})
    assert (status, body["error"]) == (409, "TRIGGER_ALREADY_PAUSED")
    assert "'migration'" in body["message"] and "resume it first" in body["message"]
    assert deployed.ops("GET", "/ops/triggers")[1]["triggers"][0]["pause_reason"] == "migration"


def test_the_cli_refuses_a_key_or_a_trigger_it_cannot_send(deployed: Deployed) -> None:
    from typer.testing import CliRunner

    from sasflow_cli.app import CliState, app

    def run(*args: str) -> Any:
        return CliRunner().invoke(app, list(args), obj=CliState(client_=None, now=deployed.clock.now))

    for key in ("", "ключ", "two words", "a" * 129):
        result = run("triggers", "run-now", "every-minute-trip", "--reason", "x", "--idempotency-key", key)
        assert result.exit_code == 2 and "1 to 128 characters" in result.output, key
    for name in ("", "Every", "no_such"):
        result = run("triggers", "pause", name, "--reason", "x")
        assert result.exit_code == 2 and "a trigger's name as in triggers.yaml" in result.output, name
    result = run("list", "--trigger", "")
    assert result.exit_code == 2 and "a trigger's name" in result.output


HOURLY = """\
  hourly-trip:
    kind: schedule
    definition: trip-booking
    expression: rate(1 hour)
    overlap: buffer_one
    input:
      traveller: Hourly traveller
      route: LHR-JFK
      nights: 1
      amount: 100
      booked_for.$: scheduled_time
"""


@pytest.fixture
def slotted(remote: dict[str, RunningServer], tmp_path: Path) -> Iterator[Deployed]:
    """The repository's template with one more trigger, overlap buffer_one, deployed with every role checked."""
    declared = tmp_path / "triggers.yaml"
    declared.write_text(triggers_file(AGENTS_FILE).read_text() + HOURLY)
    template = tmp_path / "template.yaml"
    template.write_text(render_template(TEMPLATE_FILE.read_text(), load_agents(), load_triggers(declared)))
    with mock_aws():
        install_sqs_redrive()
        parameters = remote_service_parameters({name: server.base_url for name, server in remote.items()})
        stack = Stack(load_template(template), template_dir=TEMPLATE_FILE.parent, parameters=parameters)
        with roles_checked(stack) as roles:
            yield Deployed(stack, provision(stack), remote, roles=roles)


def test_buffer_one_keeps_one_tick_waiting_and_the_run_s_end_starts_it_under_every_role(slotted: Deployed) -> None:
    publish(slotted)
    driver = slotted.driver("HourlyTripTriggerFunction")
    queue = slotted.queue_url("HourlyTripTriggerQueue")
    sqs = boto3.client("sqs")
    hours = [minute(slotted, 60 * n) for n in range(3)]
    for at in hours:  # three ticks before the first run has ended: one starts, one waits, one is skipped
        sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"scheduled_time": at}))
        driver.deliver()
    [first] = started(slotted)
    [trigger] = [t for t in slotted.ops("GET", "/ops/triggers")[1]["triggers"] if t["name"] == "hourly-trip"]
    assert (trigger["running"], trigger["waiting"]) == (first["workflow_id"], f"tick {hours[1]}")
    assert (trigger["buffered"], trigger["skipped"], trigger["source"].endswith("overlap buffer_one")) == (1, 1, True)
    # the run ends (the scheduler's function, its role): it gives the slot back and sends the waiting tick
    slotted.pump()
    assert slotted.depth("HourlyTripTriggerQueue") == 1
    driver.deliver()
    slotted.pump()
    runs = sorted(started(slotted), key=lambda w: w["trigger"]["occurrence"])
    assert [w["trigger"]["occurrence"] for w in runs] == [f"tick {hours[0]}", f"tick {hours[1]}"]
    assert [w["status"] for w in runs] == ["COMPLETED", "COMPLETED"]
    [trigger] = [t for t in slotted.ops("GET", "/ops/triggers")[1]["triggers"] if t["name"] == "hourly-trip"]
    assert (trigger["running"], trigger["waiting"]) == (None, None)


def test_an_event_delivered_again_after_a_crash_starts_one_workflow_that_completes(deployed: Deployed) -> None:
    from devstack.events import envelope

    publish(deployed)
    driver = deployed.driver("TripRequestedTriggerFunction")
    queue = deployed.queue_url("TripRequestedTriggerQueue")
    detail = {"traveller": "Grace", "route": "CDG-NRT", "nights": 2, "amount": 240}
    event = json.dumps(envelope("sasflow.demo", "TripRequested", detail, region="us-east-1", event_id="evt-7"))
    sqs = boto3.client("sqs")
    # what the rule sends (the event as it is), twice; and a run whose acknowledgement was lost
    sqs.send_message(QueueUrl=queue, MessageBody=event)
    sqs.send_message(QueueUrl=queue, MessageBody=event)
    crashed = driver.receive()
    handled_then_lost(driver, queue, crashed)
    assert deployed.depth("TripRequestedTriggerQueue") == 0
    deployed.pump()
    [workflow] = started(deployed)
    assert (workflow["status"], workflow["owner"]) == ("COMPLETED", "trigger:trip-requested")
    assert workflow["trigger"] == {"name": "trip-requested", "occurrence": "event evt-7"}
    assert workflow["input"] == {**detail, "booked_for": json.loads(event)["time"]}
    # an event trigger has no tick to run now
    status, body = deployed.ops("POST", "/ops/triggers/trip-requested/run-now", {"reason": "try"})
    assert (status, body["error"]) == (409, "TRIGGER_NOT_RUNNABLE")
    # what is not an event goes to its dead-letter queue with its reason
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({"scheduled_time": "2027-01-15T08:00:00Z"}))
    driver.deliver()
    status, listing = deployed.ops("GET", "/ops/dead-letters", query="queue=TripRequestedTriggerDeadLetterQueue")
    [letter] = listing["queues"][0]["messages"]
    assert letter["kind"] == "trigger.refused"
    # found by the trial: the reason says which message it is, so two refusals can be told apart
    assert letter["reason"].startswith("tick 2027-01-15T08:00:00Z: MALFORMED_OCCURRENCE: trigger trip-requested")


def test_a_message_delivered_again_after_a_crash_starts_one_workflow_and_a_paused_trigger_keeps_them_waiting(
    deployed: Deployed,
) -> None:
    publish(deployed)
    driver = deployed.driver("TripQueueTriggerFunction")
    queue = deployed.queue_url("TripQueueTriggerQueue")
    trip = {"traveller": "Grace", "route": "CDG-NRT", "nights": 2, "amount": 240}
    sqs = boto3.client("sqs")
    # one message, and a run whose acknowledgement was lost: SQS delivers it again, with its id
    sent = sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(trip))["MessageId"]
    crashed = driver.receive()
    handled_then_lost(driver, queue, crashed)
    assert deployed.depth("TripQueueTriggerQueue") == 0
    deployed.pump()
    [workflow] = started(deployed)
    assert (workflow["status"], workflow["owner"]) == ("COMPLETED", "trigger:trip-queue")
    assert workflow["trigger"] == {"name": "trip-queue", "occurrence": f"message {sent}"}
    assert workflow["input"] == trip
    # the same body in another message is another workflow
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps(trip))
    driver.deliver()
    assert len(started(deployed)) == 2
    # a queue trigger has no tick to run now
    status, body = deployed.ops("POST", "/ops/triggers/trip-queue/run-now", {"reason": "try"})
    assert (status, body["error"]) == (409, "TRIGGER_NOT_RUNNABLE") and "send a message to the queue" in body["message"]
    # paused, a message waits in its queue (sent back, delayed, by the function's own role), and starts after resume
    assert deployed.ops("POST", "/ops/triggers/trip-queue/pause", {"reason": "migration"})[0] == 200
    sqs.send_message(QueueUrl=queue, MessageBody=json.dumps({**trip, "traveller": "Ada"}))
    driver.deliver()
    assert len(started(deployed)) == 2  # (tests/unit/test_queue_triggers.py starts it after the resume)
    attributes = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessagesDelayed"])
    assert attributes["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"
    assert deployed.ops("POST", "/ops/triggers/trip-queue/resume", {"reason": "done"})[0] == 200
    _, listing = deployed.ops("GET", "/ops/triggers")
    [mine] = [t for t in listing["triggers"] if t["name"] == "trip-queue"]
    assert mine["kind"] == "sqs" and mine["source"] == f"queue {queue}, batch 10" and mine["skipped"] == 0
    # what is not an object goes to its dead-letter queue with its reason, naming the message
    refused = sqs.send_message(QueueUrl=queue, MessageBody="not json")["MessageId"]
    driver.deliver()
    status, listing = deployed.ops("GET", "/ops/dead-letters", query="queue=TripQueueTriggerDeadLetterQueue")
    [letter] = listing["queues"][0]["messages"]
    assert letter["kind"] == "trigger.refused"
    assert letter["reason"].startswith(f"message {refused}: INVALID_INPUT: triggers[trip-queue].input: the message")


def test_an_upload_starts_one_workflow_however_often_its_notification_comes_and_s3s_test_event_none(
    deployed: Deployed,
) -> None:
    publish(deployed)
    driver = deployed.driver("TripUploadsTriggerFunction")
    queue = deployed.queue_url("TripUploadsTriggerQueue")
    bucket = deployed.stack.physical_id("TripRequestsBucket")
    sqs, s3 = boto3.client("sqs"), boto3.client("s3")
    # provisioning configured the notification: S3 sent its test event, which starts nothing and is no refusal
    assert driver.deliver() is not None
    assert started(deployed) == [] and deployed.depth("TripUploadsTriggerDeadLetterQueue") == 0
    # an upload whose key S3 URL-encodes (a space, a plus, unicode, a percent); its notification handled, then the
    # same notification again after a crash before the acknowledgement
    key = "requests/Ada Lovelace+1 été 50%.json"
    version = s3.put_object(Bucket=bucket, Key=key, Body=b'{"trip": 1}')["VersionId"]
    crashed = driver.receive()
    assert len(crashed) == 1 and "Ada+Lovelace%2B1" in crashed[0]["Body"]  # as S3 sends it
    handled_then_lost(driver, queue, crashed)
    # a key outside the trigger's prefix and suffix starts nothing: S3 sends no notification of it
    s3.put_object(Bucket=bucket, Key="elsewhere/notes.txt", Body=b"x")
    assert driver.deliver() is None
    deployed.pump()
    [workflow] = started(deployed)
    assert (workflow["status"], workflow["owner"]) == ("COMPLETED", "trigger:trip-uploads")
    assert workflow["trigger"] == {"name": "trip-uploads", "occurrence": f"object {bucket}/{key} version {version}"}
    assert workflow["input"]["traveller"] == key
    # the same key uploaded again: another version, another workflow
    s3.put_object(Bucket=bucket, Key=key, Body=b'{"trip": 2}')
    driver.deliver()
    assert len(started(deployed)) == 2
    # no tick to run now
    status, body = deployed.ops("POST", "/ops/triggers/trip-uploads/run-now", {"reason": "try"})
    assert (status, body["error"]) == (409, "TRIGGER_NOT_RUNNABLE") and "upload an object" in body["message"]
    # paused: an upload waits (sent back, delayed, by the function's own role)
    assert deployed.ops("POST", "/ops/triggers/trip-uploads/pause", {"reason": "migration"})[0] == 200
    s3.put_object(Bucket=bucket, Key="requests/later.json", Body=b"{}")
    driver.deliver()
    assert len(started(deployed)) == 2
    attributes = sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["ApproximateNumberOfMessagesDelayed"])
    assert attributes["Attributes"]["ApproximateNumberOfMessagesDelayed"] == "1"
    _, listing = deployed.ops("GET", "/ops/triggers")
    [mine] = [t for t in listing["triggers"] if t["name"] == "trip-uploads"]
    assert mine["kind"] == "s3" and mine["source"] == f"bucket {bucket}, keys requests/*.json, batch 10"
