"""Integration tier: the real handlers with moto, tables and queues built from template.yaml, events from events/,
and the sample remote services as real HTTP servers on 127.0.0.1.

Each function runs under its own role: every AWS call it makes is checked against the policies template.yaml gives
it (devstack.iam), and a test whose functions were refused a call fails at its end, naming each refusal. A test that
means to see a refusal takes it with ``devstack.iam.guard.clear_refusals()``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import boto3
import pytest
from moto import mock_aws

from devstack.agents import load_agents
from devstack.event_sources import HttpApiServer, HttpRoute
from devstack.iam.guard import clear_refusals
from devstack.iam.roles import Principal, principals
from devstack.identities import identity, request_context_authorizer
from devstack.moto_sqs import install as install_sqs_redrive
from devstack.provision import provision
from devstack.template import SqsEventSpec, Stack, remote_service_parameters
from http_server import RunningServer, serve_all
from sasflow.clock import ManualClock
from tests.support.lambdas import ROOT, FunctionUnderTest, SqsDriver


@dataclass
class Deployed:
    """The template 'deployed' into moto, with its functions loaded and a clock the test controls."""

    stack: Stack
    physical: dict[str, str]
    remote: dict[str, RunningServer]
    clock: ManualClock = field(default_factory=lambda: ManualClock(float(int(time.time()))))
    #: Each function's role as template.yaml deploys it; a function missing here runs unchecked.
    roles: dict[str, Principal] = field(default_factory=dict)
    #: The headers of the last response `api` read.
    last_headers: dict[str, str] = field(default_factory=dict)
    _functions: dict[str, FunctionUnderTest] = field(default_factory=dict)

    def fn(self, logical_id: str) -> FunctionUnderTest:
        if logical_id not in self._functions:
            spec = next(f for f in self.stack.functions() if f.logical_id == logical_id)
            self._functions[logical_id] = FunctionUnderTest.load(spec, self.clock, self.roles.get(logical_id))
        return self._functions[logical_id]

    def driver(self, logical_id: str) -> SqsDriver:
        function = self.fn(logical_id)
        event = next(e for e in function.spec.events if isinstance(e, SqsEventSpec))
        return SqsDriver(function, event)

    def pump(self, rounds: int = 50) -> None:
        """Deliver every queue to its consumer (every agent of agents.yaml, then the scheduler) until all are empty
        (bounded)."""
        consumers = [f"{agent.pascal}AgentFunction" for agent in load_agents()] + ["SchedulerFunction"]
        for _ in range(rounds):
            if all(self.driver(c).deliver() is None for c in consumers):
                return
        raise AssertionError("queues did not drain")

    def routes(self) -> list[HttpRoute]:
        """The template's HTTP API routes, most specific first (as API Gateway selects them)."""
        return sorted(HttpApiServer.routes_from_functions(self.stack.functions()), key=HttpRoute.specificity)

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        raw_body: str | None = None,
        caller: str | None = "client-a",
        function: str = "ApiFunction",
        query: str = "",
    ) -> tuple[int, Any]:
        """Invoke the API function with an HTTP API v2 event; return (status, parsed JSON body).

        ``caller`` is the local identity API Gateway verified (devstack.identities); None sends the event without
        one, as a misconfigured route or a direct invocation would.
        """
        # As API Gateway: the most specific route of the template that takes the path, and its decoded parameters
        route, params = path, None
        for candidate in self.routes():
            matched = candidate.match(method, path)
            if matched is not None:
                route, params = candidate.event.path, matched or None
                break
        event: dict[str, Any] = {
            "version": "2.0",
            "routeKey": f"{method} {route}",
            "rawPath": path,
            "rawQueryString": query,
            "headers": {"content-type": "application/json", **{k.lower(): v for k, v in (headers or {}).items()}},
            "requestContext": {
                "accountId": "123456789012",
                "apiId": "local",
                "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1"},
                "requestId": "test",
                "routeKey": f"{method} {route}",
                "stage": "$default",
                "timeEpoch": int(time.time() * 1000),
            },
            "isBase64Encoded": False,
        }
        if caller is not None:
            event["requestContext"]["authorizer"] = request_context_authorizer(identity(caller))
        if params:
            event["pathParameters"] = params
        if raw_body is not None:
            event["body"] = raw_body
        elif body is not None:
            event["body"] = json.dumps(body)
        if query:
            # decoded, as API Gateway gives them (rawQueryString keeps the encoding)
            pairs = (part.split("=", 1) for part in query.split("&"))
            event["queryStringParameters"] = {unquote(key): unquote(value) for key, value in pairs}
        response = self.fn(function).invoke(event)
        self.last_headers = dict(response.get("headers") or {})
        text = response.get("body") or "null"
        return response["statusCode"], json.loads(text)

    def ops(
        self, method: str, path: str, body: Any = None, *, query: str = "", headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """Invoke the operators' function (the /ops routes) as the local operator identity."""
        return self.api(method, path, body, caller="operator", function="OpsFunction", query=query, headers=headers)

    def queue_url(self, logical_id: str) -> str:
        return self.physical[logical_id]

    def depth(self, logical_id: str) -> int:
        attributes = boto3.client("sqs").get_queue_attributes(
            QueueUrl=self.queue_url(logical_id),
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return int(attributes["ApproximateNumberOfMessages"]) + int(attributes["ApproximateNumberOfMessagesNotVisible"])

    def items(self) -> list[dict[str, Any]]:
        table = self.physical["StateTable"]
        client = boto3.client("dynamodb")
        return list(client.scan(TableName=table, ConsistentRead=True)["Items"])


@pytest.fixture
def remote() -> Iterator[dict[str, RunningServer]]:
    servers = serve_all(rng_seed=1)
    try:
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture
def deployed(remote: dict[str, RunningServer]) -> Iterator[Deployed]:
    with mock_aws():
        install_sqs_redrive()
        parameters = remote_service_parameters({name: server.base_url for name, server in remote.items()})
        stack = Stack.from_file(ROOT / "template.yaml", parameters=parameters)
        with roles_checked(stack) as roles:
            yield Deployed(stack, provision(stack), remote, roles=roles)


@contextmanager
def roles_checked(stack: Stack) -> Iterator[dict[str, Principal]]:
    """Each function's role as ``stack`` deploys it; on leaving, every call a role refused fails the test, named."""
    clear_refusals()
    yield principals(stack)
    refused = clear_refusals()
    assert not refused, "calls the functions' roles do not allow:\n" + "\n".join(map(str, refused))
