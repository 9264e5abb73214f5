"""Transitions of the steps' actions: a reply or a timeout of an attempt, the next attempt, and dispatch.

A task step's action is a request to its agent. A wait step's "action" is its timer: the step is in flight until its
resume time (its complete-by), and resumes by a message the scheduler sends itself, delayed until then. SQS delays a
message at most 900 seconds, so a longer wait's timer is sent by the supervisor's sweep that finds it within 900
seconds of its time (its ``timer_at``); the supervisor resumes a wait itself only when its timer is lost. A step
whose ``when`` is false is SKIPPED instead of dispatched.
"""

from __future__ import annotations

import hmac
from datetime import datetime
from typing import Any

from jmespath.exceptions import JMESPathError

from ..callbacks import (
    CallbackExpiredError,
    CallbackNotFoundError,
    CallbackRequest,
    CallbackUsedError,
    TaskToken,
    answer_digest,
    new_nonce,
    nonce_matches,
    task_token,
)
from ..claim_check import is_reference
from ..definition import MAX_WAIT_SECONDS, AnyStep, CallbackStep, MapStep, WaitStep, render
from ..errors import ClaimCheckMissingError, ConditionNotEvaluatedError, PayloadTooLargeError, WaitNotEvaluatedError
from ..expressions import RenderBudget, evaluate
from ..messages import StepReply, encode
from ..ports import Outgoing
from ..records import StepRecord
from ..states import DONE_STEP, Outcome, Phase, StepStatus, WorkflowStatus
from .base import (
    _PREPARATION_ERRORS,
    TransitionBase,
    _error,
    _no_call_made,
    _output_too_large,
    _preparation_error,
    _retry_delay,
    _retryable,
    _settled,
    backoff_seconds,
)

#: What evaluating a condition can raise (its step then fails with CONDITION_NOT_EVALUATED).
_CONDITION_ERRORS = (JMESPathError, PayloadTooLargeError, ClaimCheckMissingError, RecursionError, TypeError, ValueError)


