"""The sample services' function under its own role (DeploySampleServices=true, the template's default): its ledger
reads and writes are checked against its policies like every other function's (docs/security.md)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from moto import mock_aws

from devstack.provision import provision
from devstack.template import Stack
from tests.integration.conftest import Deployed, roles_checked
from tests.sample_services.test_sample_services_handler import http_api_event
from tests.support.lambdas import ROOT


@pytest.fixture
def sample_stack() -> Iterator[Deployed]:
    with mock_aws():
        stack = Stack.from_file(ROOT / "template.yaml", parameters={"DeploySampleServices": "true"})
        with roles_checked(stack) as roles:
            yield Deployed(stack, provision(stack), {}, roles=roles)


def test_a_charge_and_its_replay_are_served_within_the_sample_services_role(sample_stack: Deployed) -> None:
    function = sample_stack.fn("SampleServicesFunction")
    assert function.principal is not None and function.principal.role == "SampleServicesFunctionRole"
    body = json.dumps({"token": "t-1", "workflow_id": "wf", "step": "s", "input": {}, "original_token": None})
    event = http_api_event("payments", "charge", body, {"Idempotency-Key": "t-1"})
    first = function.invoke(event)
    again = function.invoke(event)
    assert (first["statusCode"], json.loads(first["body"])["replayed"]) == (200, False)
    assert (again["statusCode"], json.loads(again["body"])["replayed"]) == (200, True)
