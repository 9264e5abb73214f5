"""A step deferred by its agent's call limits (issue 38): no attempt used, no budget, its complete-by moved."""

from __future__ import annotations

import random
from typing import Any

from sasflow.call_limits import CallLimiter, CallLimits, Permit
from sasflow.clock import ManualClock
from sasflow.states import Outcome, StepStatus, WorkflowStatus
from tests.support.fakes import InMemoryLimitsStore
from tests.support.pipeline import Pipeline, trip_definition

START = 1_800_000_000.0


def one_call_held_elsewhere(p: Pipeline, agent: str, **ours: Any) -> tuple[CallLimiter, Permit]:
    """``agent`` limited to one call in flight, that unit held by another instance (returned with its permit), and
    ``p``'s agent on a limiter of its own (``ours``: its options)."""
    store = InMemoryLimitsStore()
    limits = CallLimits(max_in_flight=1)
    other = CallLimiter(agent, limits, store, p.clock, holder="other", rng=random.Random(1))
    held = other.acquire(1.0, START + 3_600)
    limiter = CallLimiter(agent, limits, store, p.clock, holder="ours", rng=random.Random(2), **ours)
    p.runtimes[agent] = p.runtime(agent, limiter=limiter)
    return other, held


def test_a_busy_service_defers_its_step_without_an_attempt_and_past_the_deferral_budget() -> None:
    # Given a flights agent limited to one call in flight, and another instance holding that unit for a while
    p = Pipeline(clock=ManualClock(START))
    # (the limiter counts to the agent's metrics, as build_agent wires it: a deferral is counted once)
    other, held = one_call_held_elsewhere(p, "flights", metrics=p.count)
    wid = p.start()
    deferrals = p.config.max_deferrals + 5
    for n in range(1, deferrals + 1):
        # When the agent finds the service at its limit, again and again (the other instance renews its lease)
        with held:
            pass
        held = other.acquire(1.0, p.clock.now() + 3_600)
        [reply] = p.run_agent("flights")
        assert (reply.outcome, reply.deferred_by, reply.calls) == (Outcome.DEFERRED, "limit", 0)
        p.run_scheduler()
        record = p.snapshot(wid).steps["reserve_flight"]
        # Then the same attempt waits its turn: no attempt, no deferral of the circuit's budget, complete-by moved
        wait = reply.retry_after_seconds
        assert wait is not None and wait >= 1
        assert (record.status, record.attempt, record.deferrals, record.limit_deferrals) == (
            StepStatus.PROCESSING,
            1,
            0,
            n,
        )
        assert record.complete_by == int(p.clock.now()) + wait + 30
        # and the supervisor does not resend it while it waits (its complete-by is past the wait)
        p.clock.advance(wait)
        assert p.sweep().messages == 0
        assert p.snapshot(wid).steps["reserve_flight"].resends == 0
    assert p.metrics["CallLimitDeferrals"] == deferrals
    # When the other instance stops (it is never invoked again: its lease lapses)
    held.release()
    p.clock.advance(other.lease_seconds + other.guard_seconds)
    # Then the trip completes on its first attempts
    p.settle(wid)
    final = p.snapshot(wid)
    assert final.workflow.status is WorkflowStatus.COMPLETED
    assert final.steps["reserve_flight"].attempt == 1


def test_a_compensation_deferred_by_the_call_limits_waits_its_turn_and_is_no_trouble() -> None:
    # Given a flights agent limited to one call in flight, and a trip whose payment is refused
    p = Pipeline(clock=ManualClock(START))
    store = InMemoryLimitsStore()
    limits = CallLimits(max_in_flight=1)
    ours = CallLimiter("flights", limits, store, p.clock, holder="ours", rng=random.Random(2), metrics=p.count)
    p.runtimes["flights"] = p.runtime("flights", limiter=ours)
    p.services["payments"].script["charge"] = ["reject"]
    patient = {"timeout_seconds": 300}  # the clock moves past our lease below: no step runs out of time meanwhile
    wid = p.start(trip_definition(reserve_flight=patient, book_hotel=patient, charge_card=patient))
    p.run_agent("flights")
    p.run_scheduler()
    # When our lease has lapsed and another instance holds the unit as the flight's cancellation comes
    p.clock.advance(ours.lease_seconds + ours.guard_seconds)
    other = CallLimiter("flights", limits, store, p.clock, holder="other", rng=random.Random(1))
    held = other.acquire(1.0, p.clock.now() + 3_600)
    p.pump()

    # Then the cancellation waits, counted as a limit deferral: not as the circuit's, not as trouble ("stuck")
    snapshot = p.snapshot(wid)
    record = snapshot.steps["reserve_flight"]
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATING
    assert (record.status, record.comp_attempt, record.comp_deferrals) == (StepStatus.COMPENSATING, 1, 0)
    assert record.limit_deferrals >= 1
    assert snapshot.trouble == 0
    # When the other instance stops, the cancellation runs on its first attempt
    held.release()
    p.clock.advance(other.lease_seconds + other.guard_seconds)
    p.settle(wid)
    final = p.snapshot(wid)
    assert final.workflow.status is WorkflowStatus.COMPENSATED
    assert final.steps["reserve_flight"].comp_attempt == 1


def test_a_step_deferred_while_its_workflow_is_held_waits_its_turn_and_finishes() -> None:
    # Given a trip under the hold policy whose hotel is booked beside its flight, the hotels limited to one call in
    # flight with another instance holding it, and the flight refused (found by make sim, seed 12: the hotel's
    # deferral that came while the trip was held failed the step DEFERRED, which held the trip again after the
    # operator's retry of the flight, until its hold timeout unwound it)
    p = Pipeline(clock=ManualClock(START))
    other, held = one_call_held_elsewhere(p, "hotels")
    p.services["flights"].script["reserve"] = ["reject"]
    definition = trip_definition(book_hotel={"depends_on": [], "input": {"traveller.$": "input.traveller"}})
    wid = p.start({**definition, "on_failure": "hold"})

    # When the flight is refused (the trip is held) and the hotel's request is deferred by the limits
    p.run_agent("flights")
    p.run_scheduler()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.HELD
    [reply] = p.run_agent("hotels")
    assert (reply.outcome, reply.deferred_by) == (Outcome.DEFERRED, "limit")
    p.run_scheduler()

    # Then the hotel waits its turn, its attempt unused, and the held trip keeps it in flight
    record = p.snapshot(wid).steps["book_hotel"]
    assert (record.status, record.attempt, record.limit_deferrals) == (StepStatus.PROCESSING, 1, 1)
    # and once the other instance gives its unit back, the hotel is booked while the trip stays held
    held.release()
    p.clock.advance(other.lease_seconds + other.guard_seconds)
    p.clock.advance(reply.retry_after_seconds or 0)
    p.pump()
    snapshot = p.snapshot(wid)
    assert (snapshot.workflow.status, snapshot.steps["book_hotel"].status) == (
        WorkflowStatus.HELD,
        StepStatus.COMPLETED,
    )
