"""A compensation's retry policy: bounded in time, patient enough to outlast a short outage (issue 19).

Found on call: with a service down for 15 minutes, a compensation made its 5 attempts in 21 s and ended
COMPENSATION_FAILED, paging a person for an outage that would have passed. A compensation now keeps trying for its
policy's ``budget_minutes`` (30 by default), with backoff, and an open circuit defers it without using an attempt.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from sasflow.clock import ManualClock
from sasflow.definition import CompensationRetryPolicy
from sasflow.messages import StepReply
from sasflow.states import Outcome, Phase, StepStatus, WorkflowStatus
from tests.support.pipeline import Pipeline

START = 1_800_000_000.0


def unwinding_trip_with_flights_down(p: Pipeline) -> str:
    """A trip whose flight is reserved, then the flights service goes down and the payment is refused: the trip
    unwinds and the flight's compensation meets the outage."""
    flights = p.services["flights"]
    flights.script["reserve"] = ["ok"]
    flights.default = "503"
    p.services["payments"].script["charge"] = ["reject"]
    wid = p.start()
    p.pump()
    record = p.snapshot(wid).steps["reserve_flight"]
    assert (p.snapshot(wid).workflow.status, record.status) == (WorkflowStatus.COMPENSATING, StepStatus.COMPENSATING)
    return wid


def run_until(p: Pipeline, wid: str, until: float, *, tick: float = 5.0) -> None:
    """Move time in ``tick`` steps, sweeping and delivering, until ``until`` or the workflow ends."""
    while p.clock.now() < until:
        if p.snapshot(wid).workflow.status in (WorkflowStatus.COMPENSATED, WorkflowStatus.COMPENSATION_FAILED):
            return
        p.clock.advance(tick)
        p.sweep()
        p.pump()


def test_the_default_policy_outlasts_a_15_minute_outage_and_the_compensation_completes_after_it() -> None:
    # Given a trip unwinding while the flights service is down
    p = Pipeline(clock=ManualClock(START))
    wid = unwinding_trip_with_flights_down(p)
    began = p.snapshot(wid).steps["reserve_flight"].comp_since
    assert began == int(START)
    # When the outage lasts 15 minutes
    run_until(p, wid, START + 15 * 60)
    during = p.snapshot(wid)
    p.services["flights"].default = "ok"
    run_until(p, wid, START + 31 * 60)
    # Then the compensation was still trying at the end of the outage, and completed once flights was back
    assert (during.workflow.status, during.steps["reserve_flight"].status) == (
        WorkflowStatus.COMPENSATING,
        StepStatus.COMPENSATING,
    )
    final = p.snapshot(wid)
    flight = final.steps["reserve_flight"]
    assert (final.workflow.status, flight.status) == (WorkflowStatus.COMPENSATED, StepStatus.COMPENSATED)
    policy = CompensationRetryPolicy()
    assert 5 < flight.comp_attempts_used < policy.max_attempts
    assert list(p.services["flights"].effects.values()) == [1, 1]  # reserved once, cancelled once


def test_a_compensation_gives_up_when_its_budget_runs_out_not_before() -> None:
    # Given a trip unwinding while the flights service stays down
    p = Pipeline(clock=ManualClock(START))
    wid = unwinding_trip_with_flights_down(p)
    # When time passes to just before the budget's end (30 minutes), then past it
    run_until(p, wid, START + 29 * 60)
    before = p.snapshot(wid).steps["reserve_flight"].status
    run_until(p, wid, START + 40 * 60)
    # Then it was still compensating at 29 minutes, and ended COMPENSATION_FAILED after the 30, naming the budget
    assert before is StepStatus.COMPENSATING
    final = p.snapshot(wid)
    flight = final.steps["reserve_flight"]
    assert (final.workflow.status, flight.status) == (
        WorkflowStatus.COMPENSATION_FAILED,
        StepStatus.COMPENSATION_FAILED,
    )
    assert flight.comp_error is not None
    assert flight.comp_error["message"].endswith("(gave up: the compensation's time budget ran out)")
    assert START + 30 * 60 <= final.workflow.updated_at <= START + 31 * 60


