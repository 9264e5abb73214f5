"""Agents authenticate to their remote services (none, SigV4, a secret header), and errors name no connection."""

from __future__ import annotations

import http.server
import json
import socket
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import boto3
import pytest
from moto import mock_aws

from devstack.identities import identity, verify
from sasflow.adapters.http_remote import HeaderAuth, HttpRemoteClient, SigV4Auth
from sasflow.adapters.secrets import secret_reader
from sasflow.errors import RemoteRejectedError, RemoteTransientError
from sasflow.messages import StepRequest
from sasflow.states import Phase


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, Any]]] = []

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("content-length") or 0))
        headers = list(self.headers.items())
        try:
            caller = verify("POST", f"http://{self.headers['host']}{self.path}", headers, body, region="us-east-1")
        except Exception as error:  # an unsigned or badly signed call: IAM's 403
            type(self).seen.append({"refused": str(error), "headers": dict(headers)})
            self._answer(403, {"message": "Forbidden"})
            return
        type(self).seen.append({"caller": caller.arn, "headers": dict(headers)})
        self._answer(200, {"confirmation": "FL-1"})

    def _answer(self, status: int, document: Any) -> None:
        data = json.dumps(document).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def service() -> Iterator[str]:
    _Recorder.seen = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/sample/flights"
    finally:
        server.shutdown()
        server.server_close()


def request() -> StepRequest:
    return StepRequest(
        workflow_id="w-1",
        step="reserve_flight",
        phase=Phase.ACTION,
        agent="flights",
        action="reserve",
        attempt=1,
        complete_by=1_800_000_030,
        token="t-1",
        input={"traveller": "Ada"},
    )


class _FrozenCredentials:
    def __init__(self, name: str) -> None:
        self._credentials = identity(name).credentials

    def get_frozen_credentials(self) -> Any:
        return self._credentials


def test_a_sigv4_agent_signs_every_call_and_the_service_verifies_it(service: str) -> None:
    client = HttpRemoteClient(service, auth=SigV4Auth(lambda: _FrozenCredentials("client-a"), "us-east-1"))
    assert client.call(request(), timeout_seconds=5) == {"confirmation": "FL-1"}
    [seen] = _Recorder.seen
    assert seen["caller"] == "arn:aws:iam::123456789012:user/client-a"
    assert seen["headers"]["Authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIALOCALCLIENTA0001/")
    assert seen["headers"]["Idempotency-Key"] == "t-1"


def test_an_unsigned_call_to_a_service_behind_iam_is_a_permanent_rejection(service: str) -> None:
    with pytest.raises(RemoteRejectedError) as refused:
        HttpRemoteClient(service).call(request(), timeout_seconds=5)
    assert (refused.value.status, refused.value.code) == (403, "HTTP_403")
    assert "refused" in _Recorder.seen[0]


def test_a_header_agent_sends_the_secret_it_reads_once_per_cache_period(service: str) -> None:
    with mock_aws():
        secrets = boto3.client("secretsmanager", region_name="us-east-1")
        secrets.create_secret(Name="flights-api-key", SecretString="key-1")
        read = secret_reader("secretsmanager:flights-api-key", max_age=300)
        client = HttpRemoteClient(service, auth=HeaderAuth("X-Api-Key", read))
        with pytest.raises(RemoteRejectedError):  # the recorder wants SigV4; what matters is the header it got
            client.call(request(), timeout_seconds=5)
        secrets.put_secret_value(SecretId="flights-api-key", SecretString="key-2")
        with pytest.raises(RemoteRejectedError):
            client.call(request(), timeout_seconds=5)
    assert [seen["headers"]["X-Api-Key"] for seen in _Recorder.seen] == ["key-1", "key-1"]  # cached for 300 s
    with pytest.raises(ValueError, match="secretsmanager:<id> or ssm:<name>"):
        secret_reader("vault:flights", max_age=1)


def test_a_connection_failure_reaches_the_step_without_the_host_or_port() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(RemoteTransientError) as failed:
        HttpRemoteClient(f"http://127.0.0.1:{port}").call(request(), timeout_seconds=2)
    message = str(failed.value)
    assert message.startswith("connection failed (")
    assert "127.0.0.1" not in message and str(port) not in message
