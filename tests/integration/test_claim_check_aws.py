"""Claim-checked payloads through the real handlers on moto: S3 built from template.yaml (PayloadBucket).

A 5 MB output of step 1 (an HTTP agent) reaches step 2 (the Python inventory agent) intact, whose 5 MB output reaches
step 3 (an HTTP agent) intact: each agent resolves its input before its service sees it and claim-checks its output,
the scheduler renders from the references, and the messages and the item carry references only.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

import boto3
import pytest
from moto import mock_aws

from devstack.inprocess import environment, function_environment
from devstack.moto_sqs import install as install_sqs_redrive
from devstack.provision import provision
from devstack.template import Stack, remote_service_parameters
from http_server import RunningServer
from sasflow.adapters.http_remote import HttpRemoteClient
from sasflow.claim_check import REFERENCE_KEY
from sasflow.cost import item_size
from sasflow.python_agent import ActionRequest
from tests.integration.conftest import Deployed, roles_checked
from tests.support.lambdas import ROOT

MB5 = 5 * 1024 * 1024
#: 5 MiB of text that no compression trick could shorten in a reference: every 64 bytes differ.
MANIFEST = "".join(hashlib.sha256(str(i).encode()).hexdigest() for i in range(MB5 // 64))
SHA = hashlib.sha256(MANIFEST.encode()).hexdigest()


class _Handler(BaseHTTPRequestHandler):
    """A remote service: ``reserve`` answers with the 5 MB manifest, ``book`` with the SHA-256 of the one given."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def do_POST(self) -> None:  # http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        step_input = body["input"]
        if self.path.endswith("/reserve"):
            answer: dict[str, Any] = {"confirmation": "FL-1", "manifest": MANIFEST}
        else:
            manifest = step_input.get("manifest", "")
            answer = {"confirmation": "HO-1", "sha256": hashlib.sha256(manifest.encode()).hexdigest()}
            answer["bytes"] = len(manifest)
        type(self).seen.append({"path": self.path, "keys": sorted(step_input)})
        payload = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: Any) -> None:
        return


@pytest.fixture
def service() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _use_service(deployed: Deployed, logical_id: str, base_url: str) -> None:
    function = deployed.fn(logical_id)
    with environment(function_environment(function.spec)):
        services = function.module.agent()
    services.runtime.remote = HttpRemoteClient(base_url)


def _inventory_passes_on(deployed: Deployed) -> dict[str, Any]:
    """The Python agent's ``reserve_stock``: returns the SHA-256 of the manifest it is given, and the manifest."""
    function = deployed.fn("InventoryAgentFunction")
    app = function.module.app
    given: dict[str, Any] = {}

    def reserve(request: ActionRequest) -> dict[str, Any]:
        manifest = request.input["manifest"]
        given.update(sha256=hashlib.sha256(manifest.encode()).hexdigest(), bytes=len(manifest))
        return {"reservation": request.token, "manifest": manifest}

    app.actions["reserve_stock"] = type(app.actions["reserve_stock"])(reserve)
    return given


DEFINITION = {
    "name": "large-payloads",
    "version": 1,
    "steps": [
        {"name": "reserve_flight", "agent": "flights", "action": "reserve", "input": {"route.$": "input.route"}},
        {
            "name": "reserve_stock",
            "agent": "inventory",
            "action": "reserve_stock",
            "input": {"manifest.$": "steps.reserve_flight.output.manifest"},
        },
        {
            "name": "book_hotel",
            "agent": "hotels",
            "action": "book",
            "input": {
                "manifest.$": "steps.reserve_stock.output.manifest",
                "flight.$": "steps.reserve_flight.output.confirmation",
            },
        },
    ],
}


