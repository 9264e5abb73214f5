"""System tier: who may call the local stack's API, checked over HTTP as a deployed stack checks it.

The API emulator verifies SigV4 against the local identities (devstack.identities) and applies their execute-api
policies; the API function gives each workflow to the principal that started it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from devstack.client import SignedHttp
from devstack.identities import sign
from devstack.stack import LocalStack
from devstack.template import remote_service_parameters
from http_server import serve_all
from tests.support.lambdas import ROOT


@pytest.fixture(scope="module")
def stack() -> Iterator[LocalStack]:
    servers = serve_all(rng_seed=9)
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "LogLevel": "WARN",
    }
    try:
        with LocalStack(parameters=parameters) as running:
            yield running
    finally:
        for server in servers.values():
            server.stop()


def trip() -> dict[str, Any]:
    return json.loads((ROOT / "events" / "trip_booking_request.json").read_text())  # type: ignore[no-any-return]


def workflow_items(stack: LocalStack) -> list[dict[str, Any]]:
    items = stack.client("dynamodb").scan(TableName=stack.physical_ids["StateTable"], ConsistentRead=True)["Items"]
    return [item for item in items if item["sk"]["S"] == "#WF"]


def test_an_unsigned_start_is_403_and_writes_nothing_and_a_signed_one_is_201(stack: LocalStack) -> None:
    api = SignedHttp(stack.api_url)
    before = len(workflow_items(stack))
    body = json.dumps(trip()).encode()
    headers = {"Content-Type": "application/json"}
    unsigned = api.request("POST", "/workflows", body=body, headers=headers, signed=False)
    assert (unsigned.status, json.loads(unsigned.data)) == (403, {"message": "Forbidden"})
    # a signature with the wrong secret, and a signed body that was changed afterwards, are refused the same way
    url = stack.api_url + "/workflows"
    forged = sign("POST", url, body=body, headers=headers, caller="client-a")
    tampered = api.pool.request("POST", url, body=body.replace(b"Ada", b"Eve"), headers=forged)
    assert (tampered.status, json.loads(tampered.data)) == (403, {"message": "Forbidden"})
    assert len(workflow_items(stack)) == before
    status, started = api.post("/workflows", trip())
    assert status == 201
    assert started["owner"] == "arn:aws:iam::123456789012:user/client-a"
    assert len(workflow_items(stack)) == before + 1


def test_another_principal_gets_404_on_a_workflow_and_on_its_cancel_and_nothing_changes(stack: LocalStack) -> None:
    a = SignedHttp(stack.api_url, caller="client-a")
    b = SignedHttp(stack.api_url, caller="client-b")
    status, started = a.post("/workflows", trip())
    assert status == 201
    workflow_id = started["workflow_id"]
    read_status, read = b.get(f"/workflows/{workflow_id}")
    cancel_status, cancel = b.post(f"/workflows/{workflow_id}/cancel")
    assert (read_status, read["error"]) == (404, "WORKFLOW_NOT_FOUND")
    assert (cancel_status, cancel["error"]) == (404, "WORKFLOW_NOT_FOUND")
    own_status, own = a.get(f"/workflows/{workflow_id}")
    assert own_status == 200 and own["status"] != "CANCELLING"


def test_the_same_idempotency_key_from_two_principals_gives_two_workflows(stack: LocalStack) -> None:
    key = f"shared-key-{uuid.uuid4()}"
    a = SignedHttp(stack.api_url, caller="client-a")
    b = SignedHttp(stack.api_url, caller="client-b")
    a_status, from_a = a.post("/workflows", trip(), headers={"Idempotency-Key": key})
    b_status, from_b = b.post("/workflows", trip(), headers={"Idempotency-Key": key})
    again_status, again = a.post("/workflows", trip(), headers={"Idempotency-Key": key})
    assert (a_status, b_status, again_status) == (201, 201, 200)
    assert from_a["workflow_id"] != from_b["workflow_id"]
    assert again["workflow_id"] == from_a["workflow_id"]
    assert (from_a["owner"], from_b["owner"]) == (
        "arn:aws:iam::123456789012:user/client-a",
        "arn:aws:iam::123456789012:user/client-b",
    )


def test_a_client_policy_does_not_reach_a_route_it_does_not_grant(stack: LocalStack) -> None:
    # client-a's policy grants /workflows routes and the document; an unknown route is still API Gateway's 404
    api = SignedHttp(stack.api_url, caller="client-a")
    status, document = api.get("/openapi.json")
    assert status == 200 and "/workflows" in document["paths"]
    missing = api.request("GET", "/no-such-route")
    assert (missing.status, json.loads(missing.data)) == (404, {"message": "Not Found"})


@pytest.mark.parametrize("raw_id", ["..%2Fx", "a%00b", "%F0%9F%98%80", "%2e%2e%2fx", "%ff", "a%20b", "a'b"])
def test_a_signed_request_for_an_id_that_breaks_the_id_rule_is_422_on_every_route_never_403_or_404(
    stack: LocalStack, raw_id: str
) -> None:
    # From a clean-clone trial: these answered 404 "no such route", or 403 Forbidden although correctly signed
    # (the client signed %ff and sent %FF). Each is now the id rule's 422, as a client and as an operator.
    http = SignedHttp(stack.api_url)
    answers = [
        http.get(f"/workflows/{raw_id}"),
        http.get(f"/workflows/{raw_id}/history"),
        http.post(f"/workflows/{raw_id}/cancel", {}),
        http.get(f"/ops/workflows/{raw_id}", caller="operator"),
        http.get(f"/ops/workflows/{raw_id}/history", caller="operator"),
        http.post(f"/ops/workflows/{raw_id}/retry", {"reason": "x"}, caller="operator"),
    ]
    for status, body in answers:
        assert (status, body["error"]) == (422, "VALIDATION_ERROR"), body
        assert ["path", "workflow_id"] in [detail["loc"] for detail in body["details"]]
