"""agents.yaml is the one place an agent is declared; template.yaml's generated parts follow it."""

from __future__ import annotations

from pathlib import Path

import pytest

from devstack.agents import (
    AGENTS_FILE,
    TEMPLATE_FILE,
    AgentsFileError,
    agent_names,
    check_template,
    load_agents,
    render_template,
)
from devstack.template import SqsEventSpec, Stack, load_template


def test_the_checked_in_template_holds_what_agents_yaml_renders() -> None:
    # make template (python -m devstack template) rewrites it; a stale template.yaml fails here
    assert check_template().current, "template.yaml is out of date: run `make template`"
    assert agent_names() == ["flights", "hotels", "payments", "inventory"]


def test_one_entry_gives_an_agent_every_part_it_needs(tmp_path: Path) -> None:
    # Given agents.yaml with one more entry
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        AGENTS_FILE.read_text()
        + "\ntrains:\n  description: Agent for the trains service.\n  kind: http\n  base_url: parameter\n"
        "  actions: [book_seat, release_seat]\n  auth: none\n"
    )
    # When the template is rendered from it
    template = tmp_path / "template.yaml"
    template.write_text(render_template(TEMPLATE_FILE.read_text(), load_agents(agents)))
    # Then the agent has its queue, DLQ, function, mapping, log group, alarms, parameter, output and its place in
    # the engine's list, and the functions that send step requests may send to its queue
    resources = load_template(template)["Resources"]
    for logical_id in (
        "TrainsRequestQueue",
        "TrainsDeadLetterQueue",
        "TrainsAgentFunction",
        "TrainsAgentRequests",
        "TrainsAgentLogGroup",
        "TrainsAgentFunctionErrorsAlarm",
        "TrainsAgentFunctionThrottlesAlarm",
        "TrainsDeadLetterAlarm",
    ):
        assert logical_id in resources
    sends = resources["AgentRequestQueuesSendPolicy"]["Properties"]["PolicyDocument"]["Statement"][0]["Resource"]
    assert {"Fn::GetAtt": ["TrainsRequestQueue", "Arn"]} in sends
    stack = Stack(
        load_template(template),
        template_dir=TEMPLATE_FILE.parent,
        parameters={"DeploySampleServices": "false", "TrainsBaseUrl": "https://trains.example"},
    )
    engine = stack.function("SchedulerFunction").environment
    assert (
        '"trains": {"queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/sasflow-TrainsRequestQueue"'
        in (engine["AGENTS"])
    )
    agent = stack.function("TrainsAgentFunction")
    assert (agent.environment["AGENT_NAME"], agent.environment["AGENT_ACTIONS"]) == ("trains", "book_seat,release_seat")
    assert agent.environment["REMOTE_BASE_URL"] == "https://trains.example"
    [mapping] = [event for event in agent.events if isinstance(event, SqsEventSpec)]
    assert mapping.queue_logical_id == "TrainsRequestQueue"
    assert "TrainsRequestQueueUrl" in stack.outputs()


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ("trains:\n  description: x\n  base_url: http://trains.example\n  actions: [a]\n", "https URL"),
        ("trains:\n  description: x\n  base_url: parameter\n  actions: []\n", "at least 1 item"),
        ("trains:\n  description: x\n  base_url: parameter\n  actions: [a, a]\n", "listed twice"),
        ("trains:\n  description: x\n  base_url: parameter\n  actions: [a]\n  auth: header\n", "auth_header"),
        ("Trains:\n  description: x\n  base_url: parameter\n  actions: [a]\n", "should match pattern"),
        ("trains:\n  description: x\n  base_url: parameter\n  actions: [a]\n  colour: red\n", "colour"),
        (
            "trains:\n  description: x\n  base_url: parameter\n  actions: [a]\n  concurrency: 11\n",
            "less than or equal to 10",
        ),
        (
            "trains:\n  description: x\n  base_url: parameter\n  actions: [a]\n  concurrency: 0\n",
            "greater than or equal to 1",
        ),
        # found by a trial: YAML's true was taken for 1 call in flight
        ("trains:\n  description: x\n  base_url: parameter\n  actions: [a]\n  max_in_flight: true\n", "valid integer"),
        (
            "trains:\n  description: x\n  base_url: parameter\n  actions: [a]\n  max_in_flight: 5\n  rate: 10\n"
            "  burst: 2\n",
            "burst \\(2\\) must be at least max_in_flight \\(5\\)",
        ),
        (
            "trains:\n  description: x\n  base_url: parameter\n  actions: [a]\n  call_wait_seconds: 1\n",
            "declare them with it",
        ),
    ],
)
def test_a_bad_entry_is_refused_with_the_agent_and_the_reason(tmp_path: Path, entry: str, reason: str) -> None:
    agents = tmp_path / "agents.yaml"
    agents.write_text(entry)
    with pytest.raises(AgentsFileError, match=reason):
        load_agents(agents)


