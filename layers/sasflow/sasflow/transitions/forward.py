"""Transitions of the steps' actions: a reply or a timeout of an attempt, the next attempt, and dispatch."""

from __future__ import annotations

from ..definition import StepDefinition
from ..limits import MAX_STEP_INPUT_BYTES, json_size
from ..messages import StepReply, StepRequest, remote_token
from ..records import StepRecord
from ..states import Outcome, Phase, StepStatus, WorkflowStatus
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


class ForwardTransitions(TransitionBase):
    """What happens to a step's action: its replies, its timeouts, its dispatch."""

    def _forward_outcome(self, record: StepRecord, reply: StepReply) -> None:
        step = self.definition.step(record.step)
        running = self.snapshot.workflow.status is WorkflowStatus.RUNNING
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
        if _no_call_made(reply) and running and record.deferrals < self.config.max_deferrals:
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

    def _forward_timed_out(self, record: StepRecord, step: StepDefinition) -> None:
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
            if all(self.snapshot.status_of(p) is StepStatus.COMPLETED for p in dependencies[name]):
                self._dispatch_forward(self.definition.step(name), 1, self.now)

    # ------------------------------------------------------------------ dispatch
    def _dispatch_forward(
        self, step: StepDefinition, attempt: int, start_at: int, *, base: StepRecord | None = None, delay: int = 0
    ) -> None:
        """Put ``step`` in flight as ``attempt`` and queue its request; a request that cannot be prepared fails it.

        Every failure while preparing a dispatch ends on the step that caused it (rendering its input, a size over
        the limits, an agent no longer configured): the step is FAILED with the reason, in this same write, so the
        workflow unwinds at once instead of a reply failing again and again until the step times out.
        """
        complete_by = start_at + step.timeout_seconds
        record = (base or StepRecord(step=step.name, status=StepStatus.PENDING)).evolve(
            status=StepStatus.PROCESSING, attempt=attempt, complete_by=complete_by
        )
        try:
            step_input = self.snapshot.input_of(step.name)
            json_size(step_input, MAX_STEP_INPUT_BYTES, what=f"the input of step {step.name}")
            request = StepRequest(
                workflow_id=self.workflow_id,
                step=step.name,
                phase=Phase.ACTION,
                agent=step.agent,
                action=step.action,
                attempt=attempt,
                complete_by=complete_by,
                token=remote_token(self.workflow_id, step.name, record.token_action(step.action)),
                input=step_input,
                backoff_base_seconds=step.retry.backoff_base_seconds,
                backoff_cap_seconds=step.retry.backoff_cap_seconds,
                jitter=step.retry.jitter,
                max_calls=step.retry.max_attempts,
            )
            outgoing = self._outgoing(step.agent, request, delay)
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
