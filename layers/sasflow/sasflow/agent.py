"""The agent runtime: do one step's action on one remote service, safely (DESIGN Rules 4 and 8).

- Idempotent: the action runs inside powertools ``idempotent_function``, keyed by the business identity
  (workflow id, step, phase, action), never the SQS message id. A resend or a duplicate delivery returns the stored
  result; a duplicate that arrives while the first copy still runs is refused (IdempotencyAlreadyInProgressError),
  becomes a batch-item failure and comes back later. Every remote call carries the token derived from the same
  identity, so even a call repeated after a crash has one effect.
- Retried: transient failures are retried with tenacity, exponential backoff and full jitter, at most
  ``max_calls`` times, and never past ``min(complete_by, Lambda deadline) - safety margin``.
- Guarded: a circuit breaker shared by all instances stops calls to a failing service; an open circuit defers the
  attempt (``Outcome.DEFERRED``) without using it up.
- Limited: an agent that declares ``max_in_flight`` or ``rate`` takes a unit and a token of its instance's share
  before each call (``call_limits.py``); a record that cannot have one soon is deferred the same way.
- Claim-checked: a request whose input is a claim-check reference is resolved before the service is called (an HTTP
  service and a Python function both see the payload), and an output above the threshold is written to the payload
  bucket and replied as a reference (``claim_check.py``), also in the idempotency record. An output above
  ``max_payload_bytes`` fails the step with ``OUTPUT_TOO_LARGE``; a reference whose object is missing is
  ``REJECTED`` with ``CLAIM_CHECK_MISSING`` (the service was not called).

Only definitive results (success, business rejection, an oversized output) are stored as idempotent results;
transient failures raise inside the idempotent function so that its record is removed and a later attempt calls
the service again.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type

from .breaker import CircuitBreaker
from .call_limits import CallLimiter
from .claim_check import PENDING, ClaimCheck, is_reference
from .clock import Clock
from .errors import (
    AttemptDeferredError,
    CallsLimitedError,
    ClaimCheckMissingError,
    DeadlineExceededError,
    MalformedMessageError,
    RemoteRejectedError,
    RemoteTransientError,
)
from .messages import DEFAULT_PRIORITY, SQS_MAX_MESSAGE_BYTES, StepError, StepReply, StepRequest, decode_request, encode
from .ports import Counter, Outgoing, no_metrics
from .settings import AgentConfig
from .states import Outcome

logger = logging.getLogger("sasflow.agent")

#: A call is not started with less than this much time left (seconds).
MIN_CALL_SECONDS = 0.5
#: Largest output an agent replies with: the reply must fit in one SQS message with room for its envelope.
MAX_OUTPUT_BYTES = SQS_MAX_MESSAGE_BYTES - 4_096

F = TypeVar("F", bound=Callable[..., Any])


class RemoteClient(Protocol):
    """Calls the remote service once (see ``adapters.http_remote``)."""

    def call(self, request: StepRequest, timeout_seconds: float) -> dict[str, Any]:
        """Perform the request's action; raise RemoteRejectedError or RemoteTransientError."""
        ...


@dataclass(frozen=True)
class ActionResult:
    """A definitive result of a step's action, as stored by the idempotency layer (JSON-serialisable)."""

    outcome: Outcome
    output: Any = None
    error: dict[str, Any] | None = None
    calls: int = 0

    def to_dict(self) -> dict[str, Any]:
        """Serialise for the idempotency record."""
        return {"outcome": self.outcome.value, "output": self.output, "error": self.error, "calls": self.calls}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ActionResult:
        """Inverse of ``to_dict``."""
        return cls(Outcome(data["outcome"]), data.get("output"), data.get("error"), int(data.get("calls", 0)))


def no_idempotency(function: F) -> F:
    """An identity decorator, for runtimes that are made idempotent elsewhere (never in Lambda)."""
    return function


