"""Ownership through the API handler: the caller API Gateway verified owns what it starts, and nobody else sees it."""

from __future__ import annotations

from tests.integration.conftest import Deployed
from tests.support.lambdas import load_event

TRIP = load_event("trip_booking_request.json")


def test_another_caller_gets_404_on_a_workflow_and_its_cancel_and_it_is_unchanged(deployed: Deployed) -> None:
    # Given a workflow that client-a started
    status, started = deployed.api("POST", "/workflows", TRIP, caller="client-a")
    assert (status, started["owner"]) == (201, "arn:aws:iam::123456789012:user/client-a")
    workflow_id = started["workflow_id"]
    # When client-b reads it and cancels it
    read_status, read = deployed.api("GET", f"/workflows/{workflow_id}", caller="client-b")
    cancel_status, cancel = deployed.api("POST", f"/workflows/{workflow_id}/cancel", caller="client-b")
    # Then both are 404, exactly as for an id that does not exist, and nothing changed
    assert (read_status, read["error"]) == (404, "WORKFLOW_NOT_FOUND")
    assert (cancel_status, cancel["error"]) == (404, "WORKFLOW_NOT_FOUND")
    missing_status, missing = deployed.api("GET", "/workflows/00000000-0000-0000-0000-000000000000", caller="client-b")
    assert (missing_status, missing["error"]) == (404, "WORKFLOW_NOT_FOUND")
    _, view = deployed.api("GET", f"/workflows/{workflow_id}", caller="client-a")
    assert view["status"] == "RUNNING"
    assert deployed.depth("FlightsRequestQueue") == 1  # no compensation was sent


def test_the_same_key_from_two_callers_gives_two_workflows_with_unguessable_ids(deployed: Deployed) -> None:
    headers = {"Idempotency-Key": "order-1"}
    a_status, a = deployed.api("POST", "/workflows", TRIP, headers=headers, caller="client-a")
    b_status, b = deployed.api("POST", "/workflows", TRIP, headers=headers, caller="client-b")
    again_status, again = deployed.api("POST", "/workflows", TRIP, headers=headers, caller="client-a")
    assert (a_status, b_status, again_status) == (201, 201, 200)
    assert a["workflow_id"] != b["workflow_id"]
    assert again["workflow_id"] == a["workflow_id"]


def test_a_request_without_a_verified_caller_is_403_and_writes_nothing(deployed: Deployed) -> None:
    status, error = deployed.api("POST", "/workflows", TRIP, caller=None)
    assert (status, error["error"]) == (403, "FORBIDDEN")
    assert deployed.items() == []


def test_an_action_its_agent_does_not_accept_is_422_and_writes_nothing(deployed: Deployed) -> None:
    trip = load_event("trip_booking_request.json")
    trip["definition"]["steps"][2]["action"] = "refund_everything"
    status, error = deployed.api("POST", "/workflows", trip)
    assert (status, error["error"]) == (422, "INVALID_DEFINITION")
    assert "charge_card: payments.refund_everything" in error["message"]
    assert deployed.items() == []
