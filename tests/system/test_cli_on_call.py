"""System tier: the on-call story through the sasflow CLI, over HTTP, on the local stack (127.0.0.1 only).

A trip's payment is declined, so it unwinds; the flights service fails every call while the flight is being
undone, so that compensation uses up its attempts and the trip ends COMPENSATION_FAILED. The operator finds it
with ``sasflow list``, reads every attempt in ``sasflow history``, and once flights is healthy again
``sasflow retry-compensation`` ends it COMPENSATED, audited with the operator's principal.

Bounded in time: a compensation makes one call per attempt and its backoff is under a second, the circuit breaker
opens only after far more failures than the story has (``BREAKER_FAILURE_THRESHOLD``), and every wait has its
limit. The flights fault is switched on once the flight is booked and while the payment takes its 2 s of latency,
so the booking itself never meets it. The page of ``/swagger`` is checked on the same stack.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from devstack.client import SignedHttp
from devstack.stack import LocalStack
from devstack.template import remote_service_parameters
from http_server import RunningServer, serve_all
from sasflow_cli.app import CliState, app
from sasflow_cli.targets import build_client
from tests.support.lambdas import ROOT

OPERATOR = "arn:aws:sts::123456789012:assumed-role/sasflow-operator/oncall"
COMPENSATION_ATTEMPTS = 3


@dataclass
class OnCall:
    stack: LocalStack
    servers: dict[str, RunningServer]

    def sasflow(self, *args: str, exit_code: int = 0) -> Any:
        """``sasflow --url <stack> ARGS --json`` as the local operator; its parsed output (its exit code asserted)."""
        state = CliState(client_=build_client(url=self.stack.api_url, stack=None, caller="operator"))
        result = CliRunner().invoke(app, [*args, "--json"], obj=state)
        assert result.exit_code == exit_code, result.output
        return json.loads(result.stdout)

    def wait_until(self, workflow_id: str, done: Any, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            view: dict[str, Any] = self.sasflow("get", workflow_id)
            if done(view):
                return view
            time.sleep(0.1)
        raise AssertionError(f"{workflow_id} did not get there in {timeout} s: {view}")


@pytest.fixture(scope="module")
def on_call() -> Iterator[OnCall]:
    servers = serve_all(rng_seed=11)
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "DeadlineGraceSeconds": "3",
        "MaxClockSkewSeconds": "1",
        "LogLevel": "WARN",
    }
    try:
        with LocalStack(
            parameters=parameters,
            schedule_interval_seconds=0.5,
            extra_env={"BREAKER_FAILURE_THRESHOLD": "50"},
            max_workers_per_function=1,
            sqs_concurrency=1,
            swagger=True,
        ) as stack:
            yield OnCall(stack, servers)
    finally:
        for server in servers.values():
            server.stop()


def trip_file(directory: Path) -> Path:
    request = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())
    for step in request["definition"]["steps"]:
        step["timeout_seconds"] = 60
        step["compensation"]["timeout_seconds"] = 60
        step["compensation"]["retry"] = {
            "max_attempts": COMPENSATION_ATTEMPTS,
            "backoff_base_seconds": 0.5,
            "backoff_cap_seconds": 1,
        }
    path = directory / "trip.json"
    path.write_text(json.dumps(request))
    return path


def test_a_failed_flight_compensation_is_found_read_and_retried_to_compensated(on_call: OnCall, tmp_path: Path) -> None:
    flights, payments = on_call.servers["flights"].service, on_call.servers["payments"].service
    # Given a trip whose payment is declined (after 2 s), and a flights service that fails once the flight is booked
    payments.update_knobs({"rejection_rate": 1.0, "latency_ms": 2000})
    started = on_call.sasflow("start", str(trip_file(tmp_path)))
    wid = started["workflow_id"]
    on_call.wait_until(wid, lambda v: v["steps"][0]["status"] == "COMPLETED", timeout=30)
    flights.update_knobs({"transient_error_rate": 1.0})
    # When it unwinds, the flight's compensation fails every attempt: COMPENSATION_FAILED
    failed = on_call.wait_until(wid, lambda v: v["status"] == "COMPENSATION_FAILED")
    flight = failed["steps"][0]
    assert (flight["status"], flight["compensation_attempt"]) == ("COMPENSATION_FAILED", COMPENSATION_ATTEMPTS)
    assert [s["status"] for s in failed["steps"][1:]] == ["COMPENSATED", "FAILED"]
    # Then `sasflow list --status COMPENSATION_FAILED` finds it, waiting for a person
    listing = on_call.sasflow("list", "--status", "COMPENSATION_FAILED", "--all")
    [found] = [w for w in listing["workflows"] if w["workflow_id"] == wid]
    assert (found["status"], found["attention"]) == ("COMPENSATION_FAILED", "COMPENSATION_FAILED")
    assert listing["counts"]["COMPENSATION_FAILED"] >= 1
    # And its history shows every attempt of the flight's compensation, in order, with its time and error code
    events = on_call.sasflow("history", wid)["events"]
    dispatches = [e for e in events if e["kind"] == "compensation_dispatched" and e["step"] == "reserve_flight"]
    replies = [e for e in events if e["kind"] == "compensation_reply_applied" and e["step"] == "reserve_flight"]
    assert [e["attempt"] for e in dispatches] == [e["attempt"] for e in replies] == [1, 2, 3]
    assert [(e["outcome"], e["error_code"], e["calls"]) for e in replies] == [("failed", "TRANSIENT_EXHAUSTED", 1)] * 3
    times = [e["time"] for e in events]
    assert times == sorted(times) and all(d["time"] <= r["time"] for d, r in zip(dispatches, replies, strict=True))
    assert [e["kind"] for e in events][-1] == "finished" and events[-1]["status"] == "COMPENSATION_FAILED"
    assert flights.compensations() == {}  # nothing was undone at flights
    # When flights is healthy again and the operator retries the compensation
    flights.update_knobs({"transient_error_rate": 0.0})
    after = on_call.sasflow("retry-compensation", wid, "--reason", "flights is back", "--step", "reserve_flight")
    assert after["status"] == "COMPENSATING"
    done = on_call.sasflow("watch", wid, "--interval", "0.2", "--timeout", "60", exit_code=3)  # not COMPLETED
    # Then it ends COMPENSATED, the flight undone once, and the audit event names the operator
    assert done["status"] == "COMPENSATED"
    assert (done["steps"][0]["compensation_status"], done["steps"][0]["compensation_attempt"]) == ("COMPENSATED", 4)
    assert list(flights.compensations().values()) == [1]
    events = on_call.sasflow("history", wid)["events"]
    [audit] = [e for e in events if e["kind"] == "operator_action"]
    assert audit["detail"]["principal"] == OPERATOR
    assert (audit["detail"]["action"], audit["detail"]["reason"], audit["detail"]["step"]) == (
        "retry-compensation",
        "flights is back",
        "reserve_flight",
    )
    # And its timeline has the four attempts of the flight's compensation, the operator's retry among them
    line = on_call.sasflow("timeline", wid, "--out", str(tmp_path / "on-call.png"))
    flight_bars = [b for b in line["bars"] if b["step"] == "reserve_flight" and b["phase"] == "compensation"]
    assert [(b["attempt"], b["outcome"]) for b in flight_bars] == [
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
        (4, "succeeded"),
    ]
    assert [m["kind"] for m in line["markers"]].count("operator_action") == 1


def test_a_map_childs_id_with_colons_is_read_by_get_and_history(on_call: OnCall, tmp_path: Path) -> None:
    # Given a workflow whose map step started two children (their ids are "<parent>:0:<i>")
    child = {
        "name": "hold-seat",
        "steps": [{"name": "reserve", "agent": "flights", "action": "reserve", "input": {"seat.$": "input.item"}}],
    }
    request = {
        "definition": {
            "name": "seats",
            "steps": [{"name": "each", "type": "map", "items": "input.seats", "definition": child}],
        },
        "input": {"seats": ["1A", "1B"]},
    }
    path = tmp_path / "seats.json"
    path.write_text(json.dumps(request))
    wid = on_call.sasflow("start", str(path))["workflow_id"]
    assert on_call.wait_until(wid, lambda v: v["status"] != "RUNNING", timeout=60)["status"] == "COMPLETED"
    # When the operator reads a child by its id through the CLI (the path carries %3A for each ':')
    child_id = f"{wid}:0:1"
    view = on_call.sasflow("get", child_id)
    events = on_call.sasflow("history", child_id)["events"]
    # Then the API found that child: its own id and its item
    assert (view["workflow_id"], view["status"], view["input"]) == (child_id, "COMPLETED", {"item": "1B", "index": 1})
    assert events[0]["kind"] == "started" and events[-1]["kind"] == "finished"


def test_swagger_serves_one_document_of_both_apis_routes(on_call: OnCall) -> None:
    # The page and its document need no signature; every route of the template is in it
    api = SignedHttp(on_call.stack.api_url)
    page = api.request("GET", "/swagger", signed=False)
    assert page.status == 200 and b"SwaggerUIBundle" in page.data
    status, document = api.get("/swagger?format=json", signed=False)
    assert status == 200
    routes = {
        f"{method.upper()} {path}"
        for path, item in document["paths"].items()
        for method in item
        if method != "parameters"
    }
    assert routes >= {
        "POST /workflows",
        "GET /workflows/{workflow_id}",
        "GET /workflows/{workflow_id}/history",
        "POST /workflows/{workflow_id}/cancel",
        "GET /ops/workflows",
        "GET /ops/workflows/{workflow_id}",
        "GET /ops/workflows/{workflow_id}/history",
        "POST /ops/workflows/{workflow_id}/{action}",
        "GET /ops/overdue",
        "GET /ops/dead-letters",
        "POST /ops/dead-letters/redrive",
        "GET /ops/triggers",
        "POST /ops/triggers/{name}/{action}",
    }
    # And Try it out as the operator reaches the operators' routes unsigned
    status, body = api.get("/swagger/as/operator/ops/dead-letters", signed=False)
    assert status == 200 and {q["queue"] for q in body["queues"]} >= {"FlightsDeadLetterQueue"}
