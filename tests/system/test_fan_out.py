"""System tier: a wide fan-out on the local stack (parallel steps whose replies land in concurrent scheduler batches).

Regression: with one item per workflow, the replies of 50 parallel steps made concurrent scheduler invocations lose
each other's conditional writes until some replies gave up and waited for a supervisor resend (about 120 s instead
of about 10 s). Replies of one workflow in a batch are now applied together, and a lost write backs off with jitter.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from devstack.stack import LocalStack
from devstack.template import remote_service_parameters
from http_server import serve_all
from tests.system.test_local_stack import Api

AGENTS = {"flights": "reserve", "hotels": "book", "payments": "charge"}


def fan_out(width: int) -> dict[str, Any]:
    agents = list(AGENTS)
    steps = [
        {
            "name": f"s{i}",
            "agent": agents[i % 3],
            "action": AGENTS[agents[i % 3]],
            "input": {"traveller.$": "input.traveller"},
            "depends_on": [],
            # Long enough that a resend can only come from a reply that was really not applied, not from a slow CI.
            "timeout_seconds": 120,
        }
        for i in range(width)
    ]
    return {"definition": {"name": "fan-out", "version": 1, "steps": steps}, "input": {"traveller": "Ada"}}


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    servers = serve_all(rng_seed=3)
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "LogLevel": "WARN",
    }
    try:
        with LocalStack(parameters=parameters) as stack:  # 2 concurrent batches per queue, as by default
            yield Api(stack.api_url)
    finally:
        for server in servers.values():
            server.stop()


def test_five_workflows_of_50_parallel_steps_complete_without_a_single_resend(api: Api) -> None:
    # Given 5 workflows of 50 steps (the most a definition may have) that all start at once
    ids = []
    for _ in range(5):
        status, view = api.post("/workflows", fan_out(50))
        assert status == 201
        ids.append(view["workflow_id"])
    # When they run
    views = [api.wait(workflow_id, timeout=240) for workflow_id in ids]
    # Then each completed with every step on its first attempt: every reply was applied, none waited for the
    # supervisor
    assert [v["status"] for v in views] == ["COMPLETED"] * 5
    assert {(s["status"], s["attempt"], s["resends"]) for v in views for s in v["steps"]} == {("COMPLETED", 1, 0)}
