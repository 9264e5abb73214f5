"""Operator actions, the hold policy and the history, through the scheduler over in-memory adapters.

Each action is one conditional write, audited in the history (principal, reason, id), idempotent by its id, and
refused (ConditionFailedError, the API's 409) with the reason where it does not apply.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import pytest

from sasflow.api_models import HistoryPage, WorkflowView, events_of
from sasflow.errors import (
    ConditionFailedError,
    IdempotencyKeyConflictError,
    MissingReferenceError,
    OutputNeededError,
    UnknownStepError,
)
from sasflow.finding import WorkflowFinder
from sasflow.states import StepStatus, WorkflowStatus
from tests.support.pipeline import TRIP_INPUT, Pipeline, trip_definition

OPERATOR = "arn:aws:sts::123456789012:assumed-role/sasflow-operator/oncall"


def held_trip(**definition: Any) -> dict[str, Any]:
    """The sample trip under the hold policy (a step that fails for good waits for a person)."""
    return {**trip_definition(), "on_failure": "hold", **definition}


def operator_events(p: Pipeline, wid: str) -> list[dict[str, Any]]:
    return [e.detail or {} for e in events_of(p.snapshot(wid)) if e.kind == "operator_action"]


def act(p: Pipeline, wid: str, action: str, action_id: str, **kwargs: Any) -> WorkflowStatus:
    snapshot, messages = p.scheduler.operate(
        wid, action, principal=OPERATOR, reason=f"on-call: {action}", action_id=action_id, **kwargs
    )
    p.bus.send(messages)
    return snapshot.workflow.status


def held_at_hotel(p: Pipeline, **definition: Any) -> str:
    """A trip held because the hotel refused: the flight done, the hotel FAILED, nothing compensated."""
    p.services["hotels"].script["book"] = ["reject"]
    wid = p.start(held_trip(**definition), TRIP_INPUT)
    p.pump()
    return wid


def test_a_step_that_fails_under_the_hold_policy_holds_the_workflow_and_compensates_nothing() -> None:
    p = Pipeline()
    wid = held_at_hotel(p)
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.HELD
    assert snapshot.workflow.attention == "HELD"
    assert snapshot.workflow.reason == "step book_hotel failed: NO_SEATS (held for a person)"
    assert snapshot.steps["book_hotel"].status is StepStatus.FAILED
    assert snapshot.steps["reserve_flight"].status is StepStatus.COMPLETED
    assert p.services["flights"].actions() == ["reserve"]  # nothing undone
    assert snapshot.deadline is None  # no hold timeout: not supervised, found through the attention index
    assert [e.kind for e in events_of(snapshot)][-1] == "held"
    assert p.metrics["WorkflowsHeld"] == 1


def test_a_held_step_retried_with_an_edited_input_completes_under_a_new_token() -> None:
    # Given a trip held at the hotel, which refused (so nothing happened under the old token)
    p = Pipeline()
    wid = held_at_hotel(p)
    old_token = p.services["hotels"].calls[0][1]
    # When the operator retries it with an edited input
    edited = {"traveller": "Ada Lovelace", "flight": "any", "room": "twin"}
    assert act(p, wid, "retry", "a-1", step="book_hotel", step_input=edited) is WorkflowStatus.RUNNING
    # Then the request sent is the edited input (found by an on-call trial: the retry sent the definition's input,
    # and the edit took effect only at the next retry)
    [request] = p.requests("hotels")
    assert (request.action, request.attempt, request.input) == ("book", 2, edited)
    p.pump()
    # and the hotel is called again under a new token, and the trip completes
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPLETED
    hotel_calls = p.services["hotels"].calls
    assert [action for action, _ in hotel_calls] == ["book", "book"]
    assert hotel_calls[1][1] != old_token
    assert snapshot.steps["book_hotel"].attempt == 2
    assert snapshot.steps["book_hotel"].attempts_used == 1  # a new budget: the refused attempt does not count
    assert snapshot.input_of("book_hotel") == edited
    # and the audit names the operator, the reason and the action's id
    assert operator_events(p, wid) == [
        {
            "action": "retry",
            "principal": OPERATOR,
            "reason": "on-call: retry",
            "id": "a-1",
            "step": "book_hotel",
            "replaced_attempt": 1,
            "input_edited": True,
        }
    ]
    assert snapshot.workflow.attention is None


def test_an_action_id_reused_for_another_action_or_step_is_refused_not_answered_done() -> None:
    # Found by an on-call trial: a key reused for `pause` answered 200 and did nothing
    p = Pipeline()
    wid = held_at_hotel(p)
    act(p, wid, "retry", "k-1", step="book_hotel")
    with pytest.raises(IdempotencyKeyConflictError, match="'k-1' was already used for retry of step book_hotel"):
        act(p, wid, "pause", "k-1")
    with pytest.raises(IdempotencyKeyConflictError, match="not this cancel"):
        act(p, wid, "cancel", "k-1")
    assert [e["action"] for e in operator_events(p, wid)] == ["retry"]
    assert p.snapshot(wid).workflow.paused is False


def test_a_retry_of_a_paused_held_workflow_is_refused_until_it_is_resumed() -> None:
    p = Pipeline()
    wid = held_at_hotel(p)
    act(p, wid, "pause", "p-1")
    with pytest.raises(ConditionFailedError, match="workflow is paused: resume it, then retry the step"):
        act(p, wid, "retry", "r-1", step="book_hotel")
    assert p.requests("hotels") == []
    act(p, wid, "resume", "p-2")
    act(p, wid, "retry", "r-1", step="book_hotel")
    assert [r.attempt for r in p.requests("hotels")] == [2]


def test_a_paused_held_workflow_is_listed_and_counted_as_paused_and_as_held_again_once_resumed() -> None:
    # Found by an on-call trial: `get` said "PAUSED by an operator" while `list` showed it HELD and counted PAUSED 0
    p = Pipeline()
    wid = held_at_hotel(p)
    finder = WorkflowFinder(p.store, p.config.deadline_shards)
    act(p, wid, "pause", "p-1")
    page = finder.find(status="PAUSED")
    assert [(s.workflow_id, s.status, s.attention) for s in page.workflows] == [(wid, "HELD", "PAUSED")]
    assert (page.counts or {})["PAUSED"] == 1 and (page.counts or {})["HELD"] == 0
    assert finder.find(status="HELD").workflows == []
    act(p, wid, "resume", "p-2")
    page = finder.find(status="HELD")
    assert [(s.workflow_id, s.attention) for s in page.workflows] == [(wid, "HELD")]
    assert (page.counts or {})["PAUSED"] == 0 and (page.counts or {})["HELD"] == 1


def test_an_unknown_step_is_refused_as_such() -> None:
    p = Pipeline()
    wid = held_at_hotel(p)
    with pytest.raises(UnknownStepError) as raised:
        act(p, wid, "skip", "s-1", step="nosuch", output={})
    # the message names the steps there are (a 422 NO_SUCH_STEP at the API, not INVALID_DEFINITION)
    assert str(raised.value) == "the workflow has no step 'nosuch'; its steps: reserve_flight, book_hotel, charge_card"


def held_at_flight(p: Pipeline) -> str:
    """A trip held because the flight was refused: the hotel's input reads the flight's confirmation."""
    p.services["flights"].script["reserve"] = ["reject"]
    wid = p.start(held_trip(), TRIP_INPUT)
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.HELD
    return wid


def test_a_skip_without_the_output_a_later_step_reads_is_refused_naming_the_reference() -> None:
    # Given a trip held at the flight, whose hotel step reads steps.reserve_flight.output.confirmation (no default)
    p = Pipeline()
    wid = held_at_flight(p)
    before = p.snapshot(wid)
    # When the operator skips the flight without giving its output
    with pytest.raises(OutputNeededError) as refused:
        act(p, wid, "skip", "s-1")
    # Then it is refused (422 MISSING_REFERENCE) naming the reference that needs it, and nothing is written
    assert isinstance(refused.value, MissingReferenceError)
    assert (refused.value.step, refused.value.path, refused.value.expression) == (
        "reserve_flight",
        "steps[book_hotel].input.flight",
        "steps.reserve_flight.output.confirmation",
    )
    assert "skipping step reserve_flight needs its output" in str(refused.value)
    assert p.snapshot(wid).version == before.version
    assert p.snapshot(wid).workflow.status is WorkflowStatus.HELD


def test_a_skip_with_an_explicit_null_output_is_taken_as_given() -> None:
    p = Pipeline()
    wid = held_at_flight(p)
    act(p, wid, "skip", "s-1", output=None)
    record = p.snapshot(wid).steps["reserve_flight"]
    assert (record.status, record.output) == (StepStatus.COMPLETED, None)


def test_a_reference_with_a_default_or_a_condition_does_not_need_the_skipped_output() -> None:
    # Given a hotel step that reads the flight's confirmation with a default, and a condition on it
    p = Pipeline()
    p.services["flights"].script["reserve"] = ["reject"]
    hotel = {
        "input": {
            "traveller.$": "input.traveller",
            "flight.$": {"expression": "steps.reserve_flight.output.confirmation", "default": "NONE"},
        },
        "when": "steps.reserve_flight.output.confirmation || `true`",
    }
    wid = p.start({**trip_definition(book_hotel=hotel), "on_failure": "hold"}, TRIP_INPUT)
    p.pump()
    # When the flight is skipped with no output
    act(p, wid, "skip", "s-1")
    p.pump()
    # Then the trip goes on: the hotel is booked with the default
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED
    assert p.snapshot(wid).input_of("book_hotel")["flight"] == "NONE"


def test_the_skip_event_says_whether_the_skipped_step_is_compensated_on_unwind() -> None:
    # Given a trip held at the hotel (which has a compensation), skipped without an output (nothing reads it)
    p = Pipeline()
    wid = held_at_hotel(p)
    act(p, wid, "skip", "s-1", step="book_hotel")
    [event] = operator_events(p, wid)
    assert (event["action"], event["step"], event["compensated_on_unwind"]) == ("skip", "book_hotel", True)
    assert p.snapshot(wid).steps["book_hotel"].output is None
    # When a later step fails (held again) and the operator unwinds the trip
    p.services["payments"].script["charge"] = ["reject"]
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.HELD
    act(p, wid, "compensate", "c-1")
    p.pump()
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    # Then the skipped step is compensated like a completed one, as its event said
    assert snapshot.steps["book_hotel"].status is StepStatus.COMPENSATED


def test_a_repeated_action_id_changes_nothing() -> None:
    p = Pipeline()
    wid = held_at_hotel(p)
    p.services["hotels"].script["book"] = ["reject"]
    act(p, wid, "retry", "same-id")
    p.pump()
    held_again = p.snapshot(wid)
    assert held_again.workflow.status is WorkflowStatus.HELD
    # When the same request comes again (a client retrying after a timeout)
    status = act(p, wid, "retry", "same-id")
    # Then it answers the workflow as it is and writes nothing
    assert status is WorkflowStatus.HELD
    assert p.snapshot(wid).version == held_again.version
    assert len(operator_events(p, wid)) == 1


def test_a_skipped_step_completes_with_the_given_output_and_the_next_step_runs_with_it() -> None:
    # Given a trip held at the flight (refused), whose hotel step reads the flight's confirmation
    p = Pipeline()
    p.services["flights"].script["reserve"] = ["reject"]
    wid = p.start(held_trip(), TRIP_INPUT)
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.HELD
    # When the operator skips it with an output (booked by phone)
    act(p, wid, "skip", "s-1", output={"confirmation": "BY-PHONE-7"})
    p.pump()
    # Then the hotel was asked with that confirmation and the trip completes
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPLETED
    assert snapshot.steps["reserve_flight"].output == {"confirmation": "BY-PHONE-7"}
    assert snapshot.input_of("book_hotel")["flight"] == "BY-PHONE-7"
    view = WorkflowView.from_snapshot(snapshot)
    flight = view.steps[0]
    assert (flight.status, flight.finished_at) == (StepStatus.COMPLETED, snapshot.workflow.created_at)


def test_a_held_workflow_is_compensated_once_its_hold_timeout_has_passed() -> None:
    p = Pipeline()
    wid = held_at_hotel(p, hold_timeout_seconds=600)
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.hold_until == snapshot.workflow.updated_at + 600
    assert snapshot.deadline == snapshot.workflow.hold_until
    # Before the timeout the supervisor leaves it held
    p.clock.advance(590)
    p.sweep()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.HELD
    # After it, the supervisor compensates it
    p.clock.advance(60)
    p.sweep()
    p.pump()
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    assert snapshot.workflow.reason == "step book_hotel failed: NO_SEATS (held past its hold timeout)"
    assert p.metrics["WorkflowsStalled"] == 0  # a hold timeout is not the safety net
    assert p.services["flights"].actions() == ["reserve", "cancel_reservation"]


def test_compensate_now_unwinds_a_running_workflow() -> None:
    p = Pipeline()
    wid = p.start(trip_definition(), TRIP_INPUT)
    p.run_agent("flights")
    p.run_scheduler()  # the flight is done, the hotel in flight
    assert act(p, wid, "compensate", "c-1") is WorkflowStatus.COMPENSATING
    p.settle(wid)
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    assert snapshot.workflow.reason == "compensation requested by an operator"
    assert "cancel_reservation" in p.services["flights"].actions()


def failed_compensation(p: Pipeline) -> str:
    """A trip whose payment was refused and whose flight's compensation keeps failing: COMPENSATION_FAILED."""
    p.services["payments"].script["charge"] = ["reject"]
    p.services["flights"].script["cancel_reservation"] = ["503"] * 100
    # Five attempts, seconds apart (the default keeps trying for 30 minutes: test_compensation_policy.py)
    policy = {"max_attempts": 5, "backoff_base_seconds": 2.0, "backoff_cap_seconds": 60.0}
    compensation = {"action": "cancel_reservation", "input": {"confirmation.$": "step.output.confirmation"}}
    flight = {"compensation": {**compensation, "retry": policy}}
    wid = p.start(trip_definition(reserve_flight=flight), TRIP_INPUT)
    p.settle(wid)
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATION_FAILED
    return wid


