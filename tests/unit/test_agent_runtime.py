"""The agent runtime: bounded retries against complete-by and the Lambda deadline, clock skew, breaker, sizes."""

from __future__ import annotations

import pytest

from sasflow.clock import ManualClock, OffsetClock
from sasflow.errors import ConfigurationError, MalformedMessageError
from sasflow.messages import StepRequest, remote_token
from sasflow.settings import AgentConfig
from sasflow.states import Outcome, Phase
from tests.support.pipeline import Pipeline

START = 1_800_000_000.0


def request(clock: ManualClock, *, complete_in: int, agent: str = "flights", max_calls: int = 10) -> StepRequest:
    return StepRequest(
        workflow_id="wf-1",
        step="reserve_flight",
        phase=Phase.ACTION,
        agent=agent,
        action="reserve",
        attempt=1,
        complete_by=int(clock.now()) + complete_in,
        token=remote_token("wf-1", "reserve_flight", "reserve"),
        backoff_base_seconds=1.0,
        backoff_cap_seconds=2.0,
        jitter=False,
        max_calls=max_calls,
    )


def test_retries_stop_before_complete_by_and_the_lambda_deadline() -> None:
    # Given calls that each hang 4 s and time out, a 15 s Lambda and complete-by in 12 s (margin 2 s)
    p = Pipeline(clock=ManualClock(START))
    runtime = p.runtime("flights", remote_timeout_seconds=4.0)
    p.services["flights"].default = "timeout"
    lambda_deadline = START + 15

    # When the agent handles the request
    reply = runtime.handle(request(p.clock, complete_in=12), lambda: lambda_deadline - p.clock.now())

    # Then it stopped early enough to reply before min(complete_by, Lambda deadline) and reported a retryable failure:
    # call (4 s), backoff 1 s, call (4 s), then the next backoff + a call would pass complete_by - margin = 10 s.
    assert (reply.outcome, reply.retryable) == (Outcome.FAILED, True)
    assert reply.error is not None and reply.error.code == "DEADLINE_EXCEEDED"
    assert len(p.services["flights"].calls) == 2
    assert p.clock.now() == START + 4 + 1 + 4  # 9 s: 1 s short of complete_by - margin (START + 10)


def test_no_time_left_means_no_call() -> None:
    p = Pipeline(clock=ManualClock(START))
    runtime = p.runtime("flights")
    reply = runtime.handle(request(p.clock, complete_in=2), lambda: 60.0)
    assert (reply.outcome, reply.retryable) == (Outcome.FAILED, True)
    assert p.services["flights"].calls == []


def test_an_agent_clock_five_seconds_ahead_stops_before_the_supervisor_grace_runs_out() -> None:
    # Given the supervisor's clock, an agent clock 5 s ahead, grace 30 s and a service that always times out
    supervisor_clock = ManualClock(START)
    p = Pipeline(clock=supervisor_clock, grace=30)
    agent_clock = OffsetClock(supervisor_clock, 5.0)
    runtime = p.runtime("flights", clock=agent_clock, remote_timeout_seconds=3.0)
    p.services["flights"].default = "timeout"
    req = request(supervisor_clock, complete_in=20)
    # When the agent works on it
    reply = runtime.handle(req, lambda: 900.0)
    # Then it gave up by its own clock, whose deadline is complete_by - margin 2 s = START + 18, i.e. START + 13 by
    # the supervisor's clock. Agent time:  5 call (3 s)  8 backoff 1 s  9 call  12 backoff 2 s  14 call  17; the next
    # backoff (2 s) + a call (0.5 s) would end at 19.5 > 18, so it stops at agent time 17 = supervisor time 12.
    assert (reply.outcome, reply.retryable, reply.calls) == (Outcome.FAILED, True, 3)
    assert reply.error is not None and reply.error.code == "DEADLINE_EXCEEDED"
    assert len(p.services["flights"].calls) == 3
    assert supervisor_clock.now() == START + 12
    assert req.complete_by == START + 20


def test_a_request_for_another_agent_is_malformed() -> None:
    p = Pipeline(clock=ManualClock(START))
    with pytest.raises(MalformedMessageError, match="reached 'flights'"):
        p.runtimes["flights"].handle(request(p.clock, complete_in=30, agent="hotels"), lambda: 60.0)


def test_an_output_too_large_for_a_reply_fails_the_step_without_crashing() -> None:
    p = Pipeline(clock=ManualClock(START))
    service = p.services["flights"]
    original = service.call

    def huge(req: StepRequest, timeout_seconds: float) -> dict[str, object]:
        original(req, timeout_seconds)
        return {"blob": "x" * 300_000}

    service.call = huge  # type: ignore[method-assign]
    runtime = p.runtime("flights")
    reply = runtime.handle(request(p.clock, complete_in=30), lambda: 60.0)
    assert reply.outcome is Outcome.FAILED
    assert reply.error is not None and reply.error.code == "OUTPUT_TOO_LARGE"
    assert reply.output is None
    assert len(service.calls) == 1


def test_a_business_rejection_is_remembered_so_a_resend_does_not_call_again() -> None:
    p = Pipeline(clock=ManualClock(START))
    p.services["flights"].script["reserve"] = ["reject"]
    runtime = p.runtimes["flights"]
    first = runtime.handle(request(p.clock, complete_in=30), lambda: 60.0)
    second = runtime.handle(request(p.clock, complete_in=30).model_copy(update={"attempt": 2}), lambda: 60.0)
    assert (first.outcome, second.outcome) == (Outcome.REJECTED, Outcome.REJECTED)
    assert (first.attempt, second.attempt) == (1, 2)
    assert len(p.services["flights"].calls) == 1


@pytest.mark.parametrize(("value", "reason"), [("11", "less than or equal to 10"), ("0", "greater than or equal to 1")])
def test_an_agent_concurrency_out_of_range_is_refused_naming_its_variable(value: str, reason: str) -> None:
    environ = {
        "AGENT_NAME": "trains",
        "AGENT_ACTIONS": "book_seat",
        "IDEMPOTENCY_TABLE": "idempotency",
        "RESPONSE_QUEUE_URL": "https://sqs.us-east-1.amazonaws.com/123456789012/replies",
        "AGENT_CONCURRENCY": value,
    }
    with pytest.raises(ConfigurationError, match=f"AGENT_CONCURRENCY: Input should be {reason}"):
        AgentConfig.from_env(environ)
    assert AgentConfig.from_env({**environ, "AGENT_CONCURRENCY": "4"}).concurrency == 4
    del environ["AGENT_CONCURRENCY"]
    assert AgentConfig.from_env(environ).concurrency == 1  # one at a time unless the template says otherwise