def test_an_open_circuit_defers_a_compensation_without_using_attempts_for_as_long_as_its_budget() -> None:
    # Given a trip unwinding while flights is down
    p = Pipeline(clock=ManualClock(START))
    wid = unwinding_trip_with_flights_down(p)
    before = p.snapshot(wid).steps["reserve_flight"]
    # When the flights agent defers the compensation 30 times, 30 s each (its circuit open: no call made): 15
    # minutes, more deferrals than a forward action may have (max_deferrals, 20)
    for _ in range(30):
        p.clock.advance(30)
        [request] = p.bus.receive("queue/flights")
        body = json.loads(request.body)
        reply = StepReply(
            workflow_id=wid,
            step="reserve_flight",
            phase=Phase.COMPENSATION,
            attempt=body["attempt"],
            outcome=Outcome.DEFERRED,
            retry_after_seconds=30,
        )
        p.bus.send(p.scheduler.on_reply(reply))
    during = p.snapshot(wid).steps["reserve_flight"]
    # Then it is still compensating: the deferrals used no attempt, and only the budget (not max_deferrals) bounds
    # them
    assert p.config.max_deferrals < 30
    assert (during.status, during.comp_attempt, during.comp_deferrals) == (
        StepStatus.COMPENSATING,
        before.comp_attempt,
        30,
    )
    # And once flights is back, the compensation completes
    p.services["flights"].default = "ok"
    run_until(p, wid, START + 31 * 60)
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATED


@pytest.mark.parametrize("attempt", [1, 2, 3, 6, 12, 40])
def test_the_compensation_backoff_has_equal_jitter_so_its_attempts_outlast_its_budget(attempt: int) -> None:
    # The delays stay within [d/2, d] of d = min(cap, base * 2**(n-1)) (AWS Architecture Blog, equal jitter)
    policy = CompensationRetryPolicy()
    d = min(120.0, 5.0 * 2 ** (attempt - 1))
    delays = [policy.delay_seconds(attempt, random.Random(seed)) for seed in range(50)]
    assert all(d / 2 <= delay <= d for delay in delays)
    # and the shortest delays of the default's attempts add up to more than its budget
    shortest = sum(min(120.0, 5.0 * 2 ** (n - 1)) / 2 for n in range(1, policy.max_attempts))
    assert shortest > policy.budget_minutes * 60


def record_calls(p: Pipeline, agent: str, action: str) -> list[float]:
    """The clock's time (epoch seconds) of every call of ``action`` that ``agent``'s fake service receives."""
    service = p.services[agent]
    times: list[float] = []
    original = service.call

    def call(request: Any, timeout_seconds: float) -> dict[str, Any]:
        if request.action == action:
            times.append(p.clock.now())
        return original(request, timeout_seconds)

    service.call = call  # type: ignore[method-assign]
    return times


def test_a_compensation_makes_no_attempt_after_its_budget_and_gives_up_with_attempts_left() -> None:
    # Given a trip unwinding while flights stays down, and every call of its compensation timed
    p = Pipeline(clock=ManualClock(START))
    calls = record_calls(p, "flights", "cancel_reservation")
    wid = unwinding_trip_with_flights_down(p)
    budget_end = START + 30 * 60
    # When it runs until well past its budget
    run_until(p, wid, START + 40 * 60)
    # Then every attempt fell within the budget, each attempt made one call, and it gave up with attempts left (the
    # budget, not the attempts, ended it): no burst of attempts once the time had run out
    flight = p.snapshot(wid).steps["reserve_flight"]
    assert flight.status is StepStatus.COMPENSATION_FAILED
    assert calls and max(calls) <= budget_end
    assert flight.comp_attempts_used == len(calls)
    assert flight.comp_attempts_used < CompensationRetryPolicy().max_attempts


def test_retry_compensation_gives_a_new_time_budget_from_the_operators_retry() -> None:
    # Given a compensation that gave up when its 30 minutes ran out, flights still down
    p = Pipeline(clock=ManualClock(START))
    calls = record_calls(p, "flights", "cancel_reservation")
    wid = unwinding_trip_with_flights_down(p)
    run_until(p, wid, START + 40 * 60)
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATION_FAILED
    used_before = len(calls)
    # When an operator retries the compensation ten minutes later
    retried_at = START + 50 * 60
    p.clock.set(retried_at)
    snapshot, messages = p.scheduler.operate(
        wid, "retry-compensation", principal="oncall", reason="flights is back soon", action_id="rc-budget"
    )
    p.bus.send(messages)
    # Then its budget starts again at the retry: still trying 29 minutes later, given up after the new 30 minutes
    assert snapshot.steps["reserve_flight"].comp_since == int(retried_at)
    run_until(p, wid, retried_at + 29 * 60)
    during = p.snapshot(wid)
    assert (during.workflow.status, during.steps["reserve_flight"].status) == (
        WorkflowStatus.COMPENSATING,
        StepStatus.COMPENSATING,
    )
    run_until(p, wid, retried_at + 40 * 60)
    final = p.snapshot(wid)
    assert final.workflow.status is WorkflowStatus.COMPENSATION_FAILED
    assert retried_at + 30 * 60 <= final.workflow.updated_at <= retried_at + 31 * 60
    assert len(calls) - used_before > 5  # the new budget's attempts were made, not one and done
