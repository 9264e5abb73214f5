"""The deterministic fault-injection simulation, small enough for `make test` (`make sim` runs >= 10,000)."""

from __future__ import annotations

import pytest

from sasflow.ports import Outgoing
from sasflow.records import Snapshot, StepRecord
from sasflow.scheduler import SchedulerService
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


def test_the_join_race_is_caught_when_the_scheduler_advances_from_a_stale_view(monkeypatch: pytest.MonkeyPatch) -> None:
    """Mutation check: without the re-read after a parallel step's write, joins stall and only the safety net ends
    them; the simulation's targeted interleave (a second scheduler between the first one's read and write) must
    expose that as a violation of invariant 8."""

    def advance_from_the_loaded_view(self: SchedulerService, snapshot: Snapshot, written: StepRecord) -> list[Outgoing]:
        return self.advance(snapshot.with_step(written))

    monkeypatch.setattr(SchedulerService, "_advance_after_write", advance_from_the_loaded_view)
    report = run_one(1, 60)
    assert report.faults["concurrent instance took a message of the same workflow"] >= 1
    assert {v.kind for v in report.violations} == {"rescued by the stall safety net without a dead letter"}
