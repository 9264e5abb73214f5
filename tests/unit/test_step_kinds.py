"""Conditional steps (``when``) and wait steps, through the scheduler, the agents and the supervisor on one clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from sasflow.api_models import WorkflowView, events_of
from sasflow.callbacks import (
    CallbackExpiredError,
    CallbackNotFoundError,
    CallbackRequest,
    CallbackResult,
    CallbackUsedError,
)
from sasflow.definition import parse_definition
from sasflow.errors import InvalidDefinitionError, StepNotEvaluatedError
from sasflow.messages import StepReply, decode_reply
from sasflow.states import Outcome, Phase, StepStatus, WorkflowStatus
from tests.support.pipeline import OWNER, REPLIES, TRIP_INPUT, Pipeline, trip_definition


def with_steps(*extra: dict[str, Any], at: int = 1, **overrides: dict[str, Any]) -> dict[str, Any]:
    """The trip with ``extra`` steps inserted at ``at`` (a chain: each depends on the one before)."""
    definition = trip_definition(**overrides)
    definition["steps"][at:at] = list(extra)
    return definition


# --------------------------------------------------------------------------------------------- conditions
def test_a_false_condition_skips_the_step_and_its_dependents_run() -> None:
    # Given a trip whose hotel is booked only when the input asks for one
    p = Pipeline()
    wid = p.start(trip_definition(book_hotel={"when": "input.needs_hotel"}), {**TRIP_INPUT, "needs_hotel": False})
    # When it runs
    p.pump()
    # Then the hotel step is SKIPPED (never sent), the card is charged after it, and the trip COMPLETED
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPLETED
    assert {n: r.status for n, r in snapshot.steps.items()} == {
        "reserve_flight": StepStatus.COMPLETED,
        "book_hotel": StepStatus.SKIPPED,
        "charge_card": StepStatus.COMPLETED,
    }
    assert p.services["hotels"].calls == []
    assert p.services["payments"].actions() == ["charge"]
    assert p.metrics["StepsSkipped"] == 1
    # and the history says why
    kinds = [(e.kind, e.step) for e in events_of(snapshot)]
    assert ("skipped", "book_hotel") in kinds


@pytest.mark.parametrize(
    ("value", "runs"),
    [(True, True), ("yes", True), (0, True), ([1], True), (False, False), (None, False), ("", False), ([], False)],
)
def test_a_condition_counts_values_as_jmespath_does(value: Any, runs: bool) -> None:
    p = Pipeline()
    wid = p.start(trip_definition(book_hotel={"when": "input.flag"}), {**TRIP_INPUT, "flag": value})
    p.pump()
    assert p.snapshot(wid).steps["book_hotel"].status is (StepStatus.COMPLETED if runs else StepStatus.SKIPPED)


def test_a_condition_reads_a_dependency_output_and_a_missing_field_is_false() -> None:
    p = Pipeline()
    definition = trip_definition(book_hotel={"when": "steps.reserve_flight.output.confirmation"})
    wid = p.start(definition, TRIP_INPUT)
    p.pump()
    assert p.snapshot(wid).steps["book_hotel"].status is StepStatus.COMPLETED
    q = Pipeline()
    wid = q.start(trip_definition(book_hotel={"when": "steps.reserve_flight.output.nothing_here"}), TRIP_INPUT)
    q.pump()
    assert q.snapshot(wid).steps["book_hotel"].status is StepStatus.SKIPPED


def test_a_skipped_step_output_read_by_a_dependent_is_a_missing_reference_unless_defaulted() -> None:
    # Given the card charged for the hotel's price, with the hotel skipped
    overrides = {
        "book_hotel": {"when": "input.needs_hotel"},
        "charge_card": {"input": {"amount.$": "steps.book_hotel.output.price"}, "depends_on": ["book_hotel"]},
    }
    p = Pipeline()
    wid = p.start(trip_definition(**overrides), {**TRIP_INPUT, "needs_hotel": False})
    p.pump()
    # Then the charge fails with MISSING_REFERENCE and the flight is undone
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    error = snapshot.steps["charge_card"].error
    assert error is not None and error["code"] == "MISSING_REFERENCE"
    assert p.services["flights"].actions() == ["reserve", "cancel_reservation"]


def test_a_condition_that_cannot_be_evaluated_fails_its_step_with_the_reason() -> None:
    # abs() of a string is a JMESPath type error at run time
    p = Pipeline()
    with pytest.raises(
        StepNotEvaluatedError, match=r"steps\[reserve_flight\]\.when: 'abs\(input\.traveller\)' could not be evaluated"
    ):
        p.start(trip_definition(reserve_flight={"when": "abs(input.traveller)"}), TRIP_INPUT)
    assert p.store.writes == {}
    wid = p.start(trip_definition(book_hotel={"when": "abs(input.traveller)"}), TRIP_INPUT)
    p.pump()
    snapshot = p.snapshot(wid)
    error = snapshot.steps["book_hotel"].error
    assert error is not None and error["code"] == "CONDITION_NOT_EVALUATED"
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED


def test_a_condition_may_only_read_earlier_dependencies() -> None:
    with pytest.raises(InvalidDefinitionError, match=r"steps\[reserve_flight\]: 'steps.charge_card.output' refers"):
        parse_definition(trip_definition(reserve_flight={"when": "steps.charge_card.output"}))


# --------------------------------------------------------------------------------------------- waits
def wait(name: str, **spec: Any) -> dict[str, Any]:
    return {"name": name, "type": "wait", **spec}


def test_a_short_wait_is_resumed_by_its_own_delayed_message_at_its_time() -> None:
    # Given a trip that waits 90 s between the flight and the hotel
    p = Pipeline()
    wid = p.start(with_steps(wait("cool_off", seconds=90)), TRIP_INPUT)
    p.run_agent("flights")
    p.run_scheduler()
    started = p.clock.now()
    # Then the wait is in flight until started + 90 with one timer on the scheduler's queue, delayed 90 s
    record = p.snapshot(wid).steps["cool_off"]
    assert (record.status, record.complete_by) == (StepStatus.PROCESSING, int(started) + 90)
    [timer] = p.bus.peek(REPLIES)
    assert timer.delay_seconds == 90
    # and nothing is delivered before its time
    p.clock.advance(89)
    assert p.run_scheduler() == 0
    assert p.requests("hotels") == []
    # When its time comes, Then the timer resumes it and the hotel is booked
    p.clock.advance(1)
    assert p.run_scheduler() == 1
    snapshot = p.snapshot(wid)
    assert snapshot.steps["cool_off"].status is StepStatus.COMPLETED
    assert snapshot.steps["cool_off"].output == {"until": int(started) + 90}
    assert [r.action for r in p.requests("hotels")] == ["book"]
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED
    assert p.metrics["WaitsResumed"] == 1


def resumed_at(p: Pipeline, wid: str, step: str, *, until: int, tick: int = 60) -> int | None:
    """Move the clock one second at a time up to ``until``, delivering timers as they become visible and sweeping
    once every ``tick`` seconds as the supervisor's schedule does; return the first time ``step`` is COMPLETED."""
    for second in range(int(p.clock.now()) + 1, until + 1):
        p.clock.advance(second - p.clock.now())
        if second % tick == 0:
            p.sweep()
        p.run_scheduler()
        if p.snapshot(wid).steps[step].status is StepStatus.COMPLETED:
            return second
    return None


