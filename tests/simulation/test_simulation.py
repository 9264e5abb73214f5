"""The deterministic fault-injection simulation, small enough for `make test` (`make sim` runs >= 10,000)."""

from __future__ import annotations

import pytest

from simulation.run import Simulation, run_one
from simulation.world import Faults

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("seed", [11, 12])
def test_a_seeded_run_with_every_fault_switched_on_breaks_no_invariant(seed: int) -> None:
    report = run_one(seed, 30)
    assert report.violations == [], report.replay_command()
    assert sum(report.statuses.values()) == 30
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
