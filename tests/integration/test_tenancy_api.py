"""Tenants' limits through the template's functions on moto: the API refuses a start over its tenant's limit with
429 and Retry-After, the scheduler's function gives the slot back when the workflow ends, each within its role."""

from __future__ import annotations

import json
from typing import Any

from sasflow.tenancy import QUEUE_CHECK_SECONDS
from tests.integration.conftest import Deployed
from tests.support.lambdas import load_event

TRIP = load_event("trip_booking_request.json")


def limited(max_running: int, **tenancy: Any) -> dict[str, Any]:
    body = json.loads(json.dumps(TRIP))
    body["definition"]["tenancy"] = {"max_running": max_running, **tenancy}
    return body


def tenant_items(deployed: Deployed) -> dict[str, set[str]]:
    """Each tenant's item: its key and the workflows holding its slots."""
    return {
        item["pk"]["S"]: {name.removeprefix("h#") for name in item if name.startswith("h#")}
        for item in deployed.items()
        if item["pk"]["S"].startswith("TENANCY#")
    }


def test_a_start_over_the_tenants_limit_is_429_with_retry_after_and_the_slot_comes_back_at_the_end(
    deployed: Deployed,
) -> None:
    # Given a trip limited to one running per tenant, started by client-a
    status, first = deployed.api("POST", "/workflows", limited(1))
    assert status == 201
    client_a = f"principal#{first['owner']}"
    assert first["tenant"] == client_a

    # When client-a starts another, and client-b one
    refused_status, refused = deployed.api("POST", "/workflows", limited(1))
    retry_after = deployed.last_headers.get("Retry-After")
    other_status, other = deployed.api("POST", "/workflows", limited(1), caller="client-b")

    # Then client-a's second is refused with 429, JSON naming the tenant and the limit, and Retry-After; client-b's
    # starts; each tenant's item holds its one running workflow
    assert refused_status == 429
    assert refused["error"] == "TENANT_LIMIT"
    assert (
        f"tenant {client_a} runs 1 or more workflow(s) of trip-booking, at its tenancy.max_running (1)"
        in (refused["message"])
    )
    assert retry_after == "10"
    assert other_status == 201
    client_b = f"principal#{other['owner']}"
    assert tenant_items(deployed) == {
        f"TENANCY#trip-booking#{client_a}": {first["workflow_id"]},
        f"TENANCY#trip-booking#{client_b}": {other["workflow_id"]},
    }

    # When the workflows run to their end (the agents' and the scheduler's functions)
    deployed.pump()

    # Then their slots are back, and client-a starts again
    assert tenant_items(deployed) == {
        f"TENANCY#trip-booking#{client_a}": set(),
        f"TENANCY#trip-booking#{client_b}": set(),
    }
    again_status, _ = deployed.api("POST", "/workflows", limited(1))
    assert again_status == 201


def test_a_tenant_key_that_names_no_tenant_is_422_and_writes_nothing(deployed: Deployed) -> None:
    status, body = deployed.api("POST", "/workflows", limited(1, tenant_key="customer.id"))
    assert status == 422
    assert body["error"] == "TENANT_KEY_NOT_EVALUATED"
    assert "tenancy.tenant_key 'customer.id' gives null (nothing) on this input" in body["message"]
    assert [item for item in deployed.items() if item["sk"]["S"] in ("#WF", "#TENANCY")] == []


def test_a_cancel_gives_the_slot_back_through_the_api_function(deployed: Deployed) -> None:
    _, first = deployed.api("POST", "/workflows", limited(1))
    status, _ = deployed.api("POST", f"/workflows/{first['workflow_id']}/cancel")
    assert status in (200, 202)
    deployed.pump()
    assert tenant_items(deployed) == {f"TENANCY#trip-booking#principal#{first['owner']}": set()}


def queue_entries(deployed: Deployed) -> list[tuple[str, str]]:
    """The tenants' queues: each entry's key and its workflow, in ticket order."""
    found = [(item["sk"]["S"], item["wid"]["S"]) for item in deployed.items() if item["sk"]["S"].startswith("Q#")]
    return sorted(found)


def test_a_start_over_the_limit_is_queued_listed_cancellable_and_started_in_order_each_within_its_role(
    deployed: Deployed,
) -> None:
    # Given a trip limited to one running per tenant that queues the rest, and three started
    body = limited(1, over_limit="queue")
    answers = [deployed.api("POST", "/workflows", body) for _ in range(3)]
    (_, first), (_, second), (_, third) = answers

    # Then the first runs and the others are 201 QUEUED, with their places and tickets, in the queue
    assert [status for status, _ in answers] == [201, 201, 201]
    assert [view["status"] for _, view in answers] == ["RUNNING", "QUEUED", "QUEUED"]
    assert [view.get("queue_position") for _, view in answers] == [None, 1, 2]
    assert [view.get("queue_ticket") for _, view in answers] == [None, 1, 2]
    assert queue_entries(deployed) == [
        ("Q#000000000001", second["workflow_id"]),
        ("Q#000000000002", third["workflow_id"]),
    ]

    # And an operator lists the queued ones
    status, page = deployed.ops("GET", "/ops/workflows", query="status=QUEUED")
    assert status == 200
    assert sorted(w["workflow_id"] for w in page["workflows"]) == sorted([second["workflow_id"], third["workflow_id"]])

    # When the client cancels the second (it never ran), and the first runs to its end
    status, cancelled = deployed.api("POST", f"/workflows/{second['workflow_id']}/cancel")
    assert (status, cancelled["status"]) == (202, "CANCELLED")  # done at once: it had started nothing
    _, waiting = deployed.api("GET", f"/workflows/{third['workflow_id']}")
    assert (waiting["status"], waiting["queue_ticket"], waiting["queue_position"]) == ("QUEUED", 2, 1)  # moved up
    deployed.pump()

    # Then the third started when the first ended, and completed; the queue is empty and no slot is held
    _, view = deployed.api("GET", f"/workflows/{third['workflow_id']}")
    assert view["status"] == "COMPLETED"
    assert queue_entries(deployed) == []
    assert tenant_items(deployed) == {f"TENANCY#trip-booking#principal#{first['owner']}": set()}

    # And the supervisor's look at the queue, once due, finds it empty and takes it out of the deadline index
    deployed.clock.advance(QUEUE_CHECK_SECONDS + 1)
    report = deployed.fn("SupervisorFunction").invoke(load_event("supervisor_scheduled.json"))
    assert report["queues"] == 1
    tenant = next(item for item in deployed.items() if item["sk"]["S"] == "#TENANCY")
    assert "complete_by" not in tenant and "dl_shard" not in tenant