@pytest.mark.parametrize("seconds", [3_600, 901, 86_400])
def test_a_long_wait_resumes_within_seconds_of_its_time_and_never_before(seconds: int) -> None:
    # Given a trip that waits longer than SQS's 900 s delay, with the supervisor sweeping every minute
    p = Pipeline(grace=30)
    wid = p.start(with_steps(wait("overnight", seconds=seconds), at=0), TRIP_INPUT)
    due = p.snapshot(wid).steps["overnight"].complete_by
    assert due is not None and p.bus.peek(REPLIES) == []
    key = p.snapshot(wid).stored_key
    # When time passes second by second up to its time and a little after
    at = resumed_at(p, wid, "overnight", until=due + 120)
    # Then it resumed by the delayed message the sweep sent, at its time: never before it, within a few seconds after
    assert at is not None and due <= at <= due + 2
    # (the deadline index found the workflow 900 s before its time, not after it)
    assert key is not None and key <= due - 900 - 30
    assert p.metrics["WaitTimersSentBySupervisor"] == 1
    assert (p.metrics["WaitsResumed"], p.metrics["WaitsResumedBySupervisor"]) == (1, 0)
    assert p.snapshot(wid).steps["overnight"].output == {"until": due}


def test_a_long_wait_whose_timer_is_lost_is_still_resumed_by_the_supervisor_after_its_time() -> None:
    p = Pipeline(grace=30)
    wid = p.start(with_steps(wait("overnight", seconds=3_600), at=0), TRIP_INPUT)
    due = p.snapshot(wid).steps["overnight"].complete_by
    assert due is not None
    # Given the sweep that sends the timer, whose message is then lost
    p.clock.advance(due - 900 - int(p.clock.now()) + 1)
    p.sweep()
    assert [m.delay_seconds for m in p.bus.peek(REPLIES)] == [899]
    p.bus.queues[REPLIES] = []
    # Then the workflow is keyed at its time, and a sweep after the time plus the grace resumes the wait
    assert p.snapshot(wid).stored_key == due
    p.clock.advance(899 + 31)
    p.sweep()
    assert p.snapshot(wid).steps["overnight"].status is StepStatus.COMPLETED
    assert p.metrics["WaitsResumedBySupervisor"] == 1


