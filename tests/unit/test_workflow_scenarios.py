"""The pattern's scenarios end to end over in-memory adapters: scheduler, agents (real powertools idempotency),
supervisor, fake remote services and an injected clock. Each asserts exact values."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from sasflow.api_models import events_of
from sasflow.errors import ConditionFailedError, ContentionError
from sasflow.messages import StepReply, remote_token
from sasflow.records import DeadlineEntry
from sasflow.scheduler import MAX_ATTEMPTS
from sasflow.states import Outcome, Phase, StepStatus, WorkflowStatus
from tests.support.fakes import calls_in_order
from tests.support.pipeline import AGENTS, OWNER, Pipeline, trip_definition

STEPS = ["reserve_flight", "book_hotel", "charge_card"]


def statuses(p: Pipeline, wid: str) -> dict[str, StepStatus]:
    return {name: record.status for name, record in p.snapshot(wid).steps.items()}


def attempts(p: Pipeline, wid: str) -> dict[str, int]:
    return {name: record.attempt for name, record in p.snapshot(wid).steps.items()}


def test_happy_path_completes_three_steps_in_order_with_one_attempt_each() -> None:
    # Given a pipeline with healthy services
    p = Pipeline()
    # When a trip starts and the queues are delivered
    wid = p.start()
    p.pump()
    # Then every step completed once, in order, and nothing is left in flight
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPLETED
    assert statuses(p, wid) == dict.fromkeys(STEPS, StepStatus.COMPLETED)
    assert attempts(p, wid) == dict.fromkeys(STEPS, 1)
    assert p.call_log == [("flights", "reserve"), ("hotels", "book"), ("payments", "charge")]
    assert snapshot.input_of("book_hotel") == {
        "traveller": "Ada Lovelace",
        "flight": snapshot.steps["reserve_flight"].output["confirmation"],
    }
    assert p.store.index_entries() == []
    assert sum(sum(s.effects.values()) for s in p.services.values()) == 3


def test_transient_failure_is_retried_inside_the_agent_and_completes_with_attempt_one() -> None:
    # Given the hotel service fails twice with 503, and a backoff without jitter: base 1 s, cap 1.5 s
    p = Pipeline()
    start = p.clock.now()
    p.services["hotels"].script["book"] = ["503", "503"]
    policy = {"max_attempts": 3, "backoff_base_seconds": 1.0, "backoff_cap_seconds": 1.5, "jitter": False}
    # When the trip runs
    wid = p.start(trip_definition(book_hotel={"retry": policy}))
    p.pump()
    # Then the agent retried the call twice within attempt 1
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED
    assert attempts(p, wid)["book_hotel"] == 1
    assert p.services["hotels"].actions() == ["book", "book", "book"]
    assert sum(p.services["hotels"].effects.values()) == 1
    # And it slept on the injected clock exactly base * 2**0 = 1.0 s, then min(cap 1.5, base * 2**1 = 2.0) = 1.5 s
    # (nothing else in the run moves the clock)
    assert p.clock.now() == start + 1.0 + 1.5


def test_with_full_jitter_the_backoff_is_a_draw_of_the_agents_seeded_random_source() -> None:
    # Given the hotel service fails once with 503, under the default policy (full jitter, base 1 s)
    p = Pipeline()
    start = p.clock.now()
    p.services["hotels"].script["book"] = ["503"]
    # When the trip runs
    wid = p.start()
    p.pump()
    # Then the agent slept uniform(0, base * 2**0) drawn from its random source, random.Random(11) in the pipeline,
    # whose first draw this is
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED
    expected = random.Random(11).uniform(0, 1.0)
    assert p.clock.now() == start + expected
    assert 0 < expected < 1.0  # the draw is a real jitter, not the un-jittered 1.0 s


def test_lost_reply_is_resent_by_the_supervisor_and_completes_with_attempt_two() -> None:
    # Given the flight agent did the work but its reply was lost
    p = Pipeline(grace=30)
    wid = p.start()
    p.run_agent("flights", lose_replies=True)
    complete_by = p.snapshot(wid).steps["reserve_flight"].complete_by
    assert complete_by is not None
    # When the supervisor runs after complete-by + grace
    p.clock.set(complete_by + 30 + 1)
    report = p.sweep()
    # Then it resent the step once, attempt 2, and the workflow completes with one remote effect
    assert (report.overdue, report.messages) == (1, 1)
    assert [r.attempt for r in p.requests("flights")] == [2]
    p.pump()
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPLETED
    assert snapshot.steps["reserve_flight"].attempt == 2
    assert snapshot.steps["reserve_flight"].resends == 1
    assert p.services["flights"].actions() == ["reserve"]  # attempt 2 was answered from the idempotency record
    assert p.metrics["SupervisorResends"] == 1


def test_business_rejection_of_step_three_compensates_two_then_one() -> None:
    # Given payments rejects the charge
    p = Pipeline()
    p.services["payments"].script["charge"] = ["reject"]
    # When the trip runs
    wid = p.start()
    p.pump()
    # Then hotel and flight are compensated, in that order, and the rejected charge is not
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    assert statuses(p, wid) == {
        "reserve_flight": StepStatus.COMPENSATED,
        "book_hotel": StepStatus.COMPENSATED,
        "charge_card": StepStatus.FAILED,
    }
    assert calls_in_order(p.services.values()) == [
        ("flights", "reserve"),
        ("hotels", "book"),
        ("payments", "charge"),
        ("hotels", "cancel_booking"),
        ("flights", "cancel_reservation"),
    ]
    assert p.services["payments"].actions() == ["charge"]
    assert snapshot.steps["charge_card"].error == {"code": "NO_SEATS", "message": "sold out"}
    assert snapshot.workflow.reason == "step charge_card failed: NO_SEATS"


def test_exhausted_attempts_compensate_the_failed_step_too_because_it_may_have_happened() -> None:
    # Given the payments agent never replies (max_attempts 3)
    p = Pipeline()
    wid = p.start()
    for agent in ("flights", "hotels"):
        p.run_agent(agent)
        p.run_scheduler()
    for expected_attempt in (1, 2, 3):
        assert [r.attempt for r in p.requests("payments")] == [expected_attempt]
        p.run_agent("payments", lose_replies=True)
        p.clock.advance(30 + 30 + 1)
        p.sweep()
    p.pump()
    # Then the step failed with an unknown outcome and every step, the failed one first, was compensated
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    assert snapshot.steps["charge_card"].may_have_happened is True
    assert snapshot.steps["charge_card"].error is not None
    assert snapshot.steps["charge_card"].error["code"] == "TIMED_OUT"
    assert p.call_log[-3:] == [("payments", "refund"), ("hotels", "cancel_booking"), ("flights", "cancel_reservation")]
    assert p.services["payments"].actions() == ["charge", "refund"]  # charge once: attempts 2, 3 were replays


def test_crash_between_processing_write_and_send_is_repaired_with_exactly_one_message() -> None:
    # Given a start that wrote the PROCESSING step but crashed before sending
    p = Pipeline()
    wid = p.start(send=False)
    assert p.requests("flights") == []
    record = p.snapshot(wid).steps["reserve_flight"]
    assert (record.status, record.attempt) == (StepStatus.PROCESSING, 1)
    # When the supervisor sweeps after complete-by + grace
    assert record.complete_by is not None
    p.clock.set(record.complete_by + 31)
    p.sweep()
    # Then exactly one message is there, and the workflow completes
    assert [(r.step, r.attempt) for r in p.requests("flights")] == [("reserve_flight", 2)]
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED
    assert sum(p.services["flights"].effects.values()) == 1


def test_the_same_request_delivered_twice_has_one_effect_and_completes_once() -> None:
    # Given the first request is in the queue twice (SQS at-least-once delivery)
    p = Pipeline()
    wid = p.start()
    [message] = p.bus.peek("queue/flights")
    p.bus.send([message])
    # When both copies are delivered and the replies applied
    replies = p.run_agent("flights")
    p.run_scheduler()
    # Then the remote effect happened once, both replies say the same, and the next step was dispatched once
    assert [(r.attempt, r.outcome) for r in replies] == [(1, Outcome.SUCCEEDED), (1, Outcome.SUCCEEDED)]
    assert p.services["flights"].actions() == ["reserve"]
    assert p.snapshot(wid).steps["reserve_flight"].status is StepStatus.COMPLETED
    assert [r.step for r in p.requests("hotels")] == ["book_hotel"]
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED


def test_stale_reply_for_an_earlier_attempt_is_acknowledged_and_changes_nothing() -> None:
    # Given attempt 1 refused by the flights service, its reply held back while the supervisor starts attempt 2
    p = Pipeline()
    p.services["flights"].script["reserve"] = ["reject"]
    wid = p.start()
    [stale] = p.run_agent("flights", lose_replies=True)
    assert (stale.attempt, stale.outcome) == (1, Outcome.REJECTED)
    record = p.snapshot(wid).steps["reserve_flight"]
    assert record.complete_by is not None
    p.clock.set(record.complete_by + 31)
    p.sweep()
    before = p.snapshot(wid)
    assert (before.steps["reserve_flight"].status, before.steps["reserve_flight"].attempt) == (StepStatus.PROCESSING, 2)
    # When the late attempt-1 failure arrives
    messages = p.scheduler.on_reply(stale)
    # Then it never fails the current attempt: nothing changed and nothing was sent
    assert messages == []
    assert p.snapshot(wid).steps["reserve_flight"] == before.steps["reserve_flight"]
    assert p.snapshot(wid).history == before.history
    assert p.requests("hotels") == []
    assert p.metrics["StaleReplies"] == 1


def test_a_success_of_an_earlier_attempt_completes_the_step_still_in_flight_under_the_same_token() -> None:
    # Given attempt 1's success held back while the supervisor resends the step as attempt 2
    p = Pipeline()
    wid = p.start()
    [late] = p.run_agent("flights", lose_replies=True)
    assert (late.attempt, late.outcome) == (1, Outcome.SUCCEEDED)
    record = p.snapshot(wid).steps["reserve_flight"]
    assert record.complete_by is not None
    p.clock.set(record.complete_by + 31)
    p.sweep()
    [resend] = p.requests("flights")
    assert resend.attempt == 2
    # When attempt 1's success arrives before attempt 2 has answered
    p.bus.send(p.scheduler.on_reply(late))
    # Then the step is COMPLETED with attempt 1's output (the token, and so the answer, is the same), attempt 2 is
    # not waited for, and the next step is dispatched
    snapshot = p.snapshot(wid)
    step = snapshot.steps["reserve_flight"]
    assert (step.status, step.attempt, step.output) == (StepStatus.COMPLETED, 2, late.output)
    assert [r.step for r in p.requests("hotels")] == ["book_hotel"]
    applied = [e for e in events_of(snapshot) if e.kind == "reply_applied" and e.step == "reserve_flight"]
    assert [(e.attempt, e.outcome) for e in applied] == [(1, "succeeded")]
    assert (p.metrics["EarlierSuccessesApplied"], p.metrics["StaleReplies"]) == (1, 0)
    # and attempt 2's own answer, when it comes, changes nothing: the trip completes with one reservation
    p.pump()
    final = p.snapshot(wid)
    assert final.workflow.status is WorkflowStatus.COMPLETED
    assert final.steps["reserve_flight"].output == late.output
    assert p.services["flights"].effects[resend.token] == 1


def test_a_success_under_the_token_before_an_operator_retry_is_not_accepted() -> None:
    # Given a held trip whose hotel refused attempt 1, retried by an operator: a new budget and a new token
    p = Pipeline()
    p.services["hotels"].script["book"] = ["reject"]
    wid = p.start({**trip_definition(), "on_failure": "hold"})
    p.pump()
    p.scheduler.operate(wid, "retry", principal=OWNER, reason="on-call", action_id="r-1", step="book_hotel")
    record = p.snapshot(wid).steps["book_hotel"]
    assert (record.status, record.attempt, record.attempt_base, record.generation) == (StepStatus.PROCESSING, 2, 1, 1)
    before = p.snapshot(wid)
    # When a success of attempt 1 (the old token) arrives
    old = StepReply(
        workflow_id=wid, step="book_hotel", phase=Phase.ACTION, attempt=1, outcome=Outcome.SUCCEEDED, output={"x": 1}
    )
    assert p.scheduler.on_reply(old) == []
    # Then it is dropped: the retried attempt answers under its own token
    assert p.snapshot(wid).steps["book_hotel"] == before.steps["book_hotel"]
    assert p.metrics["StaleReplies"] == 1


def test_two_supervisors_at_once_resend_once_and_bump_the_attempt_once() -> None:
    # Given an overdue step
    p = Pipeline()
    wid = p.start()
    p.run_agent("flights", lose_replies=True)
    record = p.snapshot(wid).steps["reserve_flight"]
    assert record.complete_by is not None
    p.clock.set(record.complete_by + 31)
    # When two supervisors sweep concurrently, without the lease, so only the conditional writes protect us
    barrier = threading.Barrier(2)
    reports = []

    def run() -> None:
        barrier.wait()
        reports.append(p.sweep(use_lease=False))

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then there is one resend and attempt is 2
    assert sorted(r.messages for r in reports) == [0, 1]
    assert [r.attempt for r in p.requests("flights")] == [2]
    assert p.snapshot(wid).steps["reserve_flight"].attempt == 2
    assert p.metrics["SupervisorResends"] == 1


def test_the_lease_lets_only_one_of_two_overlapping_supervisors_sweep() -> None:
    # Given one supervisor holds the lease
    p = Pipeline()
    p.store.acquire_lease("supervisor", "first", int(p.clock.now()), 50)
    # When a second one runs
    report = p.sweep(owner="second")
    # Then it reads nothing
    assert (report.acquired, report.overdue, report.pages) == (False, 0, 0)


def test_overdue_boundary_no_resend_at_exactly_grace_and_one_a_second_later() -> None:
    # Given a step whose reply was lost
    p = Pipeline(grace=30)
    wid = p.start()
    p.run_agent("flights", lose_replies=True)
    complete_by = p.snapshot(wid).steps["reserve_flight"].complete_by
    assert complete_by is not None
    # When the supervisor runs at now == complete_by + grace
    p.clock.set(complete_by + 30)
    at_boundary = p.sweep()
    # Then nothing is overdue yet; one second later exactly one resend
    assert (at_boundary.overdue, at_boundary.messages) == (0, 0)
    p.clock.set(complete_by + 31)
    after = p.sweep()
    assert (after.overdue, after.messages) == (1, 1)
    assert [r.attempt for r in p.requests("flights")] == [2]


def run_until_terminal(p: Pipeline, wid: str, *, step_seconds: float = 5.0, limit: int = 200) -> None:
    """Deliver queues while moving time in small steps (retries wait for their backoff as SQS delays)."""
    for _ in range(limit):
        p.pump()
        if p.snapshot(wid).workflow.status.value in {"COMPLETED", "COMPENSATED", "COMPENSATION_FAILED", "CANCELLED"}:
            return
        p.clock.advance(step_seconds)
        p.sweep()
    raise AssertionError("not terminal")


def three_compensation_attempts() -> dict[str, object]:
    policy = {"max_attempts": 3, "backoff_base_seconds": 1, "backoff_cap_seconds": 4}
    return trip_definition(
        reserve_flight={"compensation": {"action": "cancel_reservation", "retry": policy}},
        book_hotel={"compensation": {"action": "cancel_booking", "retry": policy}},
    )


def test_compensation_that_fails_twice_with_503_then_succeeds() -> None:
    # Given payments rejects, and the hotel's compensation fails twice with 503 (one call per attempt)
    p = Pipeline()
    p.services["payments"].script["charge"] = ["reject"]
    p.services["hotels"].script["cancel_booking"] = ["503", "503"]
    # When the workflow runs, time moving through the backoff delays
    wid = p.start(three_compensation_attempts())
    run_until_terminal(p, wid)
    # Then the calls are C2, C2, C2, C1 and the workflow is COMPENSATED
    compensations = [c for c in p.call_log if c[1] in ("cancel_booking", "cancel_reservation")]
    assert compensations == [("hotels", "cancel_booking")] * 3 + [("flights", "cancel_reservation")]
    assert p.services["hotels"].actions() == ["book", "cancel_booking", "cancel_booking", "cancel_booking"]
    assert p.snapshot(wid).steps["book_hotel"].comp_attempt == 3
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATED


def test_compensation_that_always_fails_ends_compensation_failed_and_stays_there() -> None:
    # Given payments rejects and the hotel's compensation always fails (max_attempts 3)
    p = Pipeline()
    p.services["payments"].script["charge"] = ["reject"]
    p.services["hotels"].script["cancel_booking"] = ["503"] * 100
    # When the workflow runs and then 10 more supervisor ticks pass
    wid = p.start(three_compensation_attempts())
    run_until_terminal(p, wid)
    for _ in range(10):
        p.clock.advance(60)
        p.sweep()
        p.pump()
    # Then C2 was called exactly max_attempts (3) times, C1 never, and the workflow waits for a person
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATION_FAILED
    assert p.services["hotels"].actions().count("cancel_booking") == 3
    assert "cancel_reservation" not in p.services["flights"].actions()
    assert snapshot.steps["book_hotel"].status is StepStatus.COMPENSATION_FAILED
    assert snapshot.steps["reserve_flight"].status is StepStatus.COMPLETED
    assert p.metrics["WorkflowsCompensationFailed"] == 1
    assert p.store.index_entries() == []


def test_a_compensation_makes_the_attempts_its_policy_gives_then_fails() -> None:
    # (The default policy is measured in time, 30 minutes: tests/unit/test_compensation_policy.py.)
    p = Pipeline()
    p.services["payments"].script["charge"] = ["reject"]
    p.services["hotels"].script["cancel_booking"] = ["503"] * 100
    policy = {"max_attempts": 5, "backoff_base_seconds": 1, "backoff_cap_seconds": 4}
    hotel = {"compensation": {"action": "cancel_booking", "retry": policy}}
    wid = p.start(trip_definition(book_hotel=hotel))
    run_until_terminal(p, wid, step_seconds=1)
    assert p.services["hotels"].actions().count("cancel_booking") == 5
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATION_FAILED


def test_a_service_failing_every_call_fails_the_step_after_max_calls_and_compensates() -> None:
    # Given the hotel service answers 503 to the booking three times
    p = Pipeline()
    p.services["hotels"].script["book"] = ["503", "503", "503"]
    wid = p.start()
    # When the trip runs
    p.pump()
    # Then the agent made max_attempts (3) calls, replied FAILED (not retryable), and both steps were compensated:
    # the booking's outcome is unknown, so it is cancelled too
    assert p.services["hotels"].actions() == ["book", "book", "book", "cancel_booking"]
    assert p.services["flights"].actions() == ["reserve", "cancel_reservation"]
    snapshot = p.snapshot(wid)
    assert snapshot.steps["book_hotel"].error is not None
    assert snapshot.steps["book_hotel"].error["code"] == "TRANSIENT_EXHAUSTED"
    assert snapshot.steps["book_hotel"].may_have_happened is True
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    assert p.services["payments"].calls == []


def test_five_failures_in_a_row_open_the_shared_breaker_and_defer_instead_of_calling() -> None:
    # Given the hotel service is down for everything
    p = Pipeline()
    p.services["hotels"].default = "503"
    wid = p.start()
    # When the booking fails its 3 calls and its compensation fails twice more (5 failures in a row)
    for _ in range(120):
        p.pump()
        if p.breakers.get("hotels").state.value == "open" and p.metrics["CircuitOpenDeferrals"]:
            break
        p.clock.advance(1)
    # Then the breaker is open and the next compensation attempt made no call: it was deferred, not used up
    assert p.services["hotels"].actions() == ["book", "book", "book", "cancel_booking", "cancel_booking"]
    record = p.snapshot(wid).steps["book_hotel"]
    assert (record.status, record.comp_attempt, record.comp_deferrals) == (StepStatus.COMPENSATING, 3, 1)
    assert p.metrics["CircuitOpenDeferrals"] == 1


def test_a_request_delivered_after_its_complete_by_is_redispatched_without_using_the_attempt() -> None:
    # Given the hotel request sat in the queue until its complete-by had passed (a backlog)
    p = Pipeline()
    wid = p.start()
    p.run_agent("flights")
    p.run_scheduler()
    p.clock.advance(29)
    # When the agent finally gets it, there is no time left to call
    [late] = p.run_agent("hotels")
    p.run_scheduler()
    # Then no call was made, and the same attempt is dispatched again with a new complete-by
    assert (late.outcome, late.retryable, late.calls) == (Outcome.FAILED, True, 0)
    assert p.services["hotels"].calls == []
    record = p.snapshot(wid).steps["book_hotel"]
    assert (record.status, record.attempt, record.deferrals) == (StepStatus.PROCESSING, 1, 1)
    assert record.complete_by == int(p.clock.now()) + 30
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED


def test_circuit_open_defers_and_recovers_after_the_open_period() -> None:
    # Given a breaker already open for the hotels service
    p = Pipeline()
    for _ in range(5):
        p.breakers.record_failure("hotels")
    from sasflow.breaker import BreakerRecord, BreakerState

    opened = BreakerRecord(BreakerState.OPEN, 5, p.clock.now() + 30, 0.0)
    assert p.breakers.transition("hotels", BreakerRecord(), opened)
    wid = p.start()
    p.run_agent("flights")
    p.run_scheduler()
    # When the hotel request arrives while the breaker is open
    [deferred] = p.run_agent("hotels")
    p.run_scheduler()
    # Then it is deferred: no call, same attempt, redelivered when the breaker lets a probe through
    assert deferred.outcome is Outcome.DEFERRED
    assert p.services["hotels"].calls == []
    record = p.snapshot(wid).steps["book_hotel"]
    assert (record.status, record.attempt, record.deferrals) == (StepStatus.PROCESSING, 1, 1)
    assert p.run_agent("hotels") == []  # delayed until retry_at
    p.clock.advance(31)
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED
    assert attempts(p, wid)["book_hotel"] == 1
    assert p.breakers.get("hotels").state is BreakerState.CLOSED


def test_repeated_start_with_the_same_idempotency_key_returns_the_same_workflow() -> None:
    p = Pipeline()
    first = p.start(key="trip-42")
    second = p.start(key="trip-42")
    assert first == second
    assert len(p.store.workflows) == 1
    assert [r.step for r in p.requests("flights")] == ["reserve_flight"]  # the repeat sent nothing


def test_a_dag_chain_whose_third_step_rejects_compensates_step_two_then_step_one() -> None:
    # Given a chain s1 -> s2 -> s3 written with explicit dependencies, on three services; s3 is rejected
    definition = {
        "name": "chain",
        "version": 1,
        "steps": [
            {"name": "s1", "agent": "flights", "action": "reserve", "depends_on": [],
             "compensation": {"action": "cancel_reservation"}},
            {"name": "s2", "agent": "hotels", "action": "book", "depends_on": ["s1"],
             "compensation": {"action": "cancel_booking"}},
            {"name": "s3", "agent": "payments", "action": "charge", "depends_on": ["s2"],
             "compensation": {"action": "refund"}},
        ],
    }  # fmt: skip
    p = Pipeline()
    p.services["payments"].script["charge"] = ["reject"]
    # When it runs
    wid = p.start(definition)
    p.pump()
    # Then the services saw the three actions forward, then s2's compensation, then s1's: each delivery round
    # serves flights before hotels, so compensations sent together would reach s1's service first
    assert calls_in_order(p.services.values()) == [
        ("flights", "reserve"),
        ("hotels", "book"),
        ("payments", "charge"),
        ("hotels", "cancel_booking"),
        ("flights", "cancel_reservation"),
    ]
    assert statuses(p, wid) == {"s1": StepStatus.COMPENSATED, "s2": StepStatus.COMPENSATED, "s3": StepStatus.FAILED}
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATED


def test_a_dag_diamond_runs_its_middle_in_parallel_and_compensates_both_middle_steps_before_the_root() -> None:
    # Given a diamond a -> (b, c) -> d, where d is rejected
    definition = {
        "name": "diamond",
        "version": 1,
        "steps": [
            {"name": "a", "agent": "flights", "action": "reserve", "depends_on": [],
             "compensation": {"action": "cancel_reservation"}},
            {"name": "b", "agent": "hotels", "action": "book", "depends_on": ["a"],
             "compensation": {"action": "cancel_booking"}},
            {"name": "c", "agent": "payments", "action": "charge", "depends_on": ["a"],
             "compensation": {"action": "refund"}},
            {"name": "d", "agent": "hotels", "action": "upgrade_room", "depends_on": ["b", "c"],
             "compensation": {"action": "cancel_upgrade"}},
        ],
    }  # fmt: skip
    p = Pipeline()
    p.services["hotels"].script["upgrade_room"] = ["reject"]
    wid = p.start(definition)
    # When a completes, b and c are dispatched at once
    p.run_agent("flights")
    p.run_scheduler()
    assert ([r.step for r in p.requests("hotels")], [r.step for r in p.requests("payments")]) == (["b"], ["c"])
    # And when d is rejected, b's and c's compensations are dispatched together, a's not yet
    for agent in ("hotels", "payments"):
        p.run_agent(agent)
    p.run_scheduler()
    p.run_agent("hotels")  # d, rejected
    p.run_scheduler()
    assert [(r.step, r.action) for r in p.requests("hotels")] == [("b", "cancel_booking")]
    assert [(r.step, r.action) for r in p.requests("payments")] == [("c", "refund")]
    assert p.requests("flights") == []
    p.pump()
    # Then the services saw a, then b and c, then d; then the undo of b and c (in either order), then a's last
    calls = calls_in_order(p.services.values())
    assert calls[0] == ("flights", "reserve")
    assert sorted(calls[1:3]) == [("hotels", "book"), ("payments", "charge")]
    assert calls[3] == ("hotels", "upgrade_room")
    assert sorted(calls[4:6]) == [("hotels", "cancel_booking"), ("payments", "refund")]
    assert calls[6:] == [("flights", "cancel_reservation")]
    assert statuses(p, wid) == {
        "a": StepStatus.COMPENSATED,
        "b": StepStatus.COMPENSATED,
        "c": StepStatus.COMPENSATED,
        "d": StepStatus.FAILED,
    }
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATED


def test_cancel_compensates_completed_steps_and_seals_the_rest() -> None:
    p = Pipeline()
    wid = p.start()
    p.run_agent("flights")
    p.run_scheduler()
    cancelled, messages = p.scheduler.cancel(wid, owner=OWNER)
    p.bus.send(messages)
    assert cancelled.workflow.status is WorkflowStatus.CANCELLING
    assert cancelled.steps["charge_card"].status is StepStatus.SKIPPED  # sealed in the cancel's own write
    # the hotel step is in flight: compensation waits for its outcome
    p.pump()
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.CANCELLED
    assert statuses(p, wid) == {
        "reserve_flight": StepStatus.COMPENSATED,
        "book_hotel": StepStatus.COMPENSATED,
        "charge_card": StepStatus.SKIPPED,
    }
    assert p.services["payments"].calls == []


def test_reply_redelivered_after_a_crash_between_its_write_and_the_send_changes_nothing() -> None:
    # Given the scheduler stored the flight's completion with the hotel's dispatch, then crashed before sending
    p = Pipeline()
    wid = p.start()
    [reply] = p.run_agent("flights", lose_replies=True)
    lost = p.scheduler.on_reply(reply)
    assert [m.queue_url for m in lost] == ["queue/hotels"]
    stored = p.snapshot(wid)
    assert (stored.version, stored.steps["book_hotel"].status) == (2, StepStatus.PROCESSING)
    # When SQS redelivers the same reply
    messages = p.scheduler.on_reply(reply)
    # Then it is acknowledged without a write or a message, and the supervisor resends the hotel once, as attempt 2
    assert messages == []
    assert p.snapshot(wid).version == 2
    hotel = p.snapshot(wid).steps["book_hotel"]
    assert hotel.complete_by is not None
    p.clock.set(hotel.complete_by + 30 + 1)
    p.sweep()
    assert [(r.step, r.attempt) for r in p.requests("hotels")] == [("book_hotel", 2)]
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED


def saves_raising(error: Exception) -> Any:
    """A ``StateStore.save`` that raises ``error`` instead of writing."""

    def save(snapshot: Any, expect: Any) -> Any:
        raise error

    return save


def test_a_crash_inside_the_write_leaves_nothing_and_the_redelivered_reply_applies_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given the scheduler crashed while storing the flight's completion (the write did not happen)
    p = Pipeline()
    wid = p.start()
    [reply] = p.run_agent("flights", lose_replies=True)
    monkeypatch.setattr(p.store, "save", saves_raising(RuntimeError("crash")))
    with pytest.raises(RuntimeError, match="crash"):
        p.scheduler.on_reply(reply)
    monkeypatch.undo()
    assert statuses(p, wid) == {"reserve_flight": StepStatus.PROCESSING}
    # When SQS redelivers the same reply
    messages = p.scheduler.on_reply(reply)
    # Then the hotel is dispatched exactly once and the workflow completes
    assert [m.queue_url for m in messages] == ["queue/hotels"]
    p.bus.send(messages)
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED


def test_a_workflow_with_nothing_in_flight_is_advanced_by_the_supervisor_after_the_grace() -> None:
    # Given a running workflow stored with its first step completed and nothing dispatched after it (no writer of
    # this build leaves that; an operator's edit or an older build could), so no reply will ever move it
    p = Pipeline()
    wid = p.start(send=False)
    base = p.snapshot(wid)
    completed = base.steps["reserve_flight"].evolve(
        status=StepStatus.COMPLETED, complete_by=None, output={"confirmation": "FL-1"}
    )
    p.store.save(base.with_step(completed), expect=base)
    stuck = p.snapshot(wid)
    # Then it stays in the deadline index, keyed by its last update
    assert p.store.index_entries() == [DeadlineEntry(wid, stuck.workflow.updated_at)]
    # When the supervisor ticks every 60 s
    ticks = p.settle(wid, max_ticks=5, tick_seconds=60)
    # Then the first tick past updated_at + grace (30 s) advanced it, and it completed
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED
    assert ticks == 1
    assert p.metrics["WorkflowsStalled"] == 1
    assert p.services["hotels"].actions() == ["book"]


def test_compensation_message_carries_the_original_token() -> None:
    # Given a hotel booking that must be undone
    p = Pipeline()
    p.services["payments"].script["charge"] = ["reject"]
    wid = p.start()
    for agent in AGENTS:
        p.run_agent(agent)
        p.run_scheduler()
    # When the compensation request is sent
    [compensation] = p.requests("hotels")
    # Then it names the forward action's token, under which the hotel service recorded its effect
    assert compensation.phase is Phase.COMPENSATION
    assert compensation.action == "cancel_booking"
    assert compensation.original_token == remote_token(wid, "book_hotel", "book")
    assert p.services["hotels"].effects[compensation.original_token] == 1
    assert compensation.token == remote_token(wid, "book_hotel", "cancel_booking")


def test_concurrent_replies_of_parallel_steps_still_start_the_join_step() -> None:
    # Given flight and hotel run in parallel and the payment waits for both
    definition = trip_definition(
        book_hotel={"depends_on": [], "input": {"traveller.$": "input.traveller"}},
        charge_card={"depends_on": ["reserve_flight", "book_hotel"]},
    )
    p = Pipeline()
    wid = p.start(definition)
    [flight_reply] = p.run_agent("flights", lose_replies=True)
    [hotel_reply] = p.run_agent("hotels", lose_replies=True)
    # When both replies are applied concurrently: both read the workflow before either writes
    original_save = p.store.save
    interleaved = {"done": False}

    def save_after_the_other_reply_ran(snapshot, expect):  # type: ignore[no-untyped-def]
        if not interleaved["done"]:
            interleaved["done"] = True
            p.bus.send(p.scheduler.on_reply(hotel_reply))  # the hotel reply runs entirely inside this moment
        return original_save(snapshot, expect)

    p.store.save = save_after_the_other_reply_ran  # type: ignore[method-assign]
    p.bus.send(p.scheduler.on_reply(flight_reply))
    p.store.save = original_save  # type: ignore[method-assign]
    # Then the flight's first write lost to the hotel's, its second (from the fresh read) dispatched the payment
    # once, and the workflow completes
    assert [r.step for r in p.requests("payments")] == ["charge_card"]
    assert p.store.writes["save"] == 2
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED


def test_a_workflow_that_changes_under_every_write_fails_the_reply_for_redelivery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given another writer changes the workflow between each of our reads and writes
    p = Pipeline()
    wid = p.start()
    [reply] = p.run_agent("flights", lose_replies=True)
    monkeypatch.setattr(p.store, "save", saves_raising(ConditionFailedError("changed")))
    # When the reply is applied
    with pytest.raises(ContentionError) as raised:
        p.scheduler.on_reply(reply)
    monkeypatch.undo()
    # Then it gave up after MAX_ATTEMPTS reads, changed nothing, and the reply applies when delivered again
    assert raised.value.attempts == MAX_ATTEMPTS == 6
    assert statuses(p, wid) == {"reserve_flight": StepStatus.PROCESSING}
    assert [m.queue_url for m in p.scheduler.on_reply(reply)] == ["queue/hotels"]


def test_the_index_key_is_never_later_than_the_earliest_complete_by_and_moves_only_when_it_must() -> None:
    # Given flight (timeout 30 s) and hotel (timeout 60 s) in parallel, the payment after both
    definition = trip_definition(
        book_hotel={"depends_on": [], "input": {"traveller.$": "input.traveller"}, "timeout_seconds": 60},
        charge_card={"depends_on": ["reserve_flight", "book_hotel"]},
    )
    p = Pipeline()
    start = int(p.clock.now())
    wid = p.start(definition)
    # Then the workflow is indexed at the flight's complete-by, the earlier of the two
    assert p.store.index_entries() == [DeadlineEntry(wid, start + 30)]
    # When the hotel completes first, the key stays (the flight is still the earliest in flight)
    p.clock.advance(5)
    p.run_agent("hotels")
    p.run_scheduler()
    assert p.store.index_entries() == [DeadlineEntry(wid, start + 30)]
    # When the flight completes, the payment is dispatched, and the key stays where it is: a lower bound of the
    # payment's complete-by, not yet overdue, so this write moves no index entry (records.index_key_for)
    p.clock.advance(5)
    p.run_agent("flights")
    p.run_scheduler()
    assert p.store.index_entries() == [DeadlineEntry(wid, start + 30)]
    assert p.snapshot(wid).deadline == start + 10 + 30
    # When that lower bound falls overdue, the supervisor finds nothing overdue, resends nothing, and stores the key
    p.clock.set(start + 30 + 31)
    report = p.sweep()
    assert p.store.index_entries() == [DeadlineEntry(wid, start + 10 + 30)]
    assert (p.metrics["DeadlineKeysRefreshed"], p.metrics["SupervisorResends"], report.messages) == (1, 0, 0)
    assert p.snapshot(wid).steps["charge_card"].attempt == 1
    # And once the workflow is terminal it leaves the index
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED
    assert p.store.index_entries() == []


def test_the_replies_of_parallel_steps_applied_together_take_one_write_and_start_the_join() -> None:
    definition = trip_definition(
        book_hotel={"depends_on": [], "input": {"traveller.$": "input.traveller"}},
        charge_card={"depends_on": ["reserve_flight", "book_hotel"]},
    )
    p = Pipeline()
    wid = p.start(definition)
    replies = p.run_agent("flights", lose_replies=True) + p.run_agent("hotels", lose_replies=True)
    saves = p.store.writes.get("save", 0)
    messages = p.scheduler.on_replies(replies)
    assert p.store.writes["save"] == saves + 1
    assert [m.queue_url for m in messages] == ["queue/payments"]
    assert p.snapshot(wid).status_of("charge_card") is StepStatus.PROCESSING
    with pytest.raises(ValueError, match="replies of one workflow"):
        p.scheduler.on_replies([replies[0], replies[0].model_copy(update={"workflow_id": "other"})])


def test_the_index_key_moves_down_when_a_step_is_due_earlier_than_the_key() -> None:
    # Given a chain whose first step may take 300 s and whose second only 30 s
    definition = trip_definition(reserve_flight={"timeout_seconds": 300}, book_hotel={"timeout_seconds": 30})
    p = Pipeline()
    start = int(p.clock.now())
    wid = p.start(definition)
    assert p.store.index_entries() == [DeadlineEntry(wid, start + 300)]
    # When the flight completes after 5 s and the hotel is dispatched, due at start + 35
    p.clock.advance(5)
    p.run_agent("flights")
    p.run_scheduler()
    # Then the key moves down to it: a key later than a complete-by would let the supervisor find it late
    assert p.store.index_entries() == [DeadlineEntry(wid, start + 5 + 30)]
