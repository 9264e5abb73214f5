"""A circuit probe reports what it did, and instances that lose the probe race wait for the real reopening."""

from __future__ import annotations

import pytest

from sasflow.breaker import BreakerRecord, BreakerState, CircuitBreaker
from sasflow.clock import ManualClock
from sasflow.errors import CircuitOpenError
from sasflow.states import Outcome, StepStatus, WorkflowStatus
from tests.support.fakes import InMemoryBreakerStore
from tests.support.pipeline import Pipeline

START = 1_800_000_000.0


def cooled_down_breaker(p: Pipeline, agent: str) -> None:
    """An open breaker whose open period has just ended: the next call is the half-open probe."""
    for _ in range(5):
        p.breakers.record_failure(agent)
    record = BreakerRecord(BreakerState.OPEN, 5, p.clock.now() - 1, 0.0)
    assert p.breakers.transition(agent, BreakerRecord(), record)


def test_a_probe_that_times_out_is_reported_as_a_call_whose_outcome_is_unknown_and_the_step_is_compensated() -> None:
    # Given the flights breaker ready for its half-open probe, and a service that takes the probe and times out
    p = Pipeline(clock=ManualClock(START))
    cooled_down_breaker(p, "flights")
    p.services["flights"].script["reserve"] = ["timeout", "reject"]
    wid = p.start()
    # When the agent probes: the call times out, the breaker reopens, and the retry meets the open circuit
    [deferred] = p.run_agent("flights")
    p.run_scheduler()
    # Then the reply is DEFERRED but says one call was made whose outcome is unknown, and the step remembers it
    assert (deferred.outcome, deferred.calls, deferred.outcome_unknown) == (Outcome.DEFERRED, 1, True)
    assert p.breakers.get("flights").state is BreakerState.OPEN
    record = p.snapshot(wid).steps["reserve_flight"]
    assert (record.status, record.attempt, record.deferrals, record.may_have_happened) == (
        StepStatus.PROCESSING,
        1,
        1,
        True,
    )
    # and when the next try is refused, the step is still compensated: the probe may have taken effect
    p.clock.advance(31)
    p.pump()
    final = p.snapshot(wid)
    assert final.workflow.status is WorkflowStatus.COMPENSATED
    assert final.steps["reserve_flight"].status is StepStatus.COMPENSATED
    assert p.services["flights"].actions() == ["reserve", "reserve", "cancel_reservation"]


def test_an_instance_that_loses_the_probe_race_waits_for_the_breakers_real_reopening() -> None:
    # Given two agent instances that both saw the breaker open and cooled down
    clock = ManualClock(START)
    store = InMemoryBreakerStore()
    for _ in range(5):
        store.record_failure("flights")
    assert store.transition("flights", BreakerRecord(), BreakerRecord(BreakerState.OPEN, 5, START - 1, 0.0))
    winner = CircuitBreaker("flights", store, clock, open_seconds=30, probe_seconds=10, cache_seconds=60)
    loser = CircuitBreaker("flights", store, clock, open_seconds=30, probe_seconds=10, cache_seconds=60)
    assert loser.state is BreakerState.OPEN  # its cached view
    # When the winner takes the probe, which fails and reopens the breaker for 30 s
    winner.before_call()
    winner.on_failure()
    assert store.get("flights").state is BreakerState.OPEN
    # Then the loser, whose view is stale, waits until the breaker really reopens, not a guessed probe period
    with pytest.raises(CircuitOpenError) as deferred:
        loser.before_call()
    assert deferred.value.retry_at == int(START) + 30
    assert deferred.value.retry_at != int(START) + 10
