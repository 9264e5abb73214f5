"""One edit adds an agent: a copy of the template rendered from agents.yaml plus one entry runs a workflow through the
new agent on the local stack (issue 12, "Agents declared once")."""

from __future__ import annotations

import time
from pathlib import Path

from devstack.agents import AGENTS_FILE, TEMPLATE_FILE, load_agents, render_template
from devstack.client import SignedHttp
from devstack.stack import LocalStack
from devstack.template import remote_service_parameters
from http_server import serve_all
from tests.support.lambdas import ROOT

TRAINS = """
trains:
  description: Agent for the trains service.
  kind: http
  base_url: parameter
  actions: [book, cancel_booking]
  auth: none
"""


def test_one_entry_in_agents_yaml_adds_an_agent_that_runs_a_workflow_on_the_local_stack(tmp_path: Path) -> None:
    # Given a temporary copy of the project's template, rendered from agents.yaml with one more entry (the code
    # directories linked, as the template names them relative to itself)
    agents = tmp_path / "agents.yaml"
    agents.write_text(AGENTS_FILE.read_text() + TRAINS)
    template = tmp_path / "template.yaml"
    template.write_text(render_template(TEMPLATE_FILE.read_text(), load_agents(agents)))
    for directory in ("functions", "layers"):
        (tmp_path / directory).symlink_to(ROOT / directory, target_is_directory=True)
    servers = serve_all(rng_seed=9)
    # the trains service: the sample hotels server answers its book and cancel_booking
    parameters = {
        **remote_service_parameters({name: server.base_url for name, server in servers.items()}),
        "TrainsBaseUrl": servers["hotels"].base_url,
        "LogLevel": "WARN",
    }
    try:
        with LocalStack(
            template, parameters, schedule_interval_seconds=2.0, max_workers_per_function=1, sqs_concurrency=1
        ) as stack:
            assert "TrainsAgentFunction" in stack.pools
            api = SignedHttp(stack.api_url)
            definition = {
                "name": "by-train",
                "steps": [
                    {
                        "name": "book_seat",
                        "agent": "trains",
                        "action": "book",
                        "input": {"traveller.$": "input.traveller", "nights": 1, "flight": "none"},
                        "compensation": {"action": "cancel_booking"},
                    }
                ],
            }
            # When a workflow that names the new agent is started
            status, view = api.post("/workflows", {"definition": definition, "input": {"traveller": "Ada"}})
            assert status == 201, view
            deadline = time.monotonic() + 60
            while view["status"] != "COMPLETED" and time.monotonic() < deadline:
                time.sleep(0.2)
                _, view = api.get(f"/workflows/{view['workflow_id']}")
            # Then it completes through the new agent's queue and function
            assert view["status"] == "COMPLETED"
            assert stack.pools["TrainsAgentFunction"].invocation_count() >= 1
            assert servers["hotels"].service.stats()["calls"] == 1
    finally:
        for server in servers.values():
            server.stop()
