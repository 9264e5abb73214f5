"""System tier: the local stack from template.yaml over HTTP, with the sample services on loopback.

Each agent function runs one worker whose first reply is lost (the worker 'crashes' after its side effect), so the
first workflow needs exactly one supervisor resend per step. Time is real here; every wait is bounded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import urllib3

from devstack.stack import LocalStack
from devstack.template import remote_service_parameters
from http_server import RunningServer, serve_all
from tests.support.lambdas import ROOT

TERMINAL = {"COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED"}


class Api:
    def __init__(self, url: str) -> None:
        self.url = url
        self.http = urllib3.PoolManager()

    def post(self, path: str, body: Any, headers: dict[str, str] | None = None) -> tuple[int, Any]:
        response = self.http.request(
            "POST",
            self.url + path,
            body=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        return response.status, json.loads(response.data)

    def get(self, path: str) -> tuple[int, Any]:
        response = self.http.request("GET", self.url + path)
        return response.status, json.loads(response.data)

    def wait(self, workflow_id: str, timeout: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _, view = self.get(f"/workflows/{workflow_id}")
            if view["status"] in TERMINAL:
                return view  # type: ignore[no-any-return]
            time.sleep(0.2)
        raise AssertionError(f"{workflow_id} not terminal after {timeout} s: {view}")


def trip(**input_changes: Any) -> dict[str, Any]:
    request = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())
    for step in request["definition"]["steps"]:
        step["timeout_seconds"] = 5
        step["compensation"]["timeout_seconds"] = 5
        step["compensation"]["retry"] = {"max_attempts": 3, "backoff_base_seconds": 0.2, "backoff_cap_seconds": 0.5}
    request["definition"]["steps"][2]["input"]["simulate.$"] = "input.simulate"
    request["input"].update(input_changes)
    return request  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def system() -> Iterator[tuple[Api, dict[str, RunningServer]]]:
    servers = serve_all(rng_seed=5)
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "DeadlineGraceSeconds": "1",
        "MaxClockSkewSeconds": "0",
        "LogLevel": "WARNING",
    }
    extra_env = {
        "DEVSTACK_WORKER_INIT": "devstack.chaos:install",
        "DEVSTACK_CHAOS": json.dumps({"crash_first_reply": True, "seed": 1}),
    }
    try:
        with LocalStack(
            parameters=parameters,
            schedule_interval_seconds=0.5,
            extra_env=extra_env,
            max_workers_per_function=1,
            sqs_concurrency=1,
        ) as stack:
            yield Api(stack.api_url), servers
    finally:
        for server in servers.values():
            server.stop()


def test_lost_first_replies_are_resent_by_the_supervisor_and_effects_happen_once(
    system: tuple[Api, dict[str, RunningServer]],
) -> None:
    api, servers = system
    status, started = api.post("/workflows", trip(), {"Idempotency-Key": "system-first"})
    assert status == 201
    view = api.wait(started["workflow_id"])
    assert view["status"] == "COMPLETED"
    assert [(s["status"], s["attempt"], s["resends"]) for s in view["steps"]] == [("COMPLETED", 2, 1)] * 3
    for name in ("flights", "hotels", "payments"):
        assert list(servers[name].service.effects().values()) == [1]


def test_business_rejection_compensates_in_reverse_order_over_http(
    system: tuple[Api, dict[str, RunningServer]],
) -> None:
    api, servers = system
    status, started = api.post("/workflows", trip(simulate="reject"))
    assert status == 201
    view = api.wait(started["workflow_id"])
    assert view["status"] == "COMPENSATED"
    assert [s["status"] for s in view["steps"]] == ["COMPENSATED", "COMPENSATED", "FAILED"]
    assert view["steps"][2]["error"]["code"] == "CARD_DECLINED"
    flights = servers["flights"].service.compensations()
    hotels = servers["hotels"].service.compensations()
    assert sum(flights.values()) == 1 and sum(hotels.values()) == 1


def test_repeated_start_and_bad_input_over_http(system: tuple[Api, dict[str, RunningServer]]) -> None:
    api, _ = system
    first_status, first = api.post("/workflows", trip(), {"Idempotency-Key": "system-repeat"})
    again_status, again = api.post("/workflows", trip(), {"Idempotency-Key": "system-repeat"})
    assert (first_status, again_status) == (201, 200)
    assert first["workflow_id"] == again["workflow_id"]
    status, error = api.post("/workflows", {"definition": {"name": "x", "steps": []}})
    assert (status, error["error"]) == (422, "VALIDATION_ERROR")
    status, missing = api.get("/workflows/does-not-exist")
    assert (status, missing["error"]) == (404, "WORKFLOW_NOT_FOUND")
    status, spec = api.get("/openapi.json")
    assert status == 200 and "/workflows" in spec["paths"]
    api.wait(first["workflow_id"])
