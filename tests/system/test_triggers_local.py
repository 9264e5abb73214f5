"""System tier: the sample event trigger of triggers.yaml on the local stack (127.0.0.1 only), every call of its
function checked against its role: an event put on the default bus (by ``python -m devstack emit``, twice with one
id) starts one workflow, which completes and is listed by its trigger; an event trigger has no tick to run now."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import devstack.cli
from devstack.cli import push_definitions
from devstack.events import LocalRule
from devstack.stack import LocalStack
from devstack.template import remote_service_parameters
from http_server import serve_all
from sasflow_cli.app import CliState, app
from sasflow_cli.targets import build_client


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    servers = serve_all(rng_seed=5)
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "LogLevel": "WARN",
        "SampleTriggersState": "ENABLED",
    }
    try:
        with LocalStack(parameters=parameters, schedule_interval_seconds=0.5) as running:
            push_definitions(running.api_url)
            yield running
    finally:
        for server in servers.values():
            server.stop()


def running(stack: LocalStack, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Make ``python -m devstack`` find this stack as the lock of its `make up` describes it; that lock."""
    lock = devstack.cli.trigger_sources(stack)
    monkeypatch.setattr(devstack.cli, "read_running", lambda path: lock)
    return lock


def devstack_command(stack: LocalStack, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """``python -m devstack ARGS`` (emit, send, upload) against this stack; its output."""
    running(stack, monkeypatch)
    result = CliRunner().invoke(devstack.cli.app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def emit(stack: LocalStack, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    return devstack_command(stack, monkeypatch, "emit", *args)


def send(stack: LocalStack, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    return devstack_command(stack, monkeypatch, "send", *args)


def sasflow(stack: LocalStack, *args: str, exit_code: int = 0) -> Any:
    state = CliState(client_=build_client(url=stack.api_url, stack=None, caller="operator"))
    result = CliRunner().invoke(app, [*args, "--json"], obj=state)
    assert result.exit_code == exit_code, result.output
    return json.loads(result.stdout)


def test_an_event_put_twice_with_one_id_starts_one_workflow_that_completes(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    detail = json.dumps({"traveller": "Grace", "route": "CDG-NRT", "nights": 2, "amount": 240})
    event = ["--source", "sasflow.demo", "--detail-type", "TripRequested", "--detail", detail]
    detail_file = tmp_path / "detail.json"
    detail_file.write_text(detail)
    for source in (detail, f"@{detail_file}"):  # inline, and from a file
        event[-1] = source
        out = emit(stack, monkeypatch, *event, "--id", "evt-1")
        assert out.strip() == "event evt-1 put on bus default: TripRequestedRule"
    # another source matches no rule: nothing starts
    assert emit(
        stack, monkeypatch, "--source", "other.app", "--detail-type", "TripRequested", "--detail", detail
    ).endswith("no rule (nothing matched its pattern)\n")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = sasflow(stack, "list", "--trigger", "trip-requested")
        workflows = listed["workflows"]
        if workflows and all(w["status"] == "COMPLETED" for w in workflows):
            break
        time.sleep(0.2)
    [workflow] = workflows
    view = sasflow(stack, "get", workflow["workflow_id"])
    assert (view["owner"], view["trigger"]) == (
        "trigger:trip-requested",
        {"name": "trip-requested", "occurrence": "event evt-1"},
    )
    assert view["input"]["traveller"] == "Grace" and view["input"]["route"] == "CDG-NRT"
    # no tick to run now; the list shows its bus and pattern
    state = CliState(client_=build_client(url=stack.api_url, stack=None, caller="operator"))
    refused = CliRunner().invoke(app, ["triggers", "run-now", "trip-requested", "--reason", "try"], obj=state)
    assert refused.exit_code != 0, refused.output
    assert "TRIGGER_NOT_RUNNABLE" in refused.output and "devstack emit" in refused.output
    [trigger] = [t for t in sasflow(stack, "triggers", "list")["triggers"] if t["name"] == "trip-requested"]
    assert trigger["kind"] == "event" and trigger["source"].startswith('bus default: {"source":["sasflow.demo"]')


def test_emit_refuses_a_bus_the_stack_does_not_have_and_a_detail_that_is_not_an_object(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = {"endpoint_url": stack.endpoint_url, "region": stack.region, "event_rules": []}
    monkeypatch.setattr(devstack.cli, "read_running", lambda path: lock)
    runner = CliRunner()
    args = ["emit", "--source", "s", "--detail-type", "t"]
    wrong_bus = runner.invoke(devstack.cli.app, [*args, "--bus", "orders"])
    assert wrong_bus.exit_code == 2 and "no bus 'orders' in this stack; its buses: default" in wrong_bus.output
    not_object = runner.invoke(devstack.cli.app, [*args, "--detail", "[1]"])
    assert not_object.exit_code == 2 and "an event's detail is a JSON object" in not_object.output
    blank = runner.invoke(devstack.cli.app, [*args, "--id", " "])
    assert blank.exit_code == 2 and "an event's id is not blank" in blank.output
    missing = runner.invoke(devstack.cli.app, [*args, "--detail", "@no-such-file.json"])
    assert missing.exit_code == 2 and "cannot read no-such-file.json" in missing.output
    gone = {
        **lock,
        "endpoint_url": "http://127.0.0.1:9",
        "event_rules": [LocalRule.of(rule).document() for rule in stack.stack.event_rules()],
    }
    monkeypatch.setattr(devstack.cli, "read_running", lambda path: gone)
    stopped = runner.invoke(devstack.cli.app, ["emit", "--source", "sasflow.demo", "--detail-type", "TripRequested"])
    assert stopped.exit_code == 1 and "the local stack did not take the event" in stopped.output
    assert "Traceback" not in stopped.output
    monkeypatch.setattr(devstack.cli, "read_running", lambda path: None)
    down = runner.invoke(devstack.cli.app, args)
    assert down.exit_code == 1 and "no `make up` is running" in down.output


def test_a_message_sent_to_a_queue_trigger_starts_one_workflow_that_completes_and_is_listed_by_its_trigger(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    trip = json.dumps({"traveller": "Hedy", "route": "LHR-JFK", "nights": 1, "amount": 120})
    out = send(stack, monkeypatch, "--trigger", "trip-queue", "--body", trip, "--attribute", "source=test")
    assert out.startswith("message ") and "sent to sasflow-TripQueueTriggerQueue" in out
    message_id = out.split()[1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        workflows = sasflow(stack, "list", "--trigger", "trip-queue")["workflows"]
        if workflows and all(w["status"] == "COMPLETED" for w in workflows):
            break
        time.sleep(0.2)
    [workflow] = workflows
    view = sasflow(stack, "get", workflow["workflow_id"])
    assert (view["owner"], view["trigger"]) == (
        "trigger:trip-queue",
        {"name": "trip-queue", "occurrence": f"message {message_id}"},
    )
    assert view["input"] == json.loads(trip)
    [trigger] = [t for t in sasflow(stack, "triggers", "list")["triggers"] if t["name"] == "trip-queue"]
    assert trigger["kind"] == "sqs" and trigger["source"].endswith("sasflow-TripQueueTriggerQueue, batch 10")
    # no tick to run now
    state = CliState(client_=build_client(url=stack.api_url, stack=None, caller="operator"))
    refused = CliRunner().invoke(app, ["triggers", "run-now", "trip-queue", "--reason", "try"], obj=state)
    assert refused.exit_code != 0 and "devstack send" in refused.output, refused.output


def test_send_refuses_a_trigger_that_is_not_a_queue_and_an_attribute_without_a_value(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    running(stack, monkeypatch)
    runner = CliRunner()
    wrong = runner.invoke(devstack.cli.app, ["send", "--trigger", "trip-requested", "--body", "{}"])
    said = " ".join(wrong.output.replace("│", " ").split())  # as rich wrapped it in its box
    assert (
        wrong.exit_code == 2 and "no sqs trigger 'trip-requested' in this stack; its sqs triggers: trip-queue" in said
    )
    bare = runner.invoke(devstack.cli.app, ["send", "--trigger", "trip-queue", "--body", "{}", "--attribute", "x"])
    assert bare.exit_code == 2 and "an attribute is NAME=VALUE" in bare.output


def test_an_upload_starts_one_workflow_whose_input_has_its_key_decoded(
    stack: LocalStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    lock = running(stack, monkeypatch)
    key = "requests/Grace Hopper+1 ünï.json"
    output = devstack_command(stack, monkeypatch, "upload", "--trigger", "trip-uploads", "--key", key, "--body", "{}")
    assert output.startswith("uploaded ") and key in output
    deadline = time.monotonic() + 60
    workflows: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        workflows = sasflow(stack, "list", "--trigger", "trip-uploads")["workflows"]
        if workflows and all(w["status"] == "COMPLETED" for w in workflows):
            break
        time.sleep(0.2)
    [workflow] = workflows  # S3's test event, sent when make up configured the bucket, started nothing
    view = sasflow(stack, "get", workflow["workflow_id"])
    assert view["input"]["traveller"] == key
    assert view["trigger"]["occurrence"].startswith(
        f"object {lock['trigger_buckets']['trip-uploads']['bucket']}/{key} version "
    )
    # a key the trigger does not watch is refused before anything is uploaded
    outside = CliRunner().invoke(devstack.cli.app, ["upload", "--trigger", "trip-uploads", "--key", "notes.txt"])
    assert outside.exit_code == 2 and "S3 would not notify it" in " ".join(outside.output.replace("│", " ").split())
