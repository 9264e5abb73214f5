"""System tier: a tenant over its limit on the local stack (template.yaml over HTTP, each function in its role): the
starts over ``max_running`` answer 201 QUEUED with their places and start in ticket order as the tenant's workflows
end, never more than ``max_running`` at once, while another tenant starts at once.

Time is real here: the hotels answer after 0.3 s so that workflows overlap; every wait is bounded.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.client import SignedHttp
from devstack.stack import LocalStack
from devstack.template import remote_service_parameters
from http_server import RunningServer, serve_all

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
MAX_RUNNING = 2
QUEUED = 6


@pytest.fixture(scope="module")
def local() -> Iterator[SignedHttp]:
    servers: dict[str, RunningServer] = serve_all(rng_seed=5)
    servers["hotels"].service.update_knobs({"latency_ms": 300.0})
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "DeadlineGraceSeconds": "6",
        "MaxClockSkewSeconds": "0",
        "LogLevel": "WARN",
    }
    try:
        with LocalStack(parameters=parameters, schedule_interval_seconds=3.0) as stack:
            yield SignedHttp(stack.api_url)
    finally:
        for server in servers.values():
            server.stop()


def trip(customer: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())
    body["definition"]["tenancy"] = {"max_running": MAX_RUNNING, "tenant_key": "customer", "over_limit": "queue"}
    body["input"]["customer"] = customer
    return body


def test_a_tenant_over_its_limit_sees_its_queued_workflows_start_in_ticket_order(local: SignedHttp) -> None:
    api = local
    # Given acme starting 8 trips at once (2 may run), and globex one
    answers = [api.post("/workflows", trip("acme")) for _ in range(MAX_RUNNING + QUEUED)]
    other_status, other = api.post("/workflows", trip("globex"))

    # Then 2 run and 6 wait QUEUED with their places 1..6 and tickets 1..6; globex's runs at once
    assert [status for status, _ in answers] == [201] * (MAX_RUNNING + QUEUED)
    assert [view["status"] for _, view in answers] == ["RUNNING"] * MAX_RUNNING + ["QUEUED"] * QUEUED
    assert [view.get("queue_position") for _, view in answers[MAX_RUNNING:]] == list(range(1, QUEUED + 1))
    assert [view.get("queue_ticket") for _, view in answers[MAX_RUNNING:]] == list(range(1, QUEUED + 1))
    assert (other_status, other["status"]) == (201, "RUNNING")
    ids = [view["workflow_id"] for _, view in answers]

    # When they run (watching how many of acme's run at once)
    views: dict[str, Any] = {}
    most = 0
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        views = {wid: api.get(f"/workflows/{wid}")[1] for wid in ids}
        most = max(most, sum(1 for view in views.values() if view["status"] == "RUNNING"))
        if all(view["status"] == "COMPLETED" for view in views.values()):
            break
        time.sleep(0.2)

    # Then all completed, and the queued ones left the queue in ticket order, each once
    assert {view["status"] for view in views.values()} == {"COMPLETED"}, views
    assert most >= 1
    spans: list[tuple[int, int]] = []
    left: list[tuple[int, int, str]] = []
    for n, wid in enumerate(ids):
        status, history = api.get(f"/workflows/{wid}/history")
        assert status == 200
        events = history["events"]
        kinds = [event["kind"] for event in events]
        ended = next(event["time"] for event in events if event["kind"] == "finished")
        if n < MAX_RUNNING:
            spans.append((events[0]["time"], ended))
            continue
        assert kinds[:3] == ["started", "queued", "dequeued"] and kinds.count("dequeued") == 1, kinds
        dequeued = next(event for event in events if event["kind"] == "dequeued")
        left.append((dequeued["seq"], dequeued["time"], wid))
        spans.append((dequeued["time"], ended))
    times = [at for _, at, _ in left]
    assert times == sorted(times), left  # ticket order (the ids are in ticket order)
    # and, by their own histories, never more than 2 ran in any second (a workflow that ended in the second the next
    # started does not count in it; the polls above read one workflow after another, not at one instant)
    seconds = range(min(start for start, _ in spans), max(end for _, end in spans) + 1)
    assert max(sum(1 for start, end in spans if start <= t < end) for t in seconds) <= MAX_RUNNING, spans