def test_a_long_wait_sends_nothing_and_is_resumed_by_the_supervisor_once_due() -> None:
    p = Pipeline(grace=30)
    wid = p.start(with_steps(wait("overnight", seconds=3_600)), TRIP_INPUT)
    p.run_agent("flights")
    p.run_scheduler()
    due = p.snapshot(wid).steps["overnight"].complete_by
    assert due is not None
    # Then no timer was sent (longer than SQS's 900 s delay); the deadline index holds the workflow at most at `due`
    assert p.bus.peek(REPLIES) == []
    assert p.snapshot(wid).stored_key is not None and p.snapshot(wid).stored_key <= due
    # When the supervisor sweeps after the time plus its grace, Then it resumes the wait (not a timeout)
    p.clock.advance(due - int(p.clock.now()) + 31)
    p.sweep()
    p.pump()
    snapshot = p.snapshot(wid)
    assert snapshot.steps["overnight"].status is StepStatus.COMPLETED
    assert snapshot.workflow.status is WorkflowStatus.COMPLETED
    assert (p.metrics["WaitsResumedBySupervisor"], p.metrics["StepsTimedOut"], p.metrics["SupervisorResends"]) == (
        1,
        0,
        0,
    )


def test_a_wait_until_a_time_of_the_input_in_iso_or_epoch_seconds() -> None:
    p = Pipeline()
    now = int(p.clock.now())
    for until in (now + 120, datetime.fromtimestamp(now + 120, UTC).isoformat()):
        wid = p.start(with_steps(wait("hold", until="input.depart_at"), at=0), {**TRIP_INPUT, "depart_at": until})
        record = p.snapshot(wid).steps["hold"]
        assert (record.status, record.complete_by) == (StepStatus.PROCESSING, now + 120)


def test_a_wait_until_a_past_time_resumes_at_once() -> None:
    p = Pipeline()
    wid = p.start(with_steps(wait("hold", until="input.t"), at=0), {**TRIP_INPUT, "t": 1_000})
    [timer] = p.bus.peek(REPLIES)
    assert timer.delay_seconds == 0
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("tomorrow", "not an ISO 8601 time"),
        ("2026-12-02T10:00:00", "needs its offset"),
        (True, "not a time"),
        (10**12, "more than 31536000 seconds away"),
    ],
)
def test_a_wait_until_that_is_not_a_time_is_refused_with_the_reason(value: Any, message: str) -> None:
    p = Pipeline()
    with pytest.raises(StepNotEvaluatedError, match=message) as refused:
        p.start(with_steps(wait("hold", until="input.t"), at=0), {**TRIP_INPUT, "t": value})
    assert refused.value.code == "WAIT_NOT_EVALUATED"
    assert p.store.writes == {}