class ForwardTransitions(TransitionBase):
    """What happens to a step's action: its replies, its timeouts, its dispatch."""

    def _earlier_success(self, record: StepRecord, reply: StepReply) -> bool:
        """Whether ``reply`` is a success of an earlier attempt of a task step whose action is still in flight
        under the same remote token, so that it completes the step (issue 13).

        The token derives from the workflow, the step, the action and the step's ``generation``, never the attempt
        (`messages.remote_token`), so every attempt of one generation asks the service the same question and gets the
        same answer: there is no need to wait for the resend's round trip. The generation changes only with an
        operator's retry, which sets ``attempt_base`` to the attempts before it, so an attempt after ``attempt_base``
        ran under the current token. A failure of an earlier attempt never moves the step: the current attempt may
        still succeed. Wait steps (their own timer) and callback steps (an answer is bound to its attempt's nonce)
        keep the rule of their current attempt.

        Timeline::

            attempt 1 sent ... complete-by passes, attempt 2 resent ... attempt 1's SUCCEEDED arrives -> COMPLETED
            attempt 1 sent ... complete-by passes, attempt 2 resent ... attempt 1's FAILED arrives    -> ignored
            attempt 2 FAILED, held, operator retry (attempt_base 2, new token), attempt 3 ... attempt 2's SUCCEEDED
                                                                                                     -> ignored
        """
        if reply.phase is not Phase.ACTION or reply.outcome is not Outcome.SUCCEEDED:
            return False
        if record.status is not StepStatus.PROCESSING or record.phase is not Phase.ACTION:
            return False
        if not record.attempt_base < reply.attempt < record.attempt:
            return False
        return not isinstance(self.definition.step(record.step), WaitStep | CallbackStep)

    def _forward_outcome(self, record: StepRecord, reply: StepReply) -> None:
        step = self.definition.step(record.step)
        if isinstance(step, WaitStep):
            self._wait_timer(record)
            return
        if isinstance(step, CallbackStep) and reply.outcome is Outcome.SUCCEEDED:
            return  # the notification went out: the step waits for its callback
        assert not isinstance(step, MapStep)  # nosec B101 # narrows the type: a map's replies go to transitions.mapping
        running = self.snapshot.workflow.status is WorkflowStatus.RUNNING
        # A held workflow lets its steps in flight finish: one deferred (no call made, no attempt used) goes on
        # waiting its turn (found by make sim, seed 12: a step deferred by the call limits while its workflow was
        # held was failed DEFERRED, and held the workflow again after the operator's retry of the other step).
        finishing = running or self.snapshot.workflow.status is WorkflowStatus.HELD
        claims = self.claims
        if reply.outcome is Outcome.SUCCEEDED and self.oversized and claims and not is_reference(reply.output):
            # The item is full: the output leaves it, written before the write that names it.
            output = claims.offload(
                self.workflow_id, reply.output, what=f"the output of step {record.step}", force=True
            )
            self.snapshot = self.snapshot.with_workflow(self.snapshot.workflow.evolve(claim_checked=True))
            self.set_step(_settled(record, StepStatus.COMPLETED, output=output))
            self.count("OutputsClaimCheckedByScheduler")
            return
        if reply.outcome is Outcome.SUCCEEDED and self.oversized:
            # The action happened, but its output cannot be kept for the steps after it: fail it and undo it.
            self.set_step(_settled(record, StepStatus.FAILED, error=_output_too_large(), may_have_happened=True))
            return
        if reply.outcome is Outcome.SUCCEEDED:
            self.set_step(_settled(record, StepStatus.COMPLETED, output=reply.output))
            return
        if reply.outcome is Outcome.REJECTED:
            self.set_step(_settled(record, StepStatus.FAILED, error=_error(reply), may_have_happened=False))
            return
        # An attempt that made calls without a definitive answer (a failed probe of a half-open circuit, a read
        # timeout) may have had its effect: remembered on the step, so an unwind compensates it.
        reached = record.may_have_happened or reply.calls > 0 or reply.outcome_unknown
        if reply.outcome is Outcome.DEFERRED and reply.deferred_by == "limit" and finishing:
            # The service is busy, not failing: the step waits its turn as long as it takes, its complete-by
            # moved past the wait, and no attempt and no budget of deferrals is used (issue 38).
            delay = _retry_delay(reply, self.now)
            base = record.evolve(limit_deferrals=record.limit_deferrals + 1, may_have_happened=reached)
            self._dispatch_forward(step, record.attempt, self.now + delay, base=base, delay=delay)
            return
        if _no_call_made(reply) and finishing and record.deferrals < self.config.max_deferrals:
            delay = _retry_delay(reply, self.now)
            base = record.evolve(deferrals=record.deferrals + 1, may_have_happened=reached)
            self._dispatch_forward(step, record.attempt, self.now + delay, base=base, delay=delay)
            return
        retryable = reply.outcome is Outcome.DEFERRED or _retryable(reply)
        if retryable and running and record.attempts_used < step.retry.max_attempts:
            delay = round(backoff_seconds(step.retry, record.attempt, self.rng))
            base = record.evolve(may_have_happened=reached)
            self._dispatch_forward(step, record.attempt + 1, self.now + delay, base=base, delay=delay)
            return
        self.set_step(_settled(record, StepStatus.FAILED, error=_error(reply), may_have_happened=True))

    def _forward_timed_out(self, record: StepRecord, step: AnyStep) -> None:
        if isinstance(step, WaitStep):
            self._resume_wait(record, by_supervisor=True)  # its time is past: the supervisor resumes it
            return
        assert not isinstance(step, MapStep)  # nosec B101 # narrows the type: handle_overdue routes maps elsewhere
        if self.snapshot.workflow.status is WorkflowStatus.RUNNING and record.attempts_used < step.retry.max_attempts:
            self.history.resent(step.name, Phase.ACTION, record.attempt)
            self._dispatch_forward(step, record.attempt + 1, self.now, base=record.evolve(resends=record.resends + 1))
            self.count("SupervisorResends")
            return
        self.history.timed_out(step.name, Phase.ACTION, record.attempt)
        error = {"code": "TIMED_OUT", "message": f"no reply by complete-by after attempt {record.attempt}"}
        self.set_step(_settled(record, StepStatus.FAILED, error=error, may_have_happened=True))
        self.count("StepsTimedOut")
        if self.snapshot.workflow.status is WorkflowStatus.RUNNING:
            self.fail_workflow(step.name, f"step {step.name} timed out after {record.attempt} attempt(s)")

    def _dispatch_ready(self) -> None:
        if self.snapshot.workflow.paused:
            return  # an operator paused it: nothing new starts until it is resumed
        dependencies = self.definition.dependencies
        for name in self.definition.order:
            if name in self.snapshot.steps:
                continue
            if all(self.snapshot.status_of(p) in DONE_STEP for p in dependencies[name]):
                step = self.definition.step(name)
                if step.when is None or self._condition_holds(step):
                    self._dispatch_forward(step, 1, self.now)

    def _condition_holds(self, step: AnyStep) -> bool:
        """Evaluate ``step.when``; a false one marks the step SKIPPED, one that cannot be evaluated fails it.

        The value counts as JMESPath does: false, null, and an empty string, list or object are false; anything else
        (0 too) is true. A reference that finds nothing is null, so false: a condition asks, it does not require.
        """
        assert step.when is not None  # nosec B101 # narrows the type: called only for a step with a condition
        try:
            value = evaluate(step.when, self.context(), RenderBudget())
        except _CONDITION_ERRORS as exc:
            error = ConditionNotEvaluatedError(
                f"steps[{step.name}].when: {step.when[:200]!r} could not be evaluated: {exc}"
            )
            self._refuse(step.name, error)
            pending = StepRecord(step=step.name, status=StepStatus.PENDING)
            self.set_step(
                _settled(pending, StepStatus.FAILED, error=_preparation_error(error), may_have_happened=False)
            )
            return False
        if value is None or value is False or (isinstance(value, (str, list, dict)) and not value):
            self.set_step(StepRecord(step=step.name, status=StepStatus.SKIPPED))
            self.history.skipped(step.name)
            self.count("StepsSkipped")
            return False
        return True

    # ------------------------------------------------------------------ wait steps
    def _wait_timer(self, record: StepRecord) -> None:
        """A wait step's timer message arrived: resume it, or arm the timer again if it came early."""
        complete_by = record.complete_by or self.now
        if self.now >= complete_by:
            # Never a second early, even for a copy of the timer delivered before its time (a redrive, another
            # invocation's clock): such a copy arms the timer again for the rest.
            self._resume_wait(record, by_supervisor=False)
            return
        step = self.definition.step(record.step)
        assert isinstance(step, WaitStep)  # nosec B101 # narrows the type: only a wait's timer comes here
        self._arm_timer(step, record, complete_by)

    def _resume_wait(self, record: StepRecord, *, by_supervisor: bool) -> None:
        self.history.resumed(record.step, record.attempt)
        self.set_step(_settled(record, StepStatus.COMPLETED, output={"until": record.complete_by}))
        self.count("WaitsResumedBySupervisor" if by_supervisor else "WaitsResumed")

    def _resume_time(self, step: WaitStep) -> int:
        """When ``step`` resumes (epoch seconds): ``now + seconds``, or its ``until`` (a time already past: now).

        Raises
        ------
        MissingReferenceError
            When ``until`` finds nothing.
        WaitNotEvaluatedError
            When ``until`` is not epoch seconds or an ISO 8601 time with its offset, or is more than a year away.
        """
        if step.seconds is not None:
            return self.now + step.seconds
        assert step.until is not None  # nosec B101 # a wait gives exactly one of seconds and until
        value = render({"until.$": step.until}, self.context(), where=f"steps[{step.name}]")["until"]
        at: float
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise WaitNotEvaluatedError(f"steps[{step.name}].until is {value!r}: not a time")
        if isinstance(value, str):
            try:
                parsed = datetime.fromisoformat(value)
            except ValueError:
                raise WaitNotEvaluatedError(
                    f"steps[{step.name}].until is {value[:64]!r}: not an ISO 8601 time"
                ) from None
            if parsed.tzinfo is None:
                raise WaitNotEvaluatedError(f"steps[{step.name}].until is {value[:64]!r}: an ISO time needs its offset")
            at = parsed.timestamp()
        else:
            at = float(value)
        if at > self.now + MAX_WAIT_SECONDS:
            hint = " (milliseconds? until is in epoch seconds)" if at > 10_000_000_000 else ""
            raise WaitNotEvaluatedError(f"steps[{step.name}].until is more than {MAX_WAIT_SECONDS} seconds away{hint}")
        return max(self.now, int(-(-at // 1)))  # whole seconds, rounded up: never resumed before its time

    def _start_wait(self, step: WaitStep, attempt: int, base: StepRecord | None) -> None:
        pending = base or StepRecord(step=step.name, status=StepStatus.PENDING)
        try:
            complete_by = self._resume_time(step)
        except _PREPARATION_ERRORS as error:
            self._refuse(step.name, error)
            self.set_step(
                _settled(pending, StepStatus.FAILED, error=_preparation_error(error), may_have_happened=False)
            )
            return
        record = pending.evolve(status=StepStatus.PROCESSING, attempt=attempt, complete_by=complete_by)
        self.history.dispatched(step.name, Phase.ACTION, attempt, complete_by)
        self._arm_timer(step, record, complete_by)

    def _arm_timer(self, step: WaitStep, record: StepRecord, complete_by: int) -> None:
        """Keep ``record`` in flight until ``complete_by``; send its timer when that is within SQS's longest delay.

        A longer wait keeps ``timer_at`` (complete-by - 900 s): the supervisor sends its timer from then on
        (`TransitionBase.handle_overdue`), and resumes it itself only if that timer is lost.
        """
        delay = complete_by - self.now
        timer_at = None if delay <= _MAX_TIMER_DELAY else complete_by - _MAX_TIMER_DELAY
        self.set_step(record.evolve(timer_at=timer_at) if record.timer_at != timer_at else record)
        if delay <= _MAX_TIMER_DELAY:
            timer = StepReply(
                workflow_id=self.workflow_id,
                step=step.name,
                phase=Phase.ACTION,
                attempt=record.attempt,
                outcome=Outcome.SUCCEEDED,
            )
            self.messages.append(_timer(self.config.response_queue_url, timer, delay))

    # ------------------------------------------------------------------ callback steps
    def _issue_token(
        self, step: CallbackStep, attempt: int, start_at: int, base: StepRecord | None, delay: int
    ) -> None:
        """Put a callback step's ``attempt`` in flight with a new task token, and send its notification if any."""
        complete_by = start_at + step.timeout_seconds
        pending = base or StepRecord(step=step.name, status=StepStatus.PENDING)
        # A notification deferred by an open circuit goes again under the same attempt: its token stays the one
        # already shown (a person may hold it); only a new attempt issues a new token.
        same_attempt = pending.attempt == attempt and pending.callback_nonce is not None
        nonce = pending.callback_nonce if same_attempt else new_nonce()
        record = pending.evolve(
            status=StepStatus.PROCESSING,
            attempt=attempt,
            complete_by=complete_by,
            callback_nonce=nonce,
            answer=pending.answer if same_attempt else None,
        )
        outgoing = None
        if step.notify is not None:
            notify = step.notify
            try:
                notify_input = render(notify.input, self.context(), where=f"steps[{step.name}].notify.input")
                notify_input["task_token"] = task_token(
                    self.workflow_id, step.name, attempt, record.callback_nonce or ""
                )
                notify_input = self.claim_input(notify_input, f"the notification input of step {step.name}")
                outgoing = self._request(
                    step.name,
                    Phase.ACTION,
                    notify.agent,
                    notify.action,
                    attempt=attempt,
                    complete_by=complete_by,
                    # one notification per token: the remote token (and the agent's idempotency key) names the attempt
                    token_action=f"{record.token_action(notify.action)}@{attempt}",
                    step_input=notify_input,
                    retry=step.retry,
                    max_calls=3,
                    delay=delay,
                )
            except _PREPARATION_ERRORS as error:
                self._refuse(step.name, error)
                self.set_step(
                    _settled(pending, StepStatus.FAILED, error=_preparation_error(error), may_have_happened=False)
                )
                return
        self.set_step(record)
        self.history.dispatched(step.name, Phase.ACTION, attempt, complete_by)
        if outgoing is not None:
            self.messages.append(outgoing)
        self.count("CallbackTokensIssued")

    def apply_callback(self, token: TaskToken, request: CallbackRequest, audit: dict[str, str] | None = None) -> None:
        """Apply a use of a callback step's task token (``POST /callbacks/{token}``), then advance.

        ``audit`` (an operator's answer, ``POST /ops/callbacks/{token}``: ``action``, ``principal``, ``reason``,
        ``id``) is written to the history beside the answer, as an operator action on the step.

        Raises
        ------
        CallbackNotFoundError
            When the token names no callback step's attempt of this workflow (or its nonce is not that attempt's).
        CallbackUsedError
            When its attempt was answered already (success or failure) with another answer; the same answer again
            changes nothing (``StepRecord.answer``).
        CallbackExpiredError
            When its attempt timed out or was superseded, or the workflow no longer waits for it.
        """
        names = {s.name for s in self.definition.steps}
        step = self.definition.step(token.step) if token.step in names else None
        record = self.snapshot.steps.get(token.step)
        if not isinstance(step, CallbackStep) or record is None or token.attempt > record.attempt:
            raise CallbackNotFoundError("no such task token")
        if token.attempt < record.attempt:
            raise CallbackExpiredError(f"attempt {token.attempt} of step {step.name} is over: it timed out")
        if not nonce_matches(record.callback_nonce, token.nonce):
            raise CallbackNotFoundError("no such task token")
        workflow = self.snapshot.workflow
        digest = answer_digest(request) if request.status != "heartbeat" else None
        answered = record.answer if record.status is not StepStatus.PROCESSING else None
        if answered is not None and digest is not None and hmac.compare_digest(answered.get("digest", ""), digest):
            # The same answer again (its caller lost the response): applied once already, nothing to write; the
            # scheduler answers with the result the first use was given.
            self.count("CallbackAnswersRepeated")
            return
        if record.status is not StepStatus.PROCESSING:
            code = (record.error or {}).get("code")
            if record.status is StepStatus.COMPLETED or (
                record.status is StepStatus.FAILED and code == "CALLBACK_FAILED"
            ):
                raise CallbackUsedError(f"the token of step {step.name} was used already (it is {record.status.value})")
            raise CallbackExpiredError(
                f"step {step.name} no longer waits for this token ({code or record.status.value})"
            )
        if workflow.status is not WorkflowStatus.RUNNING and workflow.status is not WorkflowStatus.HELD:
            raise CallbackExpiredError(f"workflow is {workflow.status.value}: it no longer waits for this token")
        if self.now > (record.complete_by or 0) + self.config.deadline_grace_seconds:
            # past complete-by and its grace: the supervisor times it out (as it does an agent's late reply)
            raise CallbackExpiredError(f"attempt {record.attempt} of step {step.name} is past its complete-by")
        if request.status == "heartbeat":
            self.history.heartbeat(step.name, record.attempt)
            self.set_step(record.evolve(complete_by=self.now + step.timeout_seconds))
            self.count("CallbackHeartbeats")
            return
        if audit is not None:
            self.history.operator(audit["action"], audit["principal"], audit["reason"], step=step.name, id=audit["id"])
        if request.status == "succeeded":
            self.history.callback(step.name, record.attempt, Outcome.SUCCEEDED, None)
            self.set_step(_settled(record, StepStatus.COMPLETED, output=request.output))
        else:
            error = {
                "code": "CALLBACK_FAILED",
                "message": (request.error.message if request.error else request.reason or "failed by its callback")[
                    :2048
                ],
            }
            if request.error is not None:
                error["cause"] = request.error.code
            self.history.callback(step.name, record.attempt, Outcome.REJECTED, "CALLBACK_FAILED")
            self.set_step(_settled(record, StepStatus.FAILED, error=error, may_have_happened=False))
        self.count("CallbacksApplied")
        self.advance()
        # Kept by the same write: what a repeat of this answer must match, and the result it is given then.
        applied = self.snapshot.steps[step.name]
        self.set_step(
            applied.evolve(
                answer={
                    "digest": digest or "",
                    "step_status": applied.status.value,
                    "workflow_status": self.snapshot.workflow.status.value,
                }
            )
        )

    # ------------------------------------------------------------------ dispatch
    def _dispatch_forward(
        self, step: AnyStep, attempt: int, start_at: int, *, base: StepRecord | None = None, delay: int = 0
    ) -> None:
        """Put ``step`` in flight as ``attempt`` and queue its request; a request that cannot be prepared fails it.

        Every failure while preparing a dispatch ends on the step that caused it (rendering its input, a size over
        the limits, an agent no longer configured): the step is FAILED with the reason, in this same write, so the
        workflow unwinds at once instead of a reply failing again and again until the step times out. A wait step
        starts its wait instead.
        """
        if isinstance(step, WaitStep):
            self._start_wait(step, attempt, base)
            return
        if isinstance(step, CallbackStep):
            self._issue_token(step, attempt, start_at, base, delay)
            return
        if isinstance(step, MapStep):
            self._start_map(step, attempt, base)
            return
        complete_by = start_at + step.timeout_seconds
        record = (base or StepRecord(step=step.name, status=StepStatus.PENDING)).evolve(
            status=StepStatus.PROCESSING, attempt=attempt, complete_by=complete_by
        )
        try:
            step_input = self.claim_input(self.input_of(step.name), f"the input of step {step.name}")
            outgoing = self._request(
                step.name,
                Phase.ACTION,
                step.agent,
                step.action,
                attempt=attempt,
                complete_by=complete_by,
                token_action=record.token_action(step.action),
                step_input=step_input,
                retry=step.retry,
                max_calls=step.retry.max_attempts,
                delay=delay,
            )
        except _PREPARATION_ERRORS as error:
            # An earlier attempt may have reached the service; a first dispatch never did.
            failed = base or StepRecord(step=step.name, status=StepStatus.PENDING)
            self._refuse(step.name, error)
            self.set_step(
                _settled(failed, StepStatus.FAILED, error=_preparation_error(error), may_have_happened=attempt > 1)
            )
            return
        self.set_step(record)
        self.history.dispatched(step.name, Phase.ACTION, attempt, complete_by)
        self.messages.append(outgoing)


#: SQS's longest DelaySeconds: a wait no longer than this is resumed by its own delayed message.
_MAX_TIMER_DELAY = 900


def _timer(queue_url: str, timer: StepReply, delay: int) -> Outgoing:
    body: Any = encode(timer)
    delay_seconds = max(0, min(_MAX_TIMER_DELAY, delay))
    return Outgoing(queue_url=queue_url, body=body, delay_seconds=delay_seconds, workflow_id=timer.workflow_id)
