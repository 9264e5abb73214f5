"""System tier: the local stack from template.yaml over HTTP, with the sample services on loopback.

Faults are scripted per workflow, never by the order the tests run in: a step whose name carries ``LOST_REPLY``
loses every reply of its first attempt (``devstack.chaos``), so it completes on exactly attempt 2 after one
supervisor resend; every other step and workflow is untouched. Time is real here, so the margins are wide: a step
without the mark has 60 s to complete (a spurious supervisor timeout cannot happen during normal progress), and a
marked step's resend has its 5 s timeout plus the 6 s grace, many times what a hop takes on a loaded 2-core machine.
Every wait is bounded.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devstack.chaos import MARKED_STEPS_KEY
from devstack.client import SignedHttp
from devstack.stack import LocalStack
from devstack.template import remote_service_parameters
from http_server import RunningServer, serve_all
from sasflow.messages import remote_token
from tests.support.lambdas import ROOT
from tests.support.ledgers import ledger_order
from travel_services import demo_manifest

TERMINAL = {"COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED"}
LOST_REPLY = "_lose_reply"
GRACE_SECONDS = 6
#: A step that must not time out during normal progress (seconds).
NORMAL_TIMEOUT_SECONDS = 60
#: A step scripted to lose its first reply: the supervisor resends it after this + the grace (seconds).
LOST_REPLY_TIMEOUT_SECONDS = 5


class Api(SignedHttp):
    """The local API, every request signed with SigV4 (client-a unless told otherwise)."""

    def wait(self, workflow_id: str, timeout: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            _, view = self.get(f"/workflows/{workflow_id}")
            if view["status"] in TERMINAL:
                return view  # type: ignore[no-any-return]
            time.sleep(0.2)
        raise AssertionError(f"{workflow_id} not terminal after {timeout} s: {view}")


def trip(*, lose_first_reply_of: tuple[str, ...] = (), **input_changes: Any) -> dict[str, Any]:
    """The sample trip; the steps named in ``lose_first_reply_of`` are marked to lose their first attempt's reply."""
    request = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())
    steps = request["definition"]["steps"]
    names = {step["name"]: step["name"] + (LOST_REPLY if step["name"] in lose_first_reply_of else "") for step in steps}
    for step in steps:
        step["name"] = names[step["name"]]
        step["timeout_seconds"] = LOST_REPLY_TIMEOUT_SECONDS if LOST_REPLY in step["name"] else NORMAL_TIMEOUT_SECONDS
        step["compensation"]["timeout_seconds"] = NORMAL_TIMEOUT_SECONDS
        step["input"] = {
            key: value.replace("steps.reserve_flight.", f"steps.{names['reserve_flight']}.")
            for key, value in step["input"].items()
        }
    steps[2]["input"]["simulate.$"] = {"expression": "input.simulate", "default": None}  # optional
    request["input"].update(input_changes)
    return request  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def system() -> Iterator[tuple[Api, dict[str, RunningServer]]]:
    servers = serve_all(rng_seed=5)
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "DeadlineGraceSeconds": str(GRACE_SECONDS),
        "MaxClockSkewSeconds": "0",
        "LogLevel": "WARN",
    }
    extra_env = {
        "DEVSTACK_WORKER_INIT": "devstack.chaos:install",
        "DEVSTACK_CHAOS": json.dumps({MARKED_STEPS_KEY: LOST_REPLY}),
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
    # Given a trip whose flight and payment steps lose the reply of their first attempt (after their effect)
    api, servers = system
    request = trip(lose_first_reply_of=("reserve_flight", "charge_card"))
    # When it runs
    status, started = api.post("/workflows", request, headers={"Idempotency-Key": f"system-lost-{uuid.uuid4()}"})
    assert status == 201
    workflow_id = started["workflow_id"]
    view = api.wait(workflow_id)
    # Then it completed: each marked step on attempt 2 after exactly one supervisor resend, the hotel on attempt 1
    assert view["status"] == "COMPLETED"
    assert [(s["name"], s["status"], s["attempt"], s["resends"]) for s in view["steps"]] == [
        ("reserve_flight_lose_reply", "COMPLETED", 2, 1),
        ("book_hotel", "COMPLETED", 1, 0),
        ("charge_card_lose_reply", "COMPLETED", 2, 1),
    ]
    # And each service applied this workflow's effect once: attempt 2 was answered from the agent's idempotency
    # record, not by a second effect
    assert ledger_order(servers, workflow_id) == [
        ("flights", "effect", "reserve_flight_lose_reply"),
        ("hotels", "effect", "book_hotel"),
        ("payments", "effect", "charge_card_lose_reply"),
    ]


def test_business_rejection_compensates_in_reverse_order_over_http(
    system: tuple[Api, dict[str, RunningServer]],
) -> None:
    # Given a trip whose charge the payments service declines
    api, servers = system
    # When it runs
    status, started = api.post("/workflows", trip(simulate="reject"))
    assert status == 201
    workflow_id = started["workflow_id"]
    view = api.wait(workflow_id)
    # Then the two completed steps were compensated, once each and without a resend, and the declined one not
    assert view["status"] == "COMPENSATED"
    assert [(s["status"], s["attempt"], s["compensation_attempt"], s["resends"]) for s in view["steps"]] == [
        ("COMPENSATED", 1, 1, 0),
        ("COMPENSATED", 1, 1, 0),
        ("FAILED", 1, 0, 0),
    ]
    assert view["steps"][2]["error"]["code"] == "CARD_DECLINED"
    # And the services' ledgers show the effects forward, then the undos in reverse: the hotel before the flight
    assert ledger_order(servers, workflow_id) == [
        ("flights", "effect", "reserve_flight"),
        ("hotels", "effect", "book_hotel"),
        ("hotels", "undo", "book_hotel"),
        ("flights", "undo", "reserve_flight"),
    ]


def test_repeated_start_and_bad_input_over_http(system: tuple[Api, dict[str, RunningServer]]) -> None:
    # Given a start with an Idempotency-Key of this run
    api, _ = system
    key = f"system-repeat-{uuid.uuid4()}"
    # When the same start is posted twice
    first_status, first = api.post("/workflows", trip(), headers={"Idempotency-Key": key})
    again_status, again = api.post("/workflows", trip(), headers={"Idempotency-Key": key})
    # Then the second is answered with the first's workflow
    assert (first_status, again_status) == (201, 200)
    assert first["workflow_id"] == again["workflow_id"]
    # And bad input, an unknown workflow and the OpenAPI document get their answers
    status, error = api.post("/workflows", {"definition": {"name": "x", "steps": []}})
    assert (status, error["error"]) == (422, "VALIDATION_ERROR")
    status, missing = api.get(f"/workflows/does-not-exist-{uuid.uuid4()}")
    assert (status, missing["error"]) == (404, "WORKFLOW_NOT_FOUND")
    status, spec = api.get("/openapi.json")
    assert status == 200 and "/workflows" in spec["paths"]
    assert api.wait(first["workflow_id"])["status"] == "COMPLETED"


def test_a_5_mb_output_of_step_1_reaches_step_2_intact_on_the_local_stack(
    system: tuple[Api, dict[str, RunningServer]],
) -> None:
    # Given a trip whose flight answers 5 MB (the sample's output_bytes knob) and whose hotel is given that output
    api, _ = system
    size = 5 * 1024 * 1024
    definition = {
        "name": "large-payload-trip",
        "version": 1,
        "steps": [
            {
                "name": "reserve_flight",
                "agent": "flights",
                "action": "reserve",
                "input": {"route.$": "input.route", "output_bytes.$": "input.output_bytes"},
                "timeout_seconds": NORMAL_TIMEOUT_SECONDS,
            },
            {
                "name": "book_hotel",
                "agent": "hotels",
                "action": "book",
                "input": {"manifest.$": "steps.reserve_flight.output.manifest"},
                "timeout_seconds": NORMAL_TIMEOUT_SECONDS,
            },
        ],
    }
    started_at = time.monotonic()
    status, started = api.post(
        "/workflows", {"definition": definition, "input": {"route": "LHR-JFK", "output_bytes": size}}
    )
    assert status == 201, started
    # When it runs on the local stack (moto's S3 holds the payloads)
    view = api.wait(started["workflow_id"])
    seconds = time.monotonic() - started_at
    # Then the hotel's service was given the flight's 5 MB manifest intact, and the views show references
    assert view["status"] == "COMPLETED", view
    flight, hotel = view["steps"]
    token = flight["output"]["$claim_check"]["key"].split("/", 1)[0]
    assert token == started["workflow_id"] and flight["output"]["$claim_check"]["bytes"] > size
    expected = hashlib.sha256(demo_manifest(remote_token(token, "reserve_flight", "reserve"), size).encode())
    assert (hotel["output"]["manifest_sha256"], hotel["output"]["manifest_bytes"]) == (expected.hexdigest(), size)
    print(f"a 5 MB output through two steps on the local stack: {seconds:.1f} s")  # the figure in docs/definitions.md
