"""Circuit-open deferrals: how long a deferred attempt waits, and whose budget it uses.

Both tests come from bugs the simulation's invariant 10 (every unwind explained by a fault) found: an agent whose
clock ran behind the scheduler's deferred the same attempt again and again within one second, and a compensation
inherited the deferrals of its forward action, so an outage that made a trip unwind also used up its compensation's
attempts within seconds (COMPENSATION_FAILED while the service was only briefly down).
"""

from __future__ import annotations

import json

from sasflow.breaker import BreakerRecord, BreakerState
from sasflow.clock import ManualClock, OffsetClock
from sasflow.messages import StepReply
from sasflow.scheduler import MIN_DEFERRAL_SECONDS
from sasflow.states import Outcome, Phase, StepStatus, WorkflowStatus
from tests.support.pipeline import Pipeline

START = 1_800_000_000.0


def open_breaker(p: Pipeline, agent: str, until: float) -> None:
    for _ in range(5):
        p.breakers.record_failure(agent)
    assert p.breakers.transition(agent, BreakerRecord(), BreakerRecord(BreakerState.OPEN, 5, until, 0.0))


def test_an_agent_clock_four_seconds_behind_defers_for_the_breakers_real_wait_not_a_hot_loop() -> None:
    # Given a flights agent whose clock is 4 s behind the scheduler's, and a breaker open for 30 s more (agent time)
    p = Pipeline(clock=ManualClock(START))
    p.runtimes["flights"] = p.runtime("flights", clock=OffsetClock(p.clock, -4.0))
    open_breaker(p, "flights", until=START - 4.0 + 30.0)
    wid = p.start()
    # When the agent defers the request and the scheduler applies the reply
    [deferred] = p.run_agent("flights")
    p.run_scheduler()
    # Then the reply says how long to wait (a duration on the agent's own clock), and the request waits that long
    assert (deferred.outcome, deferred.retry_after_seconds) == (Outcome.DEFERRED, 30)
    [again] = p.bus.queues["queue/flights"]
    visible_at, message = again
    assert message.delay_seconds == 30
    assert visible_at == START + 30
    record = p.snapshot(wid).steps["reserve_flight"]
    assert (record.status, record.attempt, record.deferrals, record.complete_by) == (
        StepStatus.PROCESSING,
        1,
        1,
        int(START) + 30 + 30,
    )


def test_a_deferral_that_names_no_wait_still_waits_the_minimum() -> None:
    # Given a running step and a DEFERRED reply with nothing to say how long (an agent of an older build)
    p = Pipeline(clock=ManualClock(START))
    wid = p.start()
    p.bus.receive("queue/flights")
    reply = StepReply(workflow_id=wid, step="reserve_flight", phase=Phase.ACTION, attempt=1, outcome=Outcome.DEFERRED)
    # When the scheduler applies it
    [message] = p.scheduler.on_reply(reply)
    # Then the same attempt goes again after the minimum wait, never at once
    assert MIN_DEFERRAL_SECONDS == 1
    assert message.delay_seconds == 1
    record = p.snapshot(wid).steps["reserve_flight"]
    assert (record.attempt, record.deferrals, record.complete_by) == (1, 1, int(START) + 1 + 30)


def test_a_compensation_has_its_own_deferral_budget() -> None:
    # Given a flight step deferred by an open circuit its whole budget (20 times), then done; the hotel refuses
    p = Pipeline(clock=ManualClock(START))
    wid = p.start()
    for _ in range(p.config.max_deferrals):
        [request] = p.bus.receive("queue/flights")
        reply = StepReply(
            workflow_id=wid,
            step="reserve_flight",
            phase=Phase.ACTION,
            attempt=json.loads(request.body)["attempt"],
            outcome=Outcome.DEFERRED,
            retry_after_seconds=1,
        )
        p.bus.send(p.scheduler.on_reply(reply))
        p.clock.advance(1)
    assert p.snapshot(wid).steps["reserve_flight"].deferrals == p.config.max_deferrals
    p.run_agent("flights")
    p.run_scheduler()
    p.services["hotels"].script["book"] = ["reject"]
    p.run_agent("hotels")
    p.run_scheduler()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATING
    # When the flight's compensation meets an open circuit
    open_breaker(p, "flights", until=p.clock.now() + 30)
    p.clock.advance(2)  # past the agent's cached read of the breaker
    [deferred] = p.run_agent("flights")
    p.run_scheduler()
    # Then it is deferred (its own first deferral), not counted as a failed compensation attempt
    assert deferred.outcome is Outcome.DEFERRED
    record = p.snapshot(wid).steps["reserve_flight"]
    assert (record.status, record.comp_attempt, record.comp_deferrals) == (StepStatus.COMPENSATING, 1, 1)
    assert record.deferrals == p.config.max_deferrals
    p.clock.advance(31)
    p.pump()
    final = p.snapshot(wid)
    assert final.workflow.status is WorkflowStatus.COMPENSATED
    assert final.steps["reserve_flight"].comp_attempt == 1