def test_retry_compensation_after_the_service_is_back_ends_compensated_and_names_the_principal() -> None:
    p = Pipeline()
    wid = failed_compensation(p)
    flight = p.snapshot(wid).steps["reserve_flight"]
    assert flight.comp_error is not None and flight.comp_error["code"] == "TRANSIENT_EXHAUSTED"
    assert flight.error is None  # the action itself succeeded: only the compensation failed
    # When the service is back and the operator retries the compensations
    p.services["flights"].script["cancel_reservation"] = []
    assert act(p, wid, "retry-compensation", "rc-1") is WorkflowStatus.COMPENSATING
    p.settle(wid)  # the flights' circuit, opened by the failures, closes after its open time
    # Then it ends COMPENSATED, and the audit event names the operator
    snapshot = p.snapshot(wid)
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    assert snapshot.steps["reserve_flight"].comp_error is None
    assert snapshot.workflow.attention is None
    assert operator_events(p, wid)[0]["principal"] == OPERATOR
    assert p.services["flights"].effects[p.services["flights"].calls[-1][1]] == 1


def test_resolve_marks_a_failed_compensation_done_by_hand() -> None:
    p = Pipeline()
    wid = failed_compensation(p)
    assert act(p, wid, "resolve", "r-1") is WorkflowStatus.COMPENSATED
    flight = p.snapshot(wid).steps["reserve_flight"]
    assert flight.status is StepStatus.COMPENSATED
    assert flight.comp_output == {"resolved_by": OPERATOR, "reason": "on-call: resolve"}


