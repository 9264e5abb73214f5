"""The deterministic fault-injection simulation, small enough for `make test` (`make sim` runs >= 10,000)."""

from __future__ import annotations

import pytest
from boto3.dynamodb.types import TypeSerializer

from sasflow.adapters.dynamodb_store import DynamoDBStateStore, workflow_item
from sasflow.records import Snapshot
from simulation.run import Simulation, run_one
from simulation.world import Faults

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_a_seeded_run_with_every_fault_switched_on_breaks_no_invariant(seed: int) -> None:
    report = run_one(seed, 100)
    assert report.violations == [], report.replay_command()
    assert sum(report.statuses.values()) == 100
    injected = set(report.faults)
    assert {
        "crash before DynamoDB call",
        "crash after DynamoDB call",
        "duplicate delivery",
        "delayed delivery",
    } <= injected


def test_a_seed_replays_exactly() -> None:
    first = Simulation(5, 10).run()
    second = Simulation(5, 10).run()
    assert (first.statuses, first.faults, first.invocations, first.ticks) == (
        second.statuses,
        second.faults,
        second.invocations,
        second.ticks,
    )


def test_without_faults_every_trip_completes() -> None:
    report = Simulation(3, 10, Faults.none()).run()
    assert report.violations == []
    assert report.statuses == {"COMPLETED": 10}
    assert report.dead_letters == 0


def test_a_lost_update_is_caught_when_workflow_writes_are_not_conditional(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation check: with the version condition taken off the workflow write, two schedulers that read the same
    version both commit (the join race of parallel replies, a reply racing the supervisor); the simulation's
    targeted interleave (a second scheduler between the first one's read and write) must expose that as a
    violation of invariant 9 (stale reads and the other interleaves expose more). Lost updates heal themselves
    (the supervisor resends, the agent answers from its idempotency record), so no other invariant sees them."""

    def unconditional_save(self: DynamoDBStateStore, snapshot: Snapshot, expect: Snapshot) -> Snapshot:
        version = expect.version + 1
        item = workflow_item(snapshot, version=version, shards=self.shards)
        self.client.put_item(TableName=self.table, Item=TypeSerializer().serialize(item)["M"])
        return Snapshot(snapshot.workflow, snapshot.steps, version=version)

    monkeypatch.setattr(DynamoDBStateStore, "save", unconditional_save)
    report = run_one(2, 60)
    assert report.faults["concurrent instance took a message of the same workflow"] >= 1
    assert {v.kind for v in report.violations} == {"lost update"}