def test_a_cancel_during_a_wait_unwinds_at_once_and_the_late_timer_changes_nothing() -> None:
    p = Pipeline()
    wid = p.start(with_steps(wait("cool_off", seconds=600)), TRIP_INPUT)
    p.run_agent("flights")
    p.run_scheduler()
    # When the trip is cancelled while it waits
    p.bus.send(p.scheduler.cancel(wid, owner=None, principal="operator")[1])
    p.pump()
    # Then the flight is undone without waiting for the 600 s, and the wait ended UNWOUND
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.CANCELLED
    wait_record = snapshot.steps["cool_off"]
    assert (wait_record.status, (wait_record.error or {}).get("code")) == (StepStatus.FAILED, "UNWOUND")
    assert p.services["flights"].actions() == ["reserve", "cancel_reservation"]
    # and the timer, delivered later, changes nothing
    version = snapshot.version
    p.clock.advance(600)
    assert p.run_scheduler() == 1
    assert p.snapshot(wid).version == version


def test_a_timer_that_arrives_early_is_armed_again_for_the_rest() -> None:
    p = Pipeline()
    wid = p.start(with_steps(wait("cool_off", seconds=300), at=0), TRIP_INPUT)
    [timer] = p.bus.peek(REPLIES)
    # When the timer is applied 100 s early (a message delivered before its delay: never from SQS, but possible
    # from a redrive of the response queue's dead letters)
    p.clock.advance(200)
    messages = p.scheduler.on_reply(decode_reply(timer.body))
    # Then the wait stays in flight and a new timer is armed for the 100 s left
    assert p.snapshot(wid).steps["cool_off"].status is StepStatus.PROCESSING
    assert [m.delay_seconds for m in messages] == [100]


def test_a_copy_of_the_timer_delivered_one_second_early_does_not_resume_the_wait() -> None:
    p = Pipeline()
    wid = p.start(with_steps(wait("cool_off", seconds=300), at=0), TRIP_INPUT)
    [timer] = p.bus.peek(REPLIES)
    due = p.snapshot(wid).steps["cool_off"].complete_by
    assert due is not None
    # When a copy of the timer is applied one second before the wait's time
    p.clock.advance(due - 1 - p.clock.now())
    messages = p.scheduler.on_reply(decode_reply(timer.body))
    # Then the wait is not resumed: it stays in flight, its timer armed again for the second left
    record = p.snapshot(wid).steps["cool_off"]
    assert (record.status, record.complete_by) == (StepStatus.PROCESSING, due)
    assert [m.delay_seconds for m in messages] == [1]
    assert p.requests("flights") == []
    # and at its time, the timer resumes it
    p.clock.advance(1)
    p.scheduler.on_reply(decode_reply(timer.body))
    assert p.snapshot(wid).steps["cool_off"].status is StepStatus.COMPLETED


# --------------------------------------------------------------------------------------------- callbacks
def approval(**spec: Any) -> dict[str, Any]:
    return {"name": "approval", "type": "callback", "timeout_seconds": 600, **spec}


def token_of(p: Pipeline, wid: str, step: str = "approval") -> str:
    [view] = [s for s in WorkflowView.from_snapshot(p.snapshot(wid)).steps if s.name == step]
    assert view.task_token is not None
    return view.task_token


def answer(p: Pipeline, token: str, status: str, **body: Any) -> CallbackResult:
    _, result, messages = p.scheduler.callback(token, CallbackRequest(status=status, **body), owner=OWNER)
    p.bus.send(messages)
    return result


def test_an_approval_completes_the_callback_step_with_its_output_and_the_trip_goes_on() -> None:
    # Given a trip that waits for an approval after the flight
    p = Pipeline()
    wid = p.start(with_steps(approval()), TRIP_INPUT)
    p.pump()
    snapshot = p.snapshot(wid)
    assert snapshot.steps["approval"].status is StepStatus.PROCESSING
    assert snapshot.steps["approval"].complete_by == int(p.clock.now()) + 600
    assert p.requests("hotels") == []
    # When the approver answers with the token shown on the step
    token = token_of(p, wid)
    result = answer(p, token, "succeeded", output={"approved_by": "ada"})
    # Then the step is COMPLETED with that output and the hotel is booked
    assert (result.step, result.step_status, result.workflow_status) == ("approval", "COMPLETED", "RUNNING")
    assert p.snapshot(wid).steps["approval"].output == {"approved_by": "ada"}
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED
    # and the token works once: a second use is 409
    with pytest.raises(CallbackUsedError):
        answer(p, token, "succeeded", output={})


