"""devstack.event_sources.HttpApiServer: API Gateway HTTP API payload 2.0 on loopback."""

from __future__ import annotations

import base64
import http.client
import json
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from aws_lambda_powertools.utilities.parser.models import APIGatewayProxyEventV2Model

from devstack.event_sources import MAX_HTTP_BODY_BYTES, HttpApiServer, HttpRoute, http_api_response
from devstack.lambda_runtime import InvokeResult
from devstack.template import HttpApiEventSpec

API_ID = "abcde12345"


class FakeFunction:
    """Records each event; answers with ``respond(event)``."""

    def __init__(self, respond: Callable[[dict[str, Any]], Any] | None = None, ok: bool = True) -> None:
        self.respond = respond or (lambda event: {"statusCode": 200, "body": "fine"})
        self.ok = ok
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def invoke(self, event: Any) -> InvokeResult:
        with self._lock:
            self.events.append(event)
        if not self.ok:
            return InvokeResult(ok=False, payload={}, error="ValueError: x", duration_ms=1.0, cold_start=False)
        return InvokeResult(ok=True, payload=self.respond(event), error=None, duration_ms=1.0, cold_start=False)


def route(function: str, method: str, path: str) -> HttpRoute:
    return HttpRoute(function, HttpApiEventSpec("Api", path, method, name=f"{method}{path}", api_id=API_ID))


@pytest.fixture
def functions() -> dict[str, FakeFunction]:
    return {"Workflows": FakeFunction(), "Special": FakeFunction(), "Proxy": FakeFunction()}


@pytest.fixture
def server(functions: dict[str, FakeFunction]) -> Iterator[HttpApiServer]:
    routes = [
        route("Workflows", "POST", "/workflows"),
        route("Workflows", "GET", "/workflows/{workflow_id}"),
        route("Special", "GET", "/workflows/special"),
        route("Proxy", "ANY", "/files/{proxy+}"),
    ]
    api = HttpApiServer(routes, functions, port=0)
    api.start()
    try:
        yield api
    finally:
        api.stop()


