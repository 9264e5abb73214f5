"""System tier: triggers on sources that exist outside the stack, on the local stack, every call of their functions
checked against their roles. An sqs trigger on an existing queue (``queue`` and ``dead_letter_queue``): the local
stack stands in for it and its dead-letter queue; a message sent to it starts one workflow, a body that is not a
JSON object is refused into the existing dead-letter queue (listed by the operators), and a message sent while the
trigger is paused goes back to the existing queue to wait. An s3 trigger on an existing bucket (``bucket:
{parameter: ...}``): the local stack stands in for the bucket and configures its notifications as its owner would;
an upload under the trigger's prefix starts one workflow."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from typer.testing import CliRunner

import devstack.cli
from devstack.agents import AGENTS_FILE, TEMPLATE_FILE, load_agents, render_template
from devstack.cli import push_definitions
from devstack.stack import LocalStack
from devstack.template import remote_service_parameters
from devstack.triggers import load_triggers
from http_server import serve_all
from sasflow_cli.app import CliState, app
from sasflow_cli.targets import build_client
from tests.support.lambdas import ROOT
from tests.support.polling import wait_until

ORDERS = """
  orders:
    kind: sqs
    description: Books the trip each message of an existing queue asks for.
    definition: trip-booking
    queue: arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:orders
    dead_letter_queue: arn:${AWS::Partition}:sqs:${AWS::Region}:${AWS::AccountId}:orders-dlq
    batch_size: 5
  incoming:
    kind: s3
    description: Books a trip for each request uploaded to an existing bucket.
    definition: trip-booking
    bucket: {parameter: IncomingBucketName}
    prefix: trips/
    input:
      traveller.$: key
      route: LHR-JFK
      nights: 1
      amount: 100
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    # a copy of the project's template rendered with one more trigger (the code directories linked, as the template
    # names them relative to itself), its triggers.yaml beside it
    folder = tmp_path_factory.mktemp("existing-queue")
    declared = folder / "triggers.yaml"
    declared.write_text((AGENTS_FILE.parent / "triggers.yaml").read_text() + ORDERS)
    template = folder / "template.yaml"
    template.write_text(render_template(TEMPLATE_FILE.read_text(), load_agents(), load_triggers(declared)))
    for directory in ("functions", "layers"):
        (folder / directory).symlink_to(ROOT / directory, target_is_directory=True)
    servers = serve_all(rng_seed=11)
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "LogLevel": "WARN",
        "IncomingBucketName": "acme-incoming",
    }
    try:
        with LocalStack(template, parameters, max_workers_per_function=1, sqs_concurrency=1) as running:
            push_definitions(running.api_url)
            yield running
    finally:
        for server in servers.values():
            server.stop()


def sasflow(stack: LocalStack, *args: str) -> Any:
    state = CliState(client_=build_client(url=stack.api_url, stack=None, caller="operator"))
    result = CliRunner().invoke(app, [*args, "--json"], obj=state)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def devstack_command(stack: LocalStack, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """``python -m devstack ARGS`` (send, upload) against this stack; its output."""
    lock = devstack.cli.trigger_sources(stack)
    monkeypatch.setattr(devstack.cli, "read_running", lambda path: lock)
    result = CliRunner().invoke(devstack.cli.app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def send(stack: LocalStack, monkeypatch: pytest.MonkeyPatch, body: str) -> str:
    """``python -m devstack send --trigger orders --body BODY``: the message's id."""
    output = devstack_command(stack, monkeypatch, "send", "--trigger", "orders", "--body", body)
    assert "sent to orders" in output, output
    return output.split()[1]


def depth(stack: LocalStack, queue: str, attribute: str) -> int:
    sqs = boto3.client("sqs", endpoint_url=stack.endpoint_url, region_name=stack.region)
    url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    return int(sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[attribute])["Attributes"][attribute])


def test_a_message_to_the_existing_queue_starts_one_workflow_and_a_refused_one_reaches_its_dead_letter_queue(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    trip = {"traveller": "Radia", "route": "LHR-JFK", "nights": 1, "amount": 110}
    message_id = send(stack, monkeypatch, json.dumps(trip))
    [workflow] = wait_until(
        lambda: [w for w in sasflow(stack, "list", "--trigger", "orders")["workflows"] if w["status"] == "COMPLETED"]
    )
    view = sasflow(stack, "get", workflow["workflow_id"])
    assert (view["owner"], view["trigger"], view["input"]) == (
        "trigger:orders",
        {"name": "orders", "occurrence": f"message {message_id}"},
        trip,
    )
    [trigger] = [t for t in sasflow(stack, "triggers", "list")["triggers"] if t["name"] == "orders"]
    assert trigger["source"].endswith("/orders, batch 5")
    # a body that is no JSON object: refused, with its reason, into the existing queue's dead-letter queue
    send(stack, monkeypatch, "[1, 2]")
    [letter] = wait_until(
        lambda: sasflow(stack, "dlq", "list", "OrdersTriggerDeadLetterQueue")["queues"][0]["messages"]
    )
    assert letter["kind"] == "trigger.refused" and "JSON object" in letter["reason"], letter
    assert stack.role_refusals() == []


def test_a_message_sent_while_paused_goes_back_to_the_existing_queue_to_wait(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    sasflow(stack, "triggers", "pause", "orders", "--reason", "partner maintenance")
    before = len(sasflow(stack, "list", "--trigger", "orders")["workflows"])
    dead_before = depth(stack, "orders-dlq", "ApproximateNumberOfMessages")
    send(stack, monkeypatch, json.dumps({"traveller": "Lynn", "route": "CDG-NRT", "nights": 2, "amount": 90}))
    wait_until(lambda: depth(stack, "orders", "ApproximateNumberOfMessagesDelayed") == 1)
    assert len(sasflow(stack, "list", "--trigger", "orders")["workflows"]) == before
    assert depth(stack, "orders-dlq", "ApproximateNumberOfMessages") == dead_before
    assert stack.role_refusals() == []


def test_an_upload_to_the_existing_bucket_under_the_triggers_prefix_starts_one_workflow(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    output = devstack_command(stack, monkeypatch, "upload", "--trigger", "incoming", "--key", "trips/Ada Lovelace.json")
    assert output.startswith("uploaded acme-incoming/trips/Ada Lovelace.json"), output
    [workflow] = wait_until(
        lambda: [w for w in sasflow(stack, "list", "--trigger", "incoming")["workflows"] if w["status"] == "COMPLETED"]
    )
    view = sasflow(stack, "get", workflow["workflow_id"])
    assert view["input"]["traveller"] == "trips/Ada Lovelace.json"
    assert view["trigger"]["occurrence"].startswith("object acme-incoming/trips/Ada Lovelace.json version ")
    # the stand-in notifies the trigger's queue of its keys only
    s3 = boto3.client("s3", endpoint_url=stack.endpoint_url, region_name=stack.region)
    [configuration] = s3.get_bucket_notification_configuration(Bucket="acme-incoming")["QueueConfigurations"]
    assert configuration["QueueArn"].endswith(":sasflow-IncomingTriggerQueue")
    rules = configuration["Filter"]["Key"]["FilterRules"]
    assert [(rule["Name"].lower(), rule["Value"]) for rule in rules] == [("prefix", "trips/")]  # S3 says Prefix
    assert stack.role_refusals() == []