def test_an_agent_works_on_its_batch_at_once_10_for_http_1_for_python_unless_agents_yaml_says(tmp_path: Path) -> None:
    # Given agents.yaml with an HTTP agent that lowers its concurrency to 3
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        AGENTS_FILE.read_text()
        + "\ntrains:\n  description: Agent for the trains service.\n  base_url: parameter\n  actions: [book_seat]\n"
        "  concurrency: 3\n"
    )
    template = tmp_path / "template.yaml"
    template.write_text(render_template(TEMPLATE_FILE.read_text(), load_agents(agents)))
    stack = Stack(
        load_template(template),
        template_dir=TEMPLATE_FILE.parent,
        parameters={"DeploySampleServices": "true", "TrainsBaseUrl": "https://trains.example"},
    )
    # Then each agent's function says how many records it works on at once
    at_once = {
        name: stack.function(f"{name[:1].upper()}{name[1:]}AgentFunction").environment["AGENT_CONCURRENCY"]
        for name in ("flights", "hotels", "payments", "inventory", "trains")
    }
    assert at_once == {"flights": "10", "hotels": "10", "payments": "10", "inventory": "1", "trains": "3"}


def test_an_agents_call_limits_and_its_wait_reach_its_functions_environment(tmp_path: Path) -> None:
    # Given an agent declaring limits and how long a record waits for them (a trial found CALL_WAIT_SECONDS settable
    # only by hand in template.yaml's generated part, which `make template` overwrites)
    agents = tmp_path / "agents.yaml"
    agents.write_text(
        AGENTS_FILE.read_text()
        + "\ntrains:\n  description: Agent for the trains service.\n  base_url: parameter\n  actions: [book_seat]\n"
        "  max_in_flight: 3\n  rate: 2.5\n  call_wait_seconds: 0.5\n"
    )
    template = tmp_path / "template.yaml"
    template.write_text(render_template(TEMPLATE_FILE.read_text(), load_agents(agents)))
    stack = Stack(
        load_template(template),
        template_dir=TEMPLATE_FILE.parent,
        parameters={"DeploySampleServices": "true", "TrainsBaseUrl": "https://trains.example"},
    )
    # Then its function's environment holds them, and an agent without limits has none
    environment = stack.function("TrainsAgentFunction").environment
    assert {
        name: environment.get(name) for name in ("MAX_IN_FLIGHT", "CALL_RATE", "CALL_BURST", "CALL_WAIT_SECONDS")
    } == {
        "MAX_IN_FLIGHT": "3",
        "CALL_RATE": "2.5",
        "CALL_BURST": None,
        "CALL_WAIT_SECONDS": "0.5",
    }
    assert "MAX_IN_FLIGHT" not in stack.function("FlightsAgentFunction").environment


def test_a_template_without_the_markers_is_refused() -> None:
    with pytest.raises(AgentsFileError, match="agents:parameters"):
        render_template("Resources: {}\n", load_agents())
