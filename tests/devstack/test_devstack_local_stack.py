"""devstack.stack.LocalStack end to end on the tiny project: HTTP → function → SQS → function → DynamoDB."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.stack import LocalStack
from tests.support.polling import wait_until


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory, mini_project: Callable[[Path], Path]) -> Iterator[LocalStack]:
    root = tmp_path_factory.mktemp("mini")
    template = mini_project(root)
    stack = LocalStack(
        template,
        {"Greeting": "hello"},
        stack_name=f"mini{uuid.uuid4().hex[:6]}",
        log_dir=root / "logs",
        start_schedules=False,
        sqs_visibility_timeout_seconds=1,
    )
    with stack:
        yield stack


def test_http_request_flows_through_sqs_into_dynamodb(local: LocalStack) -> None:
    # Given an item posted to the HTTP API (the API function sends it to the work queue)
    status, body = http("POST", f"{local.api_url}/items", {"id": "item-1"})
    assert (status, body) == (202, {"id": "item-1"})

    # When the SQS event source mapping has run the worker, Then the item can be read back through the API
    found = wait_until(lambda: (lambda r: r if r[0] == 200 else None)(http("GET", f"{local.api_url}/items/item-1")))
    assert found == (200, {"id": "item-1", "greeting": "hello"})
    assert http("GET", f"{local.api_url}/items/missing") == (404, {"message": "no such item"})
    assert http("GET", f"{local.api_url}/nowhere") == (404, {"message": "Not Found"})


def test_a_failing_record_ends_in_the_dead_letter_queue(local: LocalStack) -> None:
    # Given a record the worker reports as a batch item failure every time
    sqs = local.client("sqs")
    sqs.send_message(QueueUrl=local.physical_ids["WorkQueue"], MessageBody=json.dumps({"id": "bad", "fail": True}))

    # Then after maxReceiveCount (2) deliveries it is in the dead-letter queue, not lost
    dlq = local.physical_ids["WorkDeadLetterQueue"]

    def dead_letters() -> list[dict[str, Any]]:
        return list(sqs.receive_message(QueueUrl=dlq, WaitTimeSeconds=0, VisibilityTimeout=60).get("Messages", []))

    moved = wait_until(dead_letters)
    assert [json.loads(message["Body"]) for message in moved] == [{"id": "bad", "fail": True}]


def test_fire_schedule_runs_the_scheduled_function(local: LocalStack) -> None:
    first = local.fire_schedule("TickFunction")
    second = local.fire_schedule("TickFunction", "Tick")
    assert (first.ok, first.payload, first.cold_start) == (True, {"runs": 1}, True)
    assert (second.payload, second.cold_start) == ({"runs": 2}, False)
    table = local.client("dynamodb")
    item = table.get_item(TableName=local.physical_ids["ItemsTable"], Key={"pk": {"S": "tick"}})["Item"]
    assert item["detail_type"] == {"S": "Scheduled Event"}
    with pytest.raises(KeyError):
        local.fire_schedule("ApiFunction")


def test_functions_sharing_a_module_get_their_own_environment(local: LocalStack) -> None:
    a = local.invoke("AgentAFunction", {})
    b = local.invoke("AgentBFunction", {})
    assert (a.payload["agent"], a.payload["greeting"], a.payload["memory"]) == ("a", "hello", 128)
    assert (b.payload["agent"], b.payload["greeting"], b.payload["memory"]) == ("b", "hello, b", 512)
    assert (a.payload["shards"], b.payload["memory_env"]) == ("4", "512")
    assert a.payload["pid"] != b.payload["pid"]
    assert a.payload["endpoint"] == b.payload["endpoint"] == local.endpoint_url
    assert a.payload["function_name"] == f"{local.stack_name}-AgentAFunction"


def test_outputs_point_at_the_local_stack(local: LocalStack) -> None:
    outputs = local.outputs
    assert outputs["ApiUrl"] == local.api_url
    assert outputs["WorkQueueUrl"] == f"{local.endpoint_url}/123456789012/{local.stack_name}-WorkQueue"
    assert "ExtraQueueUrl" not in outputs
    assert local.physical_ids["WorkQueue"] == outputs["WorkQueueUrl"]
    assert sorted(local.pools) == ["AgentAFunction", "AgentBFunction", "ApiFunction", "TickFunction", "WorkerFunction"]
    assert [poller.name for poller in local.pollers] == ["WorkerFunction.Work"]


def test_logs_are_per_function(local: LocalStack) -> None:
    local.invoke("AgentAFunction", {"marker": "only-a"})
    log_a = local.log_dir / "AgentAFunction.log"
    assert wait_until(lambda: "START RequestId" in log_a.read_text())
    assert Path(local.log_dir / "WorkerFunction.log").exists()
