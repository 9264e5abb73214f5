"""System tier: definitions published as `make up` does, a wait resumed by its own timer, an approval answered
with the CLI's request, on the local stack from template.yaml over HTTP (real time: every wait is bounded).

The wait here is 12 s, not the issue's 90 s, to keep `make test` short; the mechanism is the same for any wait of
900 s or less (one SQS message delayed until the wait's time), and the supervisor's schedule runs every 3 s.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from devstack.cli import push_definitions
from devstack.client import SignedHttp
from devstack.stack import LocalStack
from devstack.template import remote_service_parameters
from http_server import RunningServer, serve_all

TICK_SECONDS = 3.0
WAIT_SECONDS = 12


@pytest.fixture(scope="module")
def local() -> Iterator[tuple[LocalStack, SignedHttp]]:
    servers: dict[str, RunningServer] = serve_all(rng_seed=3)
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "DeadlineGraceSeconds": "6",
        "MaxClockSkewSeconds": "0",
        "LogLevel": "WARN",
    }
    try:
        with LocalStack(
            parameters=parameters, schedule_interval_seconds=TICK_SECONDS, max_workers_per_function=1, sqs_concurrency=1
        ) as stack:
            yield stack, SignedHttp(stack.api_url)
    finally:
        for server in servers.values():
            server.stop()


def wait_for(api: SignedHttp, workflow_id: str, done: Any, timeout: float = 60.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, view = api.get(f"/workflows/{workflow_id}")
        if done(view):
            return view  # type: ignore[no-any-return]
        time.sleep(0.2)
    raise AssertionError(f"{workflow_id}: not there after {timeout} s: {view}")


def test_make_up_publishes_the_definitions_and_a_start_by_name_completes(local: tuple[LocalStack, SignedHttp]) -> None:
    stack, api = local
    assert [line.split("  ")[0] for line in push_definitions(stack.api_url)] == [
        "order-fulfilment v1: published",
        "trip-booking v1: published",
    ]
    assert [line.split("  ")[0] for line in push_definitions(stack.api_url)] == [
        "order-fulfilment v1: unchanged",
        "trip-booking v1: unchanged",
    ]
    status, view = api.post(
        "/workflows",
        {
            "definition": {"name": "trip-booking"},
            "input": {"traveller": "Ada", "route": "LHR-JFK", "nights": 1, "amount": 10},
        },
    )
    assert (status, view["definition_name"]) == (201, "trip-booking")
    assert wait_for(api, view["workflow_id"], lambda v: v["status"] == "COMPLETED")["status"] == "COMPLETED"
    # and the second sample workflow runs through the Python inventory agent
    order = {"definition": {"name": "order-fulfilment"}, "input": {"sku": "BOOK-1", "quantity": 2, "amount": 30}}
    status, view = api.post("/workflows", order)
    assert status == 201
    done = wait_for(api, view["workflow_id"], lambda v: v["status"] == "COMPLETED")
    assert [s["status"] for s in done["steps"]] == ["COMPLETED", "COMPLETED"]


def test_a_wait_is_resumed_at_its_time_and_nothing_runs_while_it_waits(local: tuple[LocalStack, SignedHttp]) -> None:
    stack, api = local
    definition = {
        "name": "wait-then-fly",
        "steps": [
            {"name": "cool_off", "type": "wait", "seconds": WAIT_SECONDS},
            {
                "name": "reserve_flight",
                "agent": "flights",
                "action": "reserve",
                "input": {"traveller.$": "input.traveller", "route.$": "input.route"},
            },
        ],
    }
    engine = ("SchedulerFunction", "FlightsAgentFunction", "HotelsAgentFunction", "PaymentsAgentFunction")
    status, view = api.post("/workflows", {"definition": definition, "input": {"traveller": "Ada", "route": "X"}})
    assert status == 201
    workflow_id = view["workflow_id"]
    [wait] = [s for s in view["steps"] if s["name"] == "cool_off"]
    due = wait["complete_by"]
    before = {name: stack.pools[name].invocation_count() for name in engine}
    # While it waits (until a second before its time), no engine function runs for it: only the supervisor's ticks
    time.sleep(max(0.0, due - time.time() - 1))
    assert {name: stack.pools[name].invocation_count() for name in engine} == before
    # Then it is resumed at its time (never before), within one supervisor tick, and the flight runs
    done = wait_for(api, workflow_id, lambda v: v["status"] == "COMPLETED", timeout=30)
    _, history = api.get(f"/workflows/{workflow_id}/history")
    [resumed] = [e for e in history["events"] if e["kind"] == "resumed"]
    assert due <= resumed["time"] <= due + TICK_SECONDS
    assert [s["status"] for s in done["steps"]] == ["COMPLETED", "COMPLETED"]


def test_an_approval_answered_over_http_completes_the_trip(local: tuple[LocalStack, SignedHttp]) -> None:
    _, api = local
    definition = {
        "name": "approved-flight",
        "steps": [
            {"name": "approval", "type": "callback", "timeout_seconds": 120},
            {
                "name": "reserve_flight",
                "agent": "flights",
                "action": "reserve",
                "input": {"traveller.$": "input.traveller", "route.$": "input.route"},
            },
        ],
    }
    status, view = api.post("/workflows", {"definition": definition, "input": {"traveller": "Ada", "route": "X"}})
    assert status == 201
    [approval] = [s for s in view["steps"] if s["name"] == "approval"]
    token = approval["task_token"]
    status, answered = api.post(f"/callbacks/{token}", {"status": "succeeded", "output": {"by": "ada"}})
    assert (status, answered["step_status"]) == (200, "COMPLETED")
    assert api.post(f"/callbacks/{token}", {"status": "succeeded"})[0] == 409
    assert api.post(f"/callbacks/{token}", {"status": "succeeded"}, caller="client-b")[0] == 404
    assert wait_for(api, view["workflow_id"], lambda v: v["status"] == "COMPLETED")["status"] == "COMPLETED"
