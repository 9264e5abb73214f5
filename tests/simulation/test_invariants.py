"""The simulation's invariant checks on hand-made cases (the runs in test_simulation.py exercise them on seeds)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import simulation.invariants
from bench.scenarios import callback_definition
from sasflow.definition import parse_definition
from sasflow.history import HistoryEvent

T0 = 1_800_000_000


@pytest.mark.parametrize(("outages", "explained"), [([(T0 + 100, T0 + 1000)], True), ([], False)])
def test_a_callback_steps_notification_deferred_by_an_outage_of_its_agent_explains_the_unwind(
    monkeypatch: pytest.MonkeyPatch, outages: list[tuple[int, int]], explained: bool
) -> None:
    # Found by make sim, seed 62: the approval step's notification (through the payments agent) was deferred by its
    # open circuit through a 15-minute outage of payments until its deferrals ran out; the check looked for the
    # step's own agent, which a callback step does not have, and called the unwind unexplained.
    definition = parse_definition(callback_definition(3))
    assert definition.step("approval").notify.agent == "payments"
    snapshot = SimpleNamespace(workflow=SimpleNamespace(definition=definition))
    remotes = {"payments": SimpleNamespace(outages=outages), "flights": SimpleNamespace(outages=[])}
    sim = SimpleNamespace(remotes=remotes)
    deferred = HistoryEvent(
        seq=9, time=T0 + 279, kind="reply_applied", step="approval", phase="action", attempt=2, outcome="deferred"
    )
    monkeypatch.setattr(simulation.invariants, "events_of", lambda _: [deferred])
    assert simulation.invariants._in_outage(sim, snapshot, "approval", 2) is explained  # type: ignore[arg-type]
