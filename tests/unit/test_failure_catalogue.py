"""Failure catalogue (issue 3 §2), in-memory tier: failures people who run this kind of system have reported.

Each test names the failure and asserts the values the catalogue gives.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from aws_lambda_powertools.utilities.idempotency.exceptions import IdempotencyAlreadyInProgressError

from sasflow.clock import ManualClock
from sasflow.errors import PayloadTooLargeError
from sasflow.messages import SQS_MAX_MESSAGE_BYTES, StepRequest, encode, remote_token
from sasflow.states import Outcome, Phase, StepStatus, WorkflowStatus
from simulation.world import powertools_on_clock
from tests.support.pipeline import Pipeline

START = 1_800_000_000.0


def flight_request(p: Pipeline, wid: str) -> StepRequest:
    [request] = p.requests("flights")
    assert request.workflow_id == wid
    return request


def test_duplicate_delivery_while_the_first_copy_still_runs_calls_the_remote_once() -> None:
    # Given the same request reaching two agent instances; the first one's remote call is still running
    p = Pipeline(clock=ManualClock(START))
    wid = p.start()
    request = flight_request(p, wid)
    first, second = p.runtime("flights"), p.runtime("flights")  # two instances, one idempotency store
    service = p.services["flights"]
    in_call, release = threading.Event(), threading.Event()
    original = service.call

    def slow_call(req: StepRequest, timeout_seconds: float) -> dict[str, Any]:
        in_call.set()
        assert release.wait(10)  # the "500 ms" call, held open by the test instead of by a sleep
        return original(req, timeout_seconds)

    service.call = slow_call  # type: ignore[method-assign]
    replies = []
    worker = threading.Thread(target=lambda: replies.append(first.handle(request, lambda: 60.0)))
    worker.start()
    assert in_call.wait(10)
    # When the duplicate arrives meanwhile (50 ms later)
    with pytest.raises(IdempotencyAlreadyInProgressError):
        second.handle(request, lambda: 60.0)
    release.set()
    worker.join()
    # Then there was 1 remote call, the duplicate became a batch-item failure, and the step is unchanged
    assert len(service.calls) == 1
    assert [r.outcome for r in replies] == [Outcome.SUCCEEDED]
    record = p.snapshot(wid).steps["reserve_flight"]
    assert (record.status, record.attempt) == (StepStatus.PROCESSING, 1)


def test_agent_killed_after_the_side_effect_is_not_refused_as_in_progress_and_has_one_effect() -> None:
    # Given an agent that made the remote call and was killed before recording the result (and before replying)
    p = Pipeline(clock=ManualClock(START))
    p.services["payments"].script["charge"] = ["reject"]
    with powertools_on_clock(p.clock):
        wid = p.start()
        [message] = p.bus.receive("queue/flights")
        persistence = p.persistence["flights"]
        original_update = persistence._update_record

        def killed(data_record: Any) -> None:  # the keyword powertools calls it with
            raise SystemExit("Lambda killed")

        persistence._update_record = killed  # type: ignore[method-assign]
        # (SystemExit is a BaseException: powertools' "except Exception" around the save lets it through unwrapped)
        with pytest.raises(SystemExit, match=r"^Lambda killed$"):
            p.runtimes["flights"].process(message.body, lambda: 30.0)
        persistence._update_record = original_update  # type: ignore[method-assign]
        assert len(p.services["flights"].calls) == 1
        # When the supervisor resends after complete-by + grace (the in-progress record expired with the invocation)
        p.clock.advance(30 + 30 + 1)
        assert p.sweep().messages == 1
        [resend] = p.run_agent("flights")
        # Then it is not refused as in progress: it calls again with the same token, for one effect in all
        assert (resend.attempt, resend.outcome) == (2, Outcome.SUCCEEDED)
        assert len(p.services["flights"].calls) == 2
        assert {token for _, token in p.services["flights"].calls} == {remote_token(wid, "reserve_flight", "reserve")}
        assert sum(p.services["flights"].effects.values()) == 1
        # And when the workflow is later compensated (payments rejects), this step's compensation runs too
        p.pump()
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATED
    assert p.services["flights"].actions()[-1] == "cancel_reservation"


def test_overlapping_supervisors_start_one_compensation_for_an_exhausted_step() -> None:
    # Given a step on its last attempt (max_attempts 3) whose reply never comes
    p = Pipeline()
    wid = p.start()
    for _ in range(2):
        p.run_agent("flights", lose_replies=True)
        p.clock.advance(61)
        p.sweep()
    p.run_agent("flights", lose_replies=True)
    assert p.snapshot(wid).steps["reserve_flight"].attempt == 3
    p.clock.advance(61)
    # When two supervisors sweep at once
    barrier = threading.Barrier(2)

    def sweep() -> None:
        barrier.wait()
        p.sweep(use_lease=False)

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then exactly one compensation started
    assert p.metrics["CompensationsStarted"] == 1
    assert [(r.step, r.phase) for r in p.requests("flights")] == [("reserve_flight", Phase.COMPENSATION)]
    assert p.snapshot(wid).workflow.status is WorkflowStatus.COMPENSATING


def _request_of_size(size: int) -> StepRequest:
    base = StepRequest(
        workflow_id="wf",
        step="s",
        phase=Phase.ACTION,
        agent="flights",
        action="reserve",
        attempt=1,
        complete_by=int(START),
        token="t",
        input={"pad": ""},
    )
    padding = size - len(encode(base).encode())
    return base.model_copy(update={"input": {"pad": "x" * padding}})


def test_a_message_of_exactly_262144_bytes_is_accepted_and_one_more_byte_is_oversize() -> None:
    exact = _request_of_size(SQS_MAX_MESSAGE_BYTES)
    assert len(encode(exact).encode()) == 262_144
    with pytest.raises(PayloadTooLargeError, match="262145 bytes; the limit is 262144"):
        encode(_request_of_size(SQS_MAX_MESSAGE_BYTES + 1))


def test_an_agent_result_of_300000_bytes_fails_the_step_and_compensates_it() -> None:
    # Given the flight service answers with a 300,000-byte result
    p = Pipeline()
    service = p.services["flights"]
    original = service.call

    def huge(req: StepRequest, timeout_seconds: float) -> dict[str, Any]:
        result = original(req, timeout_seconds)
        return {**result, "blob": "x" * 300_000} if req.action == "reserve" else result

    service.call = huge  # type: ignore[method-assign]
    # When the trip runs
    wid = p.start()
    p.pump()
    # Then the reply went out, the step is not left PROCESSING, and the action (which happened) was compensated
    snapshot = p.snapshot(wid)
    record = snapshot.steps["reserve_flight"]
    assert record.status is StepStatus.COMPENSATED
    assert record.error is not None and record.error["code"] == "OUTPUT_TOO_LARGE"
    assert snapshot.workflow.status is WorkflowStatus.COMPENSATED
    assert service.actions() == ["reserve", "cancel_reservation"]
