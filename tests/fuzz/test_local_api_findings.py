"""What fuzzing found in the local stack (the HTTP API emulator in devstack.event_sources, and moto), not in the API.

These are not bugs of sasflow.api, so they are pinned here as xfails instead of being fixed by the fuzzing work.
Each asserts what AWS does and fails today, strictly: it turns into an XPASS (a failure, since xfail_strict is on)
the moment the emulator is fixed, which is the signal to drop the marker. (A third finding, moto's TransactWriteItems
racing concurrent writers with 500s, was dropped with the last transaction sasflow made: a start is one PutItem.)
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from typing import Any

import pytest

from devstack.event_sources import HttpApiServer, HttpRoute
from devstack.lambda_runtime import InvokeResult
from devstack.template import HttpApiEventSpec

pytestmark = pytest.mark.integration


class RecordingFunction:
    """An invoker that records each event and answers 200."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def invoke(self, event: Any) -> InvokeResult:
        self.events.append(event)
        payload = {"statusCode": 200, "headers": {"content-type": "application/json"}, "body": "{}"}
        return InvokeResult(ok=True, payload=payload, error=None, duration_ms=1.0, cold_start=False)


@pytest.fixture
def api() -> Iterator[tuple[HttpApiServer, RecordingFunction]]:
    function = RecordingFunction()
    spec = HttpApiEventSpec("HttpApi", "/workflows/{workflow_id}", "GET", name="GetWorkflow", api_id="local")
    server = HttpApiServer([HttpRoute("ApiFunction", spec)], {"ApiFunction": function}, port=0)
    server.start()
    try:
        yield server, function
    finally:
        server.stop()


def send(server: HttpApiServer, method: str, path: str) -> tuple[int, str, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.getheader("content-type") or "", response.read()
    finally:
        connection.close()


def test_the_function_sees_a_decoded_raw_path_like_api_gateway_http_api(
    api: tuple[HttpApiServer, RecordingFunction],
) -> None:
    # Given a schema-valid workflow id with a ':' (the pattern allows [A-Za-z0-9_.:-]), percent-encoded by the client
    server, function = api
    # When it is requested
    status, _, _ = send(server, "GET", "/workflows/a%3Ab")
    # Then the function gets the decoded path, as from API Gateway (its pathParameters are decoded already)
    assert status == 200
    assert function.events[0]["pathParameters"] == {"workflow_id": "a:b"}
    assert function.events[0]["rawPath"] == "/workflows/a:b"


@pytest.mark.xfail(
    strict=True,
    reason="devstack bug: http.server has no do_TRACE, so the emulator answers TRACE with a 501 HTML page; "
    "API Gateway answers a method without a route with 404 and a JSON body",
)
def test_an_undeclared_trace_is_404_json_like_any_method_without_a_route(
    api: tuple[HttpApiServer, RecordingFunction],
) -> None:
    server, function = api
    status, content_type, body = send(server, "TRACE", "/workflows/w-1")
    assert (status, content_type) == (404, "application/json")
    assert json.loads(body) == {"message": "Not Found"}
    assert function.events == []