class AgentRuntime:
    """Performs step requests for one agent.

    Parameters
    ----------
    config:
        The agent's settings (name, margins, timeouts).
    remote:
        Client of the remote service.
    breaker:
        The shared circuit breaker of that service.
    clock:
        Injected time (retry deadlines and backoff sleeps use it).
    idempotent:
        Decorator that makes ``perform(request=...)`` idempotent (powertools ``idempotent_function`` in Lambda).
    rng:
        Random source of backoff jitter.
    metrics:
        Counter for ``RemoteCalls`` and friends.
    claims:
        The claim-check of large inputs and outputs (None: they travel as they are, within one SQS message).
    limiter:
        The agent's call limits shared by its instances (None: the agent declares none).
    """

    def __init__(
        self,
        config: AgentConfig,
        remote: RemoteClient,
        breaker: CircuitBreaker,
        clock: Clock,
        *,
        idempotent: Callable[[Callable[..., dict[str, Any]]], Callable[..., dict[str, Any]]] = no_idempotency,
        rng: random.Random | None = None,
        metrics: Counter = no_metrics,
        claims: ClaimCheck | None = None,
        limiter: CallLimiter | None = None,
    ) -> None:
        self.config = config
        self.limiter = limiter
        self.claims = claims
        self.remote = remote
        self.breaker = breaker
        self.clock = clock
        self.rng = rng or random.Random()  # nosec B311 # retry jitter only; remote tokens are uuid5 of the step
        self.metrics = metrics
        self._perform = idempotent(self._perform_action)

    def process(self, body: str, time_left: Callable[[], float], *, message_id: str = "") -> list[Outgoing]:
        """Handle one SQS record body and return the reply to send to the response queue.

        Parameters
        ----------
        body:
            The record's body: a JSON ``StepRequest``.
        time_left:
            Seconds left in the Lambda invocation.
        message_id:
            The SQS message id, for the log lines only: the idempotency key never depends on it (DESIGN Rule 4).

        Raises
        ------
        MalformedMessageError
            When the body is not a valid request (the record fails, and ends in the dead-letter queue).
        DeadlineExceededError
            When the invocation has too little time left to start (the record fails and is delivered again, so the
            records after a slow one in the same batch are retried, not lost).
        """
        if time_left() < self.config.safety_margin_seconds + MIN_CALL_SECONDS:
            raise DeadlineExceededError("not enough time left in this invocation to start the record")
        reply = self.handle(decode_request(body), time_left, message_id=message_id)
        return [Outgoing(queue_url=self.config.response_queue_url, body=encode(reply), workflow_id=reply.workflow_id)]

    def handle(self, request: StepRequest, time_left: Callable[[], float], *, message_id: str = "") -> StepReply:
        """Do ``request`` and return the reply to send.

        Parameters
        ----------
        request:
            The step request from this agent's queue.
        time_left:
            Seconds left in the Lambda invocation (``context.get_remaining_time_in_millis() / 1000``).
        message_id:
            The SQS message id of the request, for log lines.

        Returns
        -------
        StepReply
            SUCCEEDED / REJECTED from the (possibly stored) result; DEFERRED when the circuit is open or the calls are
            at their limit (``deferred_by="limit"``); FAILED with
            ``retryable`` when time ran out before the calls did.

        Raises
        ------
        MalformedMessageError
            When the request is for another agent (it was sent to the wrong queue).
        IdempotencyAlreadyInProgressError
            When another instance is doing the same action right now (the record is retried later).
        """
        if request.agent != self.config.agent_name:
            raise MalformedMessageError(f"request for agent {request.agent!r} reached {self.config.agent_name!r}")
        if request.action not in self.config.actions:
            # The engine refuses such definitions at the start; this can only be a configuration that changed since.
            self.metrics("ActionsNotAllowed")
            allowed = ", ".join(self.config.actions)
            error = StepError(code="ACTION_NOT_ALLOWED", message=f"{request.action!r} is not one of: {allowed}")
            return self._reply(request, Outcome.REJECTED, error=error)
        # Bounded work (Rule 8): stop early enough to reply before min(complete_by, Lambda deadline).
        deadline = min(float(request.complete_by), self.clock.now() + time_left()) - self.config.safety_margin_seconds
        try:
            result = ActionResult.from_dict(self._perform(request=request, deadline=deadline, message_id=message_id))
        except AttemptDeferredError as exc:
            # The reply reports what the attempt did before the circuit or a limit stopped it: a failed half-open
            # probe is a call, and one that timed out may have taken effect (DESIGN Rule 6).
            limited = isinstance(exc, CallsLimitedError)
            self.metrics("CallLimitDeferrals" if limited else "CircuitOpenDeferrals")
            wait = max(1, math.ceil(exc.retry_at - self.clock.now()))
            return self._reply(
                request,
                Outcome.DEFERRED,
                retry_at=exc.retry_at,
                retry_after=min(900, wait),
                calls=exc.calls,
                outcome_unknown=exc.outcome_unknown,
                deferred_by="limit" if limited else None,
            )
        except DeadlineExceededError as exc:
            self.metrics("AttemptsOutOfTime")
            error = StepError(code="DEADLINE_EXCEEDED", message=str(exc)[:2048])
            return self._reply(
                request,
                Outcome.FAILED,
                error=error,
                retryable=True,
                calls=exc.calls,
                outcome_unknown=exc.outcome_unknown,
            )
        except RemoteTransientError as exc:
            self.metrics("AttemptsExhausted")
            error = StepError(code="TRANSIENT_EXHAUSTED", message=str(exc)[:2048])
            return self._reply(
                request, Outcome.FAILED, error=error, calls=exc.calls, outcome_unknown=exc.outcome_unknown
            )
        detail = StepError.model_validate(result.error) if result.error else None
        return self._reply(request, result.outcome, output=result.output, error=detail, calls=result.calls)

    def _reply(
        self,
        request: StepRequest,
        outcome: Outcome,
        *,
        output: Any = None,
        error: StepError | None = None,
        retry_at: int | None = None,
        retry_after: int | None = None,
        retryable: bool = False,
        calls: int = 0,
        outcome_unknown: bool = False,
        deferred_by: Literal["limit"] | None = None,
    ) -> StepReply:
        return StepReply(
            workflow_id=request.workflow_id,
            step=request.step,
            phase=request.phase,
            attempt=request.attempt,
            outcome=outcome,
            output=output,
            error=error,
            retry_at=retry_at,
            retry_after_seconds=retry_after,
            retryable=retryable,
            calls=calls,
            outcome_unknown=outcome_unknown,
            deferred_by=deferred_by,
        )

    def _perform_action(self, request: StepRequest, deadline: float, message_id: str = "") -> dict[str, Any]:
        """Call the service with retries; return a definitive ``ActionResult`` as a dict, or raise.

        Only ``request`` makes the idempotency key (its business identity): ``deadline`` and ``message_id`` differ
        between deliveries of the same step request.
        """
        logger.debug(
            "performing action",
            extra={
                "workflow_id": request.workflow_id,
                "step": request.step,
                "phase": request.phase.value,
                "attempt": request.attempt,
                "message_id": message_id,
            },
        )
        if self.claims is not None and is_reference(request.input):
            try:
                resolved = self.claims.resolve(request.input, request.workflow_id)
            except ClaimCheckMissingError as exc:
                self.metrics("ClaimCheckMissing")
                error = {"code": "CLAIM_CHECK_MISSING", "message": str(exc)[:2048]}
                return ActionResult(Outcome.REJECTED, error=error).to_dict()
            request = request.model_copy(update={"input": resolved})
        calls = 0
        unknown = False  # a call may have taken effect without an answer (a read timeout)
        out_of_time = False

        def stop(state: RetryCallState) -> bool:
            nonlocal out_of_time
            if state.attempt_number >= request.max_calls:
                return True
            if self.clock.now() + state.upcoming_sleep + MIN_CALL_SECONDS >= deadline:
                out_of_time = True
                return True
            return False

        def wait(state: RetryCallState) -> float:
            delay = min(request.backoff_cap_seconds, request.backoff_base_seconds * 2 ** (state.attempt_number - 1))
            return self.rng.uniform(0, delay) if request.jitter else delay

        def call_once() -> dict[str, Any]:
            nonlocal calls, unknown
            left = deadline - self.clock.now()
            if left < MIN_CALL_SECONDS:
                raise DeadlineExceededError(
                    f"{left:.2f}s left before complete-by minus margin", calls=calls, outcome_unknown=unknown
                )
            self.breaker.before_call()
            timeout = min(self.config.remote_timeout_seconds, left)
            priority = request.priority or DEFAULT_PRIORITY
            permit = None if self.limiter is None else self.limiter.acquire(timeout, deadline, priority=priority)
            calls += 1
            self.metrics("RemoteCalls")
            try:
                output = self.remote.call(request, timeout_seconds=timeout)
            except RemoteTransientError as exc:
                unknown = unknown or exc.outcome_unknown
                self.breaker.on_failure()
                raise
            except RemoteRejectedError:
                self.breaker.on_success()  # the service answered: it is healthy
                raise
            finally:
                if permit is not None:
                    permit.release()
            self.breaker.on_success()
            return output

        retrying = Retrying(
            stop=stop,
            wait=wait,
            retry=retry_if_exception_type(RemoteTransientError),
            sleep=self.clock.sleep,
            reraise=True,
        )
        try:
            output = retrying(call_once)
        except RemoteRejectedError as exc:
            return ActionResult(
                Outcome.REJECTED, error={"code": exc.code, "message": exc.message}, calls=calls
            ).to_dict()
        except AttemptDeferredError as exc:
            exc.calls, exc.outcome_unknown = calls, unknown
            raise
        except RemoteTransientError as exc:
            if out_of_time:
                raise DeadlineExceededError(
                    f"stopped retrying after {calls} call(s): {exc}", calls=calls, outcome_unknown=unknown
                ) from exc
            exc.calls, exc.outcome_unknown = calls, unknown
            raise
        size = len(json.dumps(output, separators=(",", ":"), ensure_ascii=False).encode())
        limit = MAX_OUTPUT_BYTES if self.claims is None else self.claims.max_payload_bytes
        if size > limit:
            # The action happened but its output cannot travel: fail the step so the workflow compensates it.
            error = {"code": "OUTPUT_TOO_LARGE", "message": f"output is {size} bytes; limit {limit}"}
            return ActionResult(Outcome.FAILED, error=error, calls=calls).to_dict()
        if self.claims is not None and size > self.claims.threshold_bytes:
            # Written before the reply that names it, pending: the scheduler makes it live when it applies the reply
            # (a workflow that is gone never does, and it expires). The idempotency record keeps the reference.
            output = self.claims.offload(
                request.workflow_id, output, what=f"the output of step {request.step}", state=PENDING
            )
            self.metrics("OutputsClaimChecked")
        return ActionResult(Outcome.SUCCEEDED, output=output, calls=calls).to_dict()