def test_a_paused_workflow_dispatches_nothing_new_until_resumed() -> None:
    p = Pipeline()
    wid = p.start(trip_definition(), TRIP_INPUT)
    act(p, wid, "pause", "p-1")
    assert p.snapshot(wid).workflow.attention == "PAUSED"
    p.pump()  # the flight in flight finishes; the hotel waits
    snapshot = p.snapshot(wid)
    assert snapshot.steps["reserve_flight"].status is StepStatus.COMPLETED
    assert "book_hotel" not in snapshot.steps
    assert snapshot.deadline is None  # nothing in flight, nothing for the supervisor
    act(p, wid, "resume", "p-2")
    p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPLETED


def test_a_resume_is_not_refused_by_a_stale_read_that_misses_the_pause() -> None:
    # Found by the simulation: an eventually consistent read from before the pause made the resume a 409 "workflow
    # is not paused", and the workflow stayed paused for good. A refusal is now confirmed by a consistent read.
    p = Pipeline()
    wid = p.start(trip_definition(), TRIP_INPUT)
    before_pause = p.snapshot(wid)
    act(p, wid, "pause", "p-1")
    p.store.stale_reads[wid] = before_pause  # every eventually consistent read still shows it unpaused
    assert act(p, wid, "resume", "p-2") is WorkflowStatus.RUNNING
    assert p.snapshot(wid).workflow.paused is False
    assert [e["action"] for e in operator_events(p, wid)] == ["pause", "resume"]


