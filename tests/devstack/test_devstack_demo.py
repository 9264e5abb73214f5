"""devstack.demo: how `make run` decides that its workflows have finished."""

from __future__ import annotations

import random

import boto3
from moto import mock_aws

from devstack.demo import terminal_count
from devstack.provision import provision
from devstack.template import Stack
from sasflow.adapters.dynamodb_store import DynamoDBStateStore
from sasflow.clock import ManualClock
from sasflow.definition import parse_definition
from sasflow.messages import StepReply, canonical_hash
from sasflow.scheduler import SchedulerService
from sasflow.settings import AgentRoute, EngineConfig
from sasflow.states import Outcome, Phase
from tests.support.lambdas import ROOT
from tests.support.pipeline import ACTIONS, OWNER, TRIP_INPUT, trip_definition


def test_the_demo_counts_the_terminal_workflows_of_the_state_table() -> None:
    # Regression: the count filtered on an attribute the workflow items no longer have, so it stayed 0 and
    # `make run` always waited for its whole 240 s timeout.
    with mock_aws():
        physical = provision(Stack.from_file(ROOT / "template.yaml", parameters={"DeploySampleServices": "false"}))
        store = DynamoDBStateStore(physical["StateTable"], boto3.client("dynamodb"))
        config = EngineConfig(agents={a: AgentRoute(queue_url=f"q/{a}", actions=ACTIONS[a]) for a in ACTIONS})
        scheduler = SchedulerService(store, ManualClock(1_800_000_000.0), config, rng=random.Random(1))
        definition = parse_definition(trip_definition())
        # Given two running trips, one of which finishes
        ids = [
            scheduler.start_workflow(
                definition, TRIP_INPUT, request_hash=canonical_hash(n), owner=OWNER
            ).workflow.workflow_id
            for n in range(2)
        ]
        assert terminal_count(store) == 0
        for step in ("reserve_flight", "book_hotel", "charge_card"):
            scheduler.on_reply(
                StepReply(
                    workflow_id=ids[0],
                    step=step,
                    phase=Phase.ACTION,
                    attempt=1,
                    outcome=Outcome.SUCCEEDED,
                    output={"confirmation": f"{step}-1"},
                )
            )
        # Then the count sees exactly the finished one
        assert terminal_count(store) == 1


def test_the_summary_says_why_fewer_compensations_were_applied_remotely_than_run() -> None:
    # From a clean-clone trial: "compensations run (steps) 23" beside "applied remotely 22", with no word why
    from rich.console import Console

    from devstack.demo import Summary, render
    from travel_services import Outcome as ServiceOutcome

    console = Console(record=True, width=120)
    render(Summary(compensations=23, remote_compensations=22, nothing_to_undo=1), 50, 60.0, console)
    text = console.export_text()
    assert "compensations run (steps)                                 │    23" in text
    assert "compensations applied remotely (an effect undone)         │    22" in text
    assert "compensations with nothing to undo (action never applied) │     1" in text
    assert ServiceOutcome.NOTHING_TO_UNDO.value == "nothing_to_undo"  # the key read_summary counts