def request(
    api: HttpApiServer, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes, http.client.HTTPMessage]:
    connection = http.client.HTTPConnection("127.0.0.1", api.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        data = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, data, response.msg
    finally:
        connection.close()


def test_request_becomes_a_payload_2_event(server: HttpApiServer, functions: dict[str, FakeFunction]) -> None:
    # Given a POST with a query string, repeated parameters, cookies and a JSON body
    body = json.dumps({"definition": "trip"}).encode()
    status, _, _, _ = request(
        server,
        "POST",
        "/workflows?b=2&a=1&a=3",
        body=body,
        headers={"Content-Type": "application/json", "X-Custom": "Yes", "Cookie": "s=1; t=2", "User-Agent": "t/1"},
    )
    assert status == 200

    # Then the function got API Gateway's v2 proxy event
    event = functions["Workflows"].events[0]
    assert event["version"] == "2.0"
    assert event["routeKey"] == "POST /workflows"
    assert (event["rawPath"], event["rawQueryString"]) == ("/workflows", "b=2&a=1&a=3")
    assert event["queryStringParameters"] == {"b": "2", "a": "1,3"}
    assert event["cookies"] == ["s=1", "t=2"]
    assert event["headers"]["x-custom"] == "Yes"
    assert event["headers"]["content-type"] == "application/json"
    assert "cookie" not in event["headers"]
    assert all(name == name.lower() for name in event["headers"])
    assert (event["body"], event["isBase64Encoded"]) == (body.decode(), False)
    assert "pathParameters" not in event
    context = event["requestContext"]
    assert (context["accountId"], context["apiId"], context["stage"]) == ("123456789012", API_ID, "$default")
    assert context["routeKey"] == "POST /workflows"
    assert context["http"] == {
        "method": "POST",
        "path": "/workflows",
        "protocol": "HTTP/1.1",
        "sourceIp": "127.0.0.1",
        "userAgent": "t/1",
    }
    assert isinstance(context["timeEpoch"], int) and context["requestId"]
    assert context["domainName"] == f"127.0.0.1:{server.port}"
    parsed = APIGatewayProxyEventV2Model.model_validate(event)  # powertools' model of the same event
    assert parsed.requestContext.http.method == "POST"


def test_routes_pick_the_most_specific_match(server: HttpApiServer, functions: dict[str, FakeFunction]) -> None:
    assert request(server, "GET", "/workflows/special")[0] == 200
    assert request(server, "GET", "/workflows/wf%2D42")[0] == 200
    assert request(server, "DELETE", "/files/a/b/c.txt")[0] == 200
    assert [e["routeKey"] for e in functions["Special"].events] == ["GET /workflows/special"]
    read = functions["Workflows"].events[0]
    assert (read["routeKey"], read["pathParameters"], read["rawPath"]) == (
        "GET /workflows/{workflow_id}",
        {"workflow_id": "wf-42"},
        "/workflows/wf-42",  # percent-decoded, as API Gateway's HTTP API passes rawPath
    )
    proxied = functions["Proxy"].events[0]
    assert (proxied["routeKey"], proxied["pathParameters"]) == ("ANY /files/{proxy+}", {"proxy": "a/b/c.txt"})


def test_unknown_route_is_404_and_nothing_is_invoked(server: HttpApiServer, functions: dict[str, FakeFunction]) -> None:
    status, headers, data, _ = request(server, "GET", "/nowhere")
    assert (status, json.loads(data), headers["content-type"]) == (404, {"message": "Not Found"}, "application/json")
    assert request(server, "PUT", "/workflows")[0] == 404  # path exists, method does not
    assert all(not function.events for function in functions.values())


def test_binary_request_body_is_base64(server: HttpApiServer, functions: dict[str, FakeFunction]) -> None:
    payload = bytes(range(256))
    request(server, "POST", "/workflows", body=payload, headers={"Content-Type": "application/octet-stream"})
    event = functions["Workflows"].events[0]
    assert event["isBase64Encoded"] is True
    assert base64.b64decode(event["body"]) == payload


def test_response_mapping_status_headers_cookies_and_base64(
    server: HttpApiServer, functions: dict[str, FakeFunction]
) -> None:
    functions["Workflows"].respond = lambda event: {
        "statusCode": 201,
        "headers": {"content-type": "text/plain", "x-trace": "t1"},
        "cookies": ["a=1; Path=/", "b=2"],
        "body": base64.b64encode(b"created").decode(),
        "isBase64Encoded": True,
    }
    status, headers, data, message = request(server, "POST", "/workflows", body=b"{}")
    assert (status, data) == (201, b"created")
    assert (headers["content-type"], headers["x-trace"]) == ("text/plain", "t1")
    assert message.get_all("set-cookie") == ["a=1; Path=/", "b=2"]
    assert headers["apigw-requestid"] == functions["Workflows"].events[0]["requestContext"]["requestId"]


@pytest.mark.parametrize(
    ("result", "body"),
    [
        ({"workflow_id": "w1"}, b'{"workflow_id": "w1"}'),
        ([1, 2], b"[1, 2]"),
        ("plain text", b"plain text"),
    ],
)
def test_a_result_without_status_code_is_200_json(
    server: HttpApiServer, functions: dict[str, FakeFunction], result: Any, body: bytes
) -> None:
    functions["Workflows"].respond = lambda event: result
    status, headers, data, _ = request(server, "POST", "/workflows", body=b"{}")
    assert (status, headers["content-type"], data) == (200, "application/json", body)


def test_invocation_error_is_500(server: HttpApiServer, functions: dict[str, FakeFunction]) -> None:
    functions["Workflows"].ok = False
    status, _, data, _ = request(server, "POST", "/workflows", body=b"{}")
    assert (status, json.loads(data)) == (500, {"message": "Internal Server Error"})


def test_malformed_response_is_500(server: HttpApiServer, functions: dict[str, FakeFunction]) -> None:
    functions["Workflows"].respond = lambda event: {"statusCode": 200, "body": {"not": "a string"}}
    status, _, data, _ = request(server, "POST", "/workflows", body=b"{}")
    assert (status, json.loads(data)) == (500, {"message": "Internal Server Error"})


def test_a_10_mib_body_is_read_fully(server: HttpApiServer, functions: dict[str, FakeFunction]) -> None:
    payload = b"x" * MAX_HTTP_BODY_BYTES
    status, _, _, _ = request(server, "POST", "/workflows", body=payload, headers={"Content-Type": "text/plain"})
    assert status == 200
    assert len(functions["Workflows"].events[0]["body"]) == MAX_HTTP_BODY_BYTES


def test_a_body_over_10_mib_is_413(server: HttpApiServer, functions: dict[str, FakeFunction]) -> None:
    # Given a request that declares one byte more than the quota (the server answers before reading it)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(
            f"POST /workflows HTTP/1.1\r\nHost: x\r\nContent-Length: {MAX_HTTP_BODY_BYTES + 1}\r\n\r\n".encode()
        )
        response = b""
        while b"\r\n\r\n" not in response or not response.rstrip().endswith(b"}"):
            chunk = sock.recv(65536)
            if not chunk:
                break
            response += chunk
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413")
    assert json.loads(body) == {"message": "Request Entity Too Large"}
    assert not functions["Workflows"].events


def test_chunked_request_body(server: HttpApiServer, functions: dict[str, FakeFunction]) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request(
            "POST", "/workflows", body=iter([b'{"a":', b" 1}"]), headers={"Content-Type": "application/json"},
            encode_chunked=True,
        )  # fmt: skip
        assert connection.getresponse().status == 200
    finally:
        connection.close()
    assert functions["Workflows"].events[0]["body"] == '{"a": 1}'


def test_duplicate_route_keys_are_refused() -> None:
    routes = [route("A", "GET", "/x"), route("B", "GET", "/x")]
    with pytest.raises(ValueError, match="declared by A and B"):
        HttpApiServer(routes, {"A": FakeFunction(), "B": FakeFunction()})


def test_response_mapping_rules() -> None:
    assert http_api_response({"statusCode": 204}) == (204, [], b"")
    assert http_api_response(None) == (200, [("content-type", "application/json")], b"null")
    with pytest.raises(ValueError, match="statusCode"):
        http_api_response({"statusCode": "abc"})