def test_cancel_is_idempotent_and_a_completed_workflow_is_refused() -> None:
    p = Pipeline()
    wid = p.start(trip_definition(), TRIP_INPUT)
    first, _ = p.scheduler.cancel(wid, owner=None, principal=OPERATOR)
    again, messages = p.scheduler.cancel(wid, owner=None, principal=OPERATOR)
    assert first.workflow.status is again.workflow.status is WorkflowStatus.CANCELLING
    assert (again.version, messages) == (first.version, [])
    p.settle(wid)
    assert p.snapshot(wid).workflow.status is WorkflowStatus.CANCELLED
    assert p.scheduler.cancel(wid, owner=None, principal=OPERATOR)[0].workflow.status is WorkflowStatus.CANCELLED
    # A completed workflow compensates nothing
    done = p.start(trip_definition(), TRIP_INPUT)
    p.pump()
    undone = p.services["flights"].actions().count("cancel_reservation")
    with pytest.raises(ConditionFailedError, match="workflow is COMPLETED: nothing to cancel"):
        p.scheduler.cancel(done, owner=None, principal=OPERATOR)
    p.pump()
    assert p.services["flights"].actions().count("cancel_reservation") == undone
    assert p.snapshot(done).workflow.status is WorkflowStatus.COMPLETED


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ("retry", "workflow is RUNNING: only a step of a HELD workflow can be retried or skipped"),
        ("skip", "workflow is RUNNING: only a step of a HELD workflow can be retried or skipped"),
        ("retry-compensation", "workflow is RUNNING: no failed compensation to act on"),
        ("resolve", "workflow is RUNNING: no failed compensation to act on"),
        ("resume", "workflow is not paused"),
    ],
)
def test_an_action_that_does_not_apply_is_refused_with_the_reason_and_writes_nothing(action: str, message: str) -> None:
    p = Pipeline()
    wid = p.start(trip_definition(), TRIP_INPUT)
    before = p.snapshot(wid)
    with pytest.raises(ConditionFailedError, match=message):
        act(p, wid, action, "x-1")
    assert p.snapshot(wid) is before


