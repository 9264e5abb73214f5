"""The DynamoDB state store on the table template.yaml declares (moto): conditions, sparse index, sizes, lease."""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

import boto3
import pytest
from moto import mock_aws

from devstack.provision import provision
from devstack.template import Stack
from sasflow.adapters.dynamodb_store import DEADLINE_INDEX, DynamoDBStateStore
from sasflow.adapters.memory import InMemoryBus
from sasflow.clock import ManualClock
from sasflow.definition import parse_definition
from sasflow.errors import ConditionFailedError, LeaseNotAcquiredError, PayloadTooLargeError
from sasflow.messages import canonical_hash, decode_request
from sasflow.scheduler import SchedulerService
from sasflow.settings import EngineConfig
from sasflow.states import StepStatus
from sasflow.supervisor import SupervisorService
from tests.support.lambdas import ROOT
from tests.support.pipeline import TRIP_INPUT, trip_definition

START = 1_800_000_000.0


@dataclass
class Env:
    store: DynamoDBStateStore
    scheduler: SchedulerService
    supervisor: SupervisorService
    bus: InMemoryBus
    clock: ManualClock
    table: str


def build(max_overdue: int = 1000) -> Env:
    stack = Stack.from_file(ROOT / "template.yaml", parameters={"DeploySampleServices": "false"})
    physical = provision(stack)
    config = EngineConfig(
        state_table=physical["StateTable"],
        response_queue_url=physical["ResponseQueue"],
        agent_queue_urls={"flights": "q/flights", "hotels": "q/hotels", "payments": "q/payments"},
        deadline_shards=8,
        max_overdue_per_sweep=max_overdue,
    )
    clock = ManualClock(START)
    store = DynamoDBStateStore(config.state_table, boto3.client("dynamodb"))
    scheduler = SchedulerService(store, clock, config, rng=random.Random(3))
    bus = InMemoryBus()
    return Env(
        store, scheduler, SupervisorService(store, bus, scheduler, clock, config), bus, clock, config.state_table
    )


@pytest.fixture
def env() -> Iterator[Env]:
    with mock_aws():
        yield build()


def start(env: Env, key: str | None = None) -> str:
    body = {"definition": trip_definition(), "input": TRIP_INPUT}
    result = env.scheduler.start_workflow(
        parse_definition(body["definition"]), TRIP_INPUT, request_hash=canonical_hash(body), idempotency_key=key
    )
    return result.workflow.workflow_id


def index_items(table: str) -> list[dict[str, object]]:
    client = boto3.client("dynamodb")
    return list(client.scan(TableName=table, IndexName=DEADLINE_INDEX)["Items"])


def test_complete_by_is_written_as_an_integer_number_and_only_while_in_flight(env: Env) -> None:
    wid = start(env)
    raw = boto3.client("dynamodb").get_item(
        TableName=env.table, Key={"pk": {"S": f"WF#{wid}"}, "sk": {"S": "STEP#reserve_flight"}}
    )
    assert raw["Item"]["complete_by"] == {"N": str(int(START) + 30)}
    assert raw["Item"]["dl_shard"]["S"].isdigit()
    # the step and the workflow's own stall deadline are in the index
    assert sorted(i.get("step", {}).get("S", "<workflow>") for i in index_items(env.table)) == [
        "<workflow>",
        "reserve_flight",
    ]
    snapshot = env.store.load(wid)
    assert snapshot is not None
    record = snapshot.steps["reserve_flight"]
    env.store.put_step(record.evolve(status=StepStatus.COMPLETED, complete_by=None, dl_shard=None), expect=record)
    assert [i.get("step", {}).get("S", "<workflow>") for i in index_items(env.table)] == ["<workflow>"]


def test_wrong_typed_deadline_keys_are_refused_before_dynamodb(env: Env) -> None:
    wid = start(env)
    snapshot = env.store.load(wid)
    assert snapshot is not None
    record = snapshot.steps["reserve_flight"]
    with pytest.raises(TypeError, match="complete_by must be int"):
        env.store.put_step(record.evolve(complete_by=str(record.complete_by)), expect=record)
    with pytest.raises(ValueError, match="milliseconds"):
        env.store.put_step(record.evolve(complete_by=int(START * 1000)), expect=record)
    with pytest.raises(TypeError, match="dl_shard must be str"):
        env.store.put_step(record.evolve(dl_shard=3), expect=record)  # type: ignore[arg-type]


def test_a_stale_expectation_loses_the_conditional_write(env: Env) -> None:
    wid = start(env)
    snapshot = env.store.load(wid)
    assert snapshot is not None
    record = snapshot.steps["reserve_flight"]
    moved = record.evolve(attempt=2, complete_by=record.complete_by + 60)  # type: ignore[operator]
    env.store.put_step(moved, expect=record)
    with pytest.raises(ConditionFailedError):
        env.store.put_step(record.evolve(status=StepStatus.COMPLETED, complete_by=None, dl_shard=None), expect=record)
    with pytest.raises(ConditionFailedError):
        env.store.put_step(record, expect=None)


def test_an_item_over_400_kb_is_refused_and_nothing_is_written(env: Env) -> None:
    wid = start(env)
    snapshot = env.store.load(wid)
    assert snapshot is not None
    record = snapshot.steps["reserve_flight"]
    with pytest.raises(PayloadTooLargeError, match="limit is 409600 bytes"):
        env.store.put_step(record.evolve(input={"blob": "x" * 410_000}), expect=record)
    again = env.store.load(wid)
    assert again is not None and again.steps["reserve_flight"] == record


def test_the_lease_is_exclusive_until_it_expires_and_its_fencing_token_grows(env: Env) -> None:
    now = int(START)
    assert env.store.acquire_lease("supervisor", "a", now, 50) == 1
    with pytest.raises(LeaseNotAcquiredError):
        env.store.acquire_lease("supervisor", "b", now + 10, 50)
    assert env.store.acquire_lease("supervisor", "b", now + 51, 50) == 2
    env.store.release_lease("supervisor", "b", now + 52)
    assert env.store.acquire_lease("supervisor", "a", now + 52, 50) == 3


def test_a_sweep_of_250_overdue_steps_follows_every_page_and_resends_each_once() -> None:
    with mock_aws():
        env = build(max_overdue=100)
        ids = [start(env) for _ in range(250)]
        env.clock.advance(30 + 30 + 1)
        # When three capped runs sweep (100 per run)
        reports = [env.supervisor.sweep() for _ in range(3)]
        # Then each step was resent exactly once, across runs, and no run read more than its cap
        assert [r.overdue for r in reports] == [100, 100, 50]
        assert [r.complete for r in reports] == [False, False, True]
        sent = [decode_request(m.body) for m in env.bus.queues["q/flights"]]
        assert sorted(r.workflow_id for r in sent) == sorted(ids)
        assert {r.attempt for r in sent} == {2}
        for wid in ids[:5]:
            snapshot = env.store.load(wid)
            assert snapshot is not None
            assert (snapshot.steps["reserve_flight"].attempt, snapshot.steps["reserve_flight"].resends) == (2, 1)
        assert env.supervisor.sweep().overdue == 0
