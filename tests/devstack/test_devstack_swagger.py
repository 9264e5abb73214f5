"""devstack.swagger: Swagger UI of both APIs on the local HTTP API emulator, offline, local only."""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from devstack.event_sources import HttpApiServer, HttpRoute
from devstack.identities import sign
from devstack.lambda_runtime import InvokeResult
from devstack.swagger import SwaggerPages, merge_documents
from devstack.template import HttpApiEventSpec

API_ID = "abcde12345"
SCHEMAS = {"ErrorResponse": {"type": "object", "properties": {"error": {"type": "string"}}}}
CLIENT_DOC = {
    "openapi": "3.1.0",
    "info": {"title": "sasflow", "version": "1.0.0"},
    "paths": {"/workflows": {"post": {"summary": "Start a workflow"}}},
    "components": {"schemas": {**SCHEMAS, "StartWorkflowRequest": {"type": "object"}}},
}
OPS_DOC = {
    "openapi": "3.1.0",
    "info": {"title": "sasflow operators", "version": "1.0.0"},
    "paths": {"/ops/workflows": {"get": {"summary": "Find workflows </script>"}}},
    "components": {"schemas": {**SCHEMAS, "WorkflowListPage": {"type": "object"}}},
}


class Function:
    """Answers its route's document (or a listing) and records who the authorizer said called."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.document = document
        self.callers: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def invoke(self, event: Any) -> InvokeResult:
        arn = event["requestContext"]["authorizer"]["iam"]["userArn"]
        with self.lock:
            self.callers.append((event["rawPath"], arn))
        body = self.document if event["rawPath"].endswith("openapi.json") else {"workflows": []}
        payload = {"statusCode": 200, "headers": {"content-type": "application/json"}, "body": json.dumps(body)}
        return InvokeResult(ok=True, payload=payload, error=None, duration_ms=1.0, cold_start=False)


def route(function: str, method: str, path: str) -> HttpRoute:
    spec = HttpApiEventSpec("HttpApi", path, method, name=path, api_id=API_ID, authorization="AWS_IAM")
    return HttpRoute(function, spec)


@pytest.fixture
def functions() -> dict[str, Function]:
    return {"ApiFunction": Function(CLIENT_DOC), "OpsFunction": Function(OPS_DOC)}


def serve(functions: dict[str, Function], *, swagger: bool) -> HttpApiServer:
    routes = [
        route("ApiFunction", "GET", "/openapi.json"),
        route("ApiFunction", "POST", "/workflows"),
        route("OpsFunction", "GET", "/ops/openapi.json"),
        route("OpsFunction", "GET", "/ops/workflows"),
    ]
    api = HttpApiServer(routes, functions, port=0)
    if swagger:
        api.swagger = SwaggerPages(api.get_as)
    api.start()
    return api


@pytest.fixture
def api(functions: dict[str, Function]) -> Iterator[HttpApiServer]:
    server = serve(functions, swagger=True)
    try:
        yield server
    finally:
        server.stop()


def get(api: HttpApiServer, path: str, headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
    connection = http.client.HTTPConnection(api.host, api.port, timeout=10)
    try:
        connection.request("GET", path, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.getheader("content-type") or "", response.read()
    finally:
        connection.close()


def test_the_page_inlines_powertools_swagger_ui_and_both_apis_routes(
    api: HttpApiServer, functions: dict[str, Function]
) -> None:
    # When the page is asked for, unsigned
    status, content_type, body = get(api, "/swagger")
    # Then it is Swagger UI with its bundle and stylesheet inlined: nothing to load from anywhere
    page = body.decode()
    assert (status, content_type) == (200, "text/html; charset=utf-8")
    assert "SwaggerUIBundle(swaggerUIOptions)" in page and "<style>" in page
    assert re.search(r"<script[^>]+src=|<link[^>]+href=", page) is None
    # And its document holds both APIs' routes, a "</" escaped so that it cannot end the script early
    assert '"/workflows"' in page and '"/ops/workflows"' in page
    assert "Find workflows <\\/script>" in page
    # And the documents were read from the functions as the local operator
    assert functions["ApiFunction"].callers[0][0] == "/openapi.json"
    assert functions["OpsFunction"].callers[0] == (
        "/ops/openapi.json",
        "arn:aws:sts::123456789012:assumed-role/sasflow-operator/oncall",
    )


def test_the_merged_document_has_every_path_and_schema_and_one_server_per_identity(api: HttpApiServer) -> None:
    status, content_type, body = get(api, "/swagger?format=json")
    document = json.loads(body)
    assert (status, content_type) == (200, "application/json")
    assert sorted(document["paths"]) == ["/ops/workflows", "/workflows"]
    assert sorted(document["components"]["schemas"]) == ["ErrorResponse", "StartWorkflowRequest", "WorkflowListPage"]
    assert [server["url"] for server in document["servers"]] == [
        "/swagger/as/operator",
        "/swagger/as/client-a",
        "/swagger/as/client-b",
    ]


def test_try_it_out_is_taken_as_the_chosen_identity_under_its_policy(
    api: HttpApiServer, functions: dict[str, Function]
) -> None:
    # The operator may list workflows through the page's server prefix, unsigned
    status, _, body = get(api, "/swagger/as/operator/ops/workflows")
    assert (status, json.loads(body)) == (200, {"workflows": []})
    assert functions["OpsFunction"].callers[-1] == (
        "/ops/workflows",
        "arn:aws:sts::123456789012:assumed-role/sasflow-operator/oncall",
    )
    # A client may not: its policy does not grant /ops
    status, _, body = get(api, "/swagger/as/client-a/ops/workflows")
    assert (status, json.loads(body)) == (403, {"message": "Forbidden"})
    # Outside the prefix the signature is required as always, and an unknown identity is no prefix
    assert get(api, "/ops/workflows")[0] == 403
    assert get(api, "/swagger/as/root/ops/workflows")[0] == 404
    url = f"{api.url}/ops/workflows"
    assert get(api, "/ops/workflows", sign("GET", url, caller="operator"))[0] == 200


def test_the_page_and_its_prefix_answer_only_the_loopback_host_and_no_other_origin(
    api: HttpApiServer, functions: dict[str, Function]
) -> None:
    # Found by a clean-clone trial: a page of another site whose name was rebound to 127.0.0.1 acted as the
    # operator through the unsigned prefix (the Host header named that site)
    calls = len(functions["OpsFunction"].callers)
    for headers in (
        {"Host": f"evil.example:{api.port}"},
        {"Host": f"127.0.0.1:{api.port + 1}"},
        {"Origin": "http://evil.example"},
        {"Origin": f"http://evil.example:{api.port}"},
    ):
        for path in ("/swagger/as/operator/ops/workflows", "/swagger", "/swagger?format=json"):
            status, _, body = get(api, path, headers)
            assert status == 403, (headers, path)
            assert json.loads(body)["message"].startswith("Forbidden: ")
    assert len(functions["OpsFunction"].callers) == calls  # nothing reached the function
    # The loopback names with the stack's port, and the page's own origin, are served
    for name in ("127.0.0.1", "localhost"):
        headers = {"Host": f"{name}:{api.port}", "Origin": f"http://{name}:{api.port}"}
        assert get(api, "/swagger/as/operator/ops/workflows", headers)[0] == 200


def test_without_swagger_there_is_no_page_and_no_prefix(functions: dict[str, Function]) -> None:
    server = serve(functions, swagger=False)
    try:
        assert get(server, "/swagger")[0] == 404
        assert get(server, "/swagger/as/operator/ops/workflows")[0] == 404
    finally:
        server.stop()


def test_documents_that_disagree_on_a_schema_or_share_a_path_are_not_merged() -> None:
    other = {"paths": {}, "components": {"schemas": {"ErrorResponse": {"type": "string"}}}}
    with pytest.raises(ValueError, match="schema ErrorResponse differs"):
        merge_documents([CLIENT_DOC, other], servers=[])
    with pytest.raises(ValueError, match="path /workflows is in two documents"):
        merge_documents([CLIENT_DOC, CLIENT_DOC], servers=[])