def test_the_history_records_every_attempt_with_its_time_and_error_in_order() -> None:
    p = Pipeline()
    wid = failed_compensation(p)
    events = events_of(p.snapshot(wid))
    assert events[0].kind == "started" and events[-1].kind == "finished"
    assert events[-1].status == "COMPENSATION_FAILED"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert all(a.time <= b.time for a, b in itertools.pairwise(events))
    refusal = next(e for e in events if e.kind == "reply_applied" and e.step == "charge_card")
    assert (refusal.outcome, refusal.error_code, refusal.calls) == ("rejected", "NO_SEATS", 1)
    failed = [e for e in events if e.kind == "compensation_reply_applied" and e.step == "reserve_flight"]
    attempts = [e.attempt or 0 for e in failed]
    assert attempts == sorted(attempts) and attempts[0] == 1  # a deferred attempt is dispatched again as itself
    assert {(e.outcome, e.error_code) for e in failed} <= {
        ("failed", "TRANSIENT_EXHAUSTED"),
        ("failed", "DEADLINE_EXCEEDED"),
        ("deferred", "CIRCUIT_OPEN"),  # the history says which wait: an open circuit, not the call limits
    }
    assert failed[-1].outcome == "failed"
    # and pages of it continue where the last stopped
    first = HistoryPage.of(p.snapshot(wid), after=0, limit=5)
    rest = HistoryPage.of(p.snapshot(wid), after=int(first.next_cursor or 0), limit=500)
    assert [e.seq for e in first.events + rest.events] == [e.seq for e in events]
    assert rest.next_cursor is None


