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