def test_the_same_answer_again_is_the_first_result_and_a_different_one_is_409() -> None:
    # Given a trip whose approval was answered once, then went on to complete
    p = Pipeline()
    wid = p.start(with_steps(approval()), TRIP_INPUT)
    p.pump()
    token = token_of(p, wid)
    first = answer(p, token, "succeeded", output={"approved_by": "ada", "at": 1})
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED
    version = p.snapshot(wid).version
    # When the same answer comes again (its caller lost the response), with its keys in another order
    again = answer(p, token, "succeeded", output={"at": 1, "approved_by": "ada"})
    # Then it gets the first result (the workflow was RUNNING then) and nothing is written
    assert again == first
    assert (again.step_status, again.workflow_status) == ("COMPLETED", "RUNNING")
    assert p.snapshot(wid).version == version
    assert p.metrics["CallbackAnswersRepeated"] == 1
    # and another answer, a failure, or a heartbeat for the same token is 409
    for status, body in (
        ("succeeded", {"output": {"approved_by": "bob", "at": 1}}),
        ("succeeded", {}),
        ("failed", {"error": {"code": "NO", "message": "no"}}),
        ("heartbeat", {}),
    ):
        with pytest.raises(CallbackUsedError):
            answer(p, token, status, **body)


def test_the_same_failure_again_is_the_first_result() -> None:
    p = Pipeline()
    wid = p.start(with_steps(approval()), TRIP_INPUT)
    p.pump()
    token = token_of(p, wid)
    error = {"code": "NOT_APPROVED", "message": "over budget"}
    first = answer(p, token, "failed", error=error)
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATED
    assert answer(p, token, "failed", error=error) == first
    assert first.step_status == "FAILED"
    with pytest.raises(CallbackUsedError):
        answer(p, token, "failed", error=error, reason="another reason")


def test_a_rejection_fails_the_step_and_unwinds_the_trip() -> None:
    p = Pipeline()
    wid = p.start(with_steps(approval()), TRIP_INPUT)
    p.pump()
    answer(p, token_of(p, wid), "failed", error={"code": "NOT_APPROVED", "message": "over budget"})
    p.pump()
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    assert snapshot.steps["approval"].error == {
        "code": "CALLBACK_FAILED",
        "message": "over budget",
        "cause": "NOT_APPROVED",
    }
    assert snapshot.workflow.reason == "step approval failed: CALLBACK_FAILED"
    assert p.services["flights"].actions() == ["reserve", "cancel_reservation"]


def test_a_heartbeat_moves_complete_by_and_a_timed_out_token_is_410() -> None:
    p = Pipeline(grace=30)
    wid = p.start(with_steps(approval(timeout_seconds=100)), TRIP_INPUT)
    p.pump()
    token = token_of(p, wid)
    p.clock.advance(80)
    result = answer(p, token, "heartbeat")
    assert result.complete_by == int(p.clock.now()) + 100
    # When no answer comes by complete-by (plus the grace), the supervisor times it out: one attempt, so it fails
    p.clock.advance(100 + 31)
    p.sweep()
    p.pump()
    snapshot = p.snapshot(wid)
    assert (snapshot.steps["approval"].error or {})["code"] == "TIMED_OUT"
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    with pytest.raises(CallbackExpiredError):
        answer(p, token, "succeeded", output={})


def test_a_retried_callback_issues_a_new_token_and_the_old_one_is_410() -> None:
    p = Pipeline(grace=30)
    wid = p.start(with_steps(approval(timeout_seconds=60, retry={"max_attempts": 2})), TRIP_INPUT)
    p.pump()
    first = token_of(p, wid)
    p.clock.advance(60 + 31)
    p.sweep()
    second = token_of(p, wid)
    assert second != first and second.split("~")[2] == "2"
    with pytest.raises(CallbackExpiredError, match="attempt 1 of step approval is over"):
        answer(p, first, "succeeded", output={})
    answer(p, second, "succeeded", output={})
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED


@pytest.mark.parametrize("tamper", ["nonce", "owner", "attempt", "garbage"])
def test_a_forged_or_foreign_token_is_404(tamper: str) -> None:
    p = Pipeline()
    wid = p.start(with_steps(approval()), TRIP_INPUT)
    p.pump()
    token = token_of(p, wid)
    workflow_id, step, attempt, nonce = token.split("~")
    owner = OWNER
    if tamper == "nonce":
        token = f"{workflow_id}~{step}~{attempt}~{'A' * 32}"
    elif tamper == "attempt":
        token = f"{workflow_id}~{step}~2~{nonce}"
    elif tamper == "garbage":
        token = "not-a-token"
    else:
        owner = "arn:aws:iam::123456789012:user/somebody-else"
    with pytest.raises(CallbackNotFoundError):
        p.scheduler.callback(token, CallbackRequest(status="succeeded"), owner=owner)
    assert p.snapshot(wid).steps["approval"].status is StepStatus.PROCESSING