def test_the_view_gives_each_step_its_times_and_the_compensations_status_and_error() -> None:
    p = Pipeline()
    wid = failed_compensation(p)
    view = WorkflowView.from_snapshot(p.snapshot(wid))
    flight = view.steps[0]
    assert flight.compensation_status == "COMPENSATION_FAILED"
    assert flight.compensation_error is not None and flight.compensation_error["code"] == "TRANSIENT_EXHAUSTED"
    assert flight.started_at is not None and flight.finished_at is not None
    assert flight.compensation_started_at is not None and flight.compensation_finished_at is not None
    assert flight.started_at <= flight.finished_at <= flight.compensation_started_at
    assert flight.compensation_started_at <= flight.compensation_finished_at
    # The compensations ran in reverse order: the hotel's ended before the flight's began
    hotel = view.steps[1]
    assert hotel.compensation_status == "COMPENSATED"
    assert (hotel.compensation_finished_at or 0) <= flight.compensation_started_at


def test_each_applied_transition_logs_one_line_with_the_workflow_its_steps_attempts_and_moves(
    caplog: pytest.LogCaptureFixture,
) -> None:
    p = Pipeline()
    named: list[str] = []  # the handlers pass Logger.set_correlation_id: each call names its workflow first
    p.scheduler.correlate = named.append
    with caplog.at_level(logging.INFO, logger="sasflow.scheduler"):
        wid = p.start(trip_definition(), TRIP_INPUT)
        p.pump()
    lines = [
        (getattr(r, "steps", None), r.__dict__.get("from"), r.__dict__.get("to"))
        for r in caplog.records
        if r.getMessage() == "moved"
    ]
    assert lines == [
        ("reserve_flight#1 PENDING>PROCESSING", "NEW", "RUNNING"),
        ("reserve_flight#1 PROCESSING>COMPLETED, book_hotel#1 PENDING>PROCESSING", None, None),
        ("book_hotel#1 PROCESSING>COMPLETED, charge_card#1 PENDING>PROCESSING", None, None),
        ("charge_card#1 PROCESSING>COMPLETED", "RUNNING", "COMPLETED"),
    ]
    assert set(named) == {wid}  # so every line is found by the workflow's id (its correlation id)
    assert not any(hasattr(r, "workflow_id") for r in caplog.records if r.getMessage() == "moved")  # not twice
    assert all("input" not in r.__dict__ and "output" not in r.__dict__ for r in caplog.records)


