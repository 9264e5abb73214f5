"""System tier: the local stack runs each function under its own role (devstack.iam): a map workflow completes with
every call checked, and with dynamodb:BatchGetItem taken out of the scheduler's role (as template.yaml was before it
was found) the map never ends and the run fails naming the missing statement."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from devstack.client import SignedHttp
from devstack.stack import LocalStack, RoleRefusalError
from devstack.template import remote_service_parameters
from http_server import RunningServer, serve_all

MAP = {
    "definition": {
        "name": "charge-orders",
        "steps": [
            {
                "name": "charge_all",
                "type": "map",
                "items": "input.orders",
                "definition": {
                    "name": "charge-one",
                    "steps": [
                        {"name": "charge", "agent": "payments", "action": "charge", "input": {"amount.$": "input.item"}}
                    ],
                },
            }
        ],
    },
    "input": {"orders": [5, 6, 7]},
}


@pytest.fixture(scope="module")
def services() -> Iterator[dict[str, str]]:
    servers: dict[str, RunningServer] = serve_all(rng_seed=5)
    try:
        yield {
            **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
            "LogLevel": "WARN",
        }
    finally:
        for server in servers.values():
            server.stop()


def run_map(stack: LocalStack, seconds: float) -> dict[str, Any]:
    api = SignedHttp(stack.api_url)
    status, started = api.post("/workflows", MAP)
    assert status == 201
    deadline = time.monotonic() + seconds
    while True:
        _, view = api.get(f"/workflows/{started['workflow_id']}")
        if view["status"] != "RUNNING" or time.monotonic() > deadline:
            return view  # type: ignore[no-any-return]
        time.sleep(0.2)


def test_a_map_workflow_completes_with_every_call_checked_against_the_functions_roles(services: dict[str, str]) -> None:
    with LocalStack(parameters=services, max_workers_per_function=1, sqs_concurrency=1) as stack:
        view = run_map(stack, 60)
        assert view["status"] == "COMPLETED"
        assert view["steps"][0]["output"]["succeeded"] == 3
        assert stack.role_refusals() == []


def test_without_batchgetitem_in_the_schedulers_role_the_map_never_ends_and_the_run_names_the_refusal(
    services: dict[str, str],
) -> None:
    stack = LocalStack(
        parameters=services,
        max_workers_per_function=1,
        sqs_concurrency=1,
        role_mutations={"SchedulerFunction": ["dynamodb:BatchGetItem"]},
    )
    with pytest.raises(RoleRefusalError) as failed, stack:
        view = run_map(stack, 12)
        assert view["status"] == "RUNNING"
        assert view["steps"][0]["children"]["ended"] == 3
    refused = {(r.function, r.action, r.resource) for r in failed.value.refusals}
    assert refused == {
        (
            "SchedulerFunction",
            "dynamodb:BatchGetItem",
            "arn:aws:dynamodb:us-east-1:123456789012:table/sasflow-StateTable",
        )
    }
    assert 'missing statement: {"Effect": "Allow", "Action": "dynamodb:BatchGetItem"' in str(failed.value)