def test_a_notification_carries_the_token_and_a_refused_one_fails_the_attempt() -> None:
    # Given an approval whose token is sent through the payments agent's `charge` action (any allowed action)
    p = Pipeline()
    notify = {"agent": "payments", "action": "charge", "input": {"who.$": "input.traveller"}}
    wid = p.start(with_steps(approval(notify=notify)), TRIP_INPUT)
    p.run_agent("flights")
    p.run_scheduler()
    [request] = p.requests("payments")
    assert request.input == {"who": "Ada Lovelace", "task_token": token_of(p, wid)}
    # When the notification is delivered, Then the step still waits for its callback
    p.run_agent("payments")
    p.run_scheduler()
    assert p.snapshot(wid).steps["approval"].status is StepStatus.PROCESSING
    # and a refused notification fails the step (one attempt): the trip unwinds
    q = Pipeline()
    q.services["payments"].script["charge"] = ["reject"]
    wid = q.start(with_steps(approval(notify=notify)), TRIP_INPUT)
    q.pump()
    assert q.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATED


def test_a_cancel_during_a_callback_ends_it_and_its_token_is_410() -> None:
    p = Pipeline()
    wid = p.start(with_steps(approval()), TRIP_INPUT)
    p.pump()
    token = token_of(p, wid)
    p.bus.send(p.scheduler.cancel(wid, owner=None, principal="operator")[1])
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.CANCELLED
    with pytest.raises(CallbackExpiredError, match="UNWOUND"):
        answer(p, token, "succeeded", output={})


def test_an_answer_past_complete_by_and_its_grace_is_410_and_a_heartbeat_is_in_the_history() -> None:
    # Found by a new user: a heartbeat after complete-by revived an attempt the supervisor was about to time out
    p = Pipeline(grace=30)
    wid = p.start(with_steps(approval(timeout_seconds=60)), TRIP_INPUT)
    p.pump()
    token = token_of(p, wid)
    p.clock.advance(50)
    answer(p, token, "heartbeat")  # complete-by moves to now + 60
    assert ("heartbeat", "approval") in [(e.kind, e.step) for e in events_of(p.snapshot(wid))]
    p.clock.advance(60 + 31)
    with pytest.raises(CallbackExpiredError, match="past its complete-by"):
        answer(p, token, "heartbeat")
    assert p.snapshot(wid).steps["approval"].status is StepStatus.PROCESSING  # the supervisor times it out


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"status": "failed"}, "a failed answer needs its error"),
        ({"status": "succeeded", "output": 1, "error": {"code": "X", "message": "m"}}, "takes no error"),
        ({"status": "heartbeat", "output": {"a": 1}}, "takes no output"),
    ],
)
def test_an_answer_must_have_the_shape_of_its_status(body: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CallbackRequest.model_validate(body)


def test_a_deferred_notification_goes_again_with_the_token_already_shown() -> None:
    # Found by the simulation: an open circuit deferred the notification, and its re-dispatch drew a new token, so
    # the one a person already held answered 404
    p = Pipeline()
    notify = {"agent": "payments", "action": "charge", "input": {}}
    wid = p.start(with_steps(approval(notify=notify)), TRIP_INPUT)
    p.run_agent("flights")
    p.run_scheduler()
    shown = token_of(p, wid)
    p.bus.receive("queue/payments")  # the notification, taken by an agent whose circuit is open
    deferred = StepReply(
        workflow_id=wid, step="approval", phase=Phase.ACTION, attempt=1, outcome=Outcome.DEFERRED, retry_after_seconds=5
    )
    p.bus.send(p.scheduler.on_reply(deferred))
    assert token_of(p, wid) == shown
    assert [r.input["task_token"] for r in p.requests("payments")] == [shown]
    assert answer(p, shown, "succeeded", output={}).step_status == "COMPLETED"