def test_the_finder_lists_what_waits_for_a_person_and_counts_by_status() -> None:
    p = Pipeline()
    held = held_at_hotel(p)  # first: the failed compensation below leaves the flights' circuit open
    failed = failed_compensation(p)
    running = p.start(trip_definition(), TRIP_INPUT)
    finder = WorkflowFinder(p.store, p.config.deadline_shards)
    page = finder.find(status="COMPENSATION_FAILED")
    assert [s.workflow_id for s in page.workflows] == [failed]
    assert page.source == "attention index"
    assert [s.workflow_id for s in finder.find(status="HELD").workflows] == [held]
    assert [s.workflow_id for s in finder.find(status="RUNNING").workflows] == [running]
    assert page.counts == {"COMPENSATION_FAILED": 1, "HELD": 1, "PAUSED": 0, "RUNNING": 1}
    # a page at a time, following the cursor: every workflow in flight once, and then the cursor ends
    others = {running} | {p.start(trip_definition(), TRIP_INPUT) for _ in range(4)}
    seen: list[str] = []
    cursor: str | None = None
    for _ in range(20):
        page = finder.find(limit=1, cursor=cursor)
        seen += [s.workflow_id for s in page.workflows]
        cursor = page.cursor
        if cursor is None:
            break
    assert sorted(seen) == sorted(others)


class LaggingIndex:
    """The store's indexes as a GSI may answer just after a write: the listings as they were when `freeze` ran,
    the items (``current``) as they are now."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.frozen: dict[tuple[str, str], Any] = {}

    def freeze(self, shards: int) -> None:
        self.frozen[("attention", "HELD")] = self.store.attention("HELD", 200, None)
        for shard in range(shards):
            self.frozen[("in_flight", f"{shard:02d}")] = self.store.in_flight(f"{shard:02d}", 200, None, None)

    def attention(self, kind: str, limit: int, start: Any) -> Any:
        return self.frozen[("attention", kind)]

    def in_flight(self, shard: str, limit: int, start: Any, before: Any) -> Any:
        return self.frozen[("in_flight", shard)]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_listing_re_reads_its_page_so_a_workflow_retried_a_moment_ago_is_not_listed_as_held() -> None:
    # Given two held workflows and one in flight, and indexes that still answer as they did before one of the held
    # was retried and everything ran (a GSI lags its table)
    p = Pipeline()
    retried, still_held = held_at_hotel(p), held_at_hotel(p)
    running = p.start(trip_definition(), TRIP_INPUT)
    lagging = LaggingIndex(p.store)
    lagging.freeze(p.config.deadline_shards)
    act(p, retried, "retry", "lag-1", step="book_hotel")
    p.pump()
    assert (p.snapshot(retried).workflow.status, p.snapshot(running).workflow.status) == ("COMPLETED", "COMPLETED")
    finder = WorkflowFinder(lagging, p.config.deadline_shards)
    # When the operator lists what is HELD, and what is in flight
    held = finder.find(status="HELD")
    in_flight = finder.find()
    # Then the retried one is not listed as HELD: the page was re-read from the items, and a note says why
    assert [(s.workflow_id, s.status) for s in held.workflows] == [(still_held, "HELD")]
    assert held.notes == [
        "1 listed by the attention index changed since it was written (the index lags its table) and no longer "
        "match: left out"
    ]
    # And the one that completed since is not listed in flight
    assert [s.workflow_id for s in in_flight.workflows] == []
    assert in_flight.notes[0].startswith("1 listed by the deadline index changed since it was written")