def test_a_5_mb_output_reaches_the_next_step_intact_through_http_and_python_agents(
    deployed: Deployed, service: str
) -> None:
    # Given the flights and hotels agents calling a service that answers 5 MB, and the inventory passing it on
    _use_service(deployed, "FlightsAgentFunction", service)
    _use_service(deployed, "HotelsAgentFunction", service)
    given = _inventory_passes_on(deployed)
    _Handler.seen = []
    s3 = boto3.client("s3")
    bucket = deployed.physical["PayloadBucket"]

    # When a workflow runs through the handlers
    started_at = time.perf_counter()
    status, started = deployed.api("POST", "/workflows", {"definition": DEFINITION, "input": {"route": "LHR-JFK"}})
    assert status == 201, started
    deployed.pump()
    seconds = time.perf_counter() - started_at

    # Then every step saw the 5 MB payload itself, intact
    _, view = deployed.api("GET", f"/workflows/{started['workflow_id']}")
    assert view["status"] == "COMPLETED", view
    assert given == {"sha256": SHA, "bytes": MB5}
    steps = {s["name"]: s for s in view["steps"]}
    assert (steps["book_hotel"]["output"]["sha256"], steps["book_hotel"]["output"]["bytes"]) == (SHA, MB5)
    assert _Handler.seen[-1] == {"path": "/book", "keys": ["flight", "manifest"]}
    # And the item and the views hold references, the objects under the workflow's prefix, re-stamped terminal
    for name in ("reserve_flight", "reserve_stock"):
        claim = steps[name]["output"][REFERENCE_KEY]
        assert claim["key"].startswith(f"{started['workflow_id']}/")
        assert claim["bytes"] > MB5
    [item] = [i for i in deployed.items() if i["pk"]["S"] == f"WF#{started['workflow_id']}"]
    assert item_size(item) < 20_000
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys and all(key.startswith(f"{started['workflow_id']}/") for key in keys)
    for key in keys:
        tags = s3.get_object_tagging(Bucket=bucket, Key=key)["TagSet"]
        assert tags == [{"Key": "claim-check", "Value": "terminal"}]
    print(f"5 MB through three steps: {seconds:.2f} s, {len(keys)} objects")  # the figure in docs/definitions.md


@pytest.fixture
def small_payloads(remote: dict[str, RunningServer]) -> Iterator[Deployed]:
    """The stack with MaxPayloadBytes lowered to 100,000 bytes (the API's request body limit is 393,216)."""
    with mock_aws():
        install_sqs_redrive()
        parameters = remote_service_parameters({name: server.base_url for name, server in remote.items()})
        parameters.update(MaxPayloadBytes="100000", ClaimCheckThresholdBytes="4096")
        stack = Stack.from_file(ROOT / "template.yaml", parameters=parameters)
        with roles_checked(stack) as roles:
            yield Deployed(stack, provision(stack), remote, roles=roles)


def test_an_input_above_the_largest_payload_is_refused_413_and_one_above_the_threshold_is_claim_checked(
    small_payloads: Deployed,
) -> None:
    definition = {
        "name": "one-step",
        "version": 1,
        "steps": [
            {"name": "reserve_flight", "agent": "flights", "action": "reserve", "input": {"route.$": "input.route"}}
        ],
    }
    status, refused = small_payloads.api(
        "POST", "/workflows", {"definition": definition, "input": {"route": "LHR-JFK", "notes": "n" * 150_000}}
    )
    assert status == 413
    assert refused["error"] == "PAYLOAD_TOO_LARGE"
    assert "the workflow input is" in refused["message"] and "100000 bytes" in refused["message"]
    assert not [i for i in small_payloads.items() if i["pk"]["S"].startswith("WF#")]

    status, started = small_payloads.api(
        "POST", "/workflows", {"definition": definition, "input": {"route": "LHR-JFK", "notes": "n" * 50_000}}
    )
    assert status == 201
    assert set(started["input"]) == {REFERENCE_KEY}  # the view shows the reference, not the payload
    small_payloads.pump()
    _, view = small_payloads.api("GET", f"/workflows/{started['workflow_id']}")
    assert view["status"] == "COMPLETED"
    assert view["steps"][0]["output"]["confirmation"].startswith("FL-")
