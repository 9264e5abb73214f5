"""Transitions of unwinding: compensations in reverse dependency order, their replies and their timeouts."""

from __future__ import annotations

from typing import Any

from ..definition import AnyStep, CallbackStep, CompensationRetryPolicy, MapStep, WaitStep, render
from ..messages import StepReply
from ..records import StepRecord
from ..states import Outcome, Phase, StepStatus, WorkflowStatus
from .base import (
    _MAX_SQS_DELAY,
    _PREPARATION_ERRORS,
    TransitionBase,
    _error,
    _no_call_made,
    _preparation_error,
    _retry_delay,
    _settled,
)


class CompensationTransitions(TransitionBase):
    """Unwinding a workflow: which steps to compensate, when, and what their compensations' answers do."""

    def _compensation_outcome(self, record: StepRecord, reply: StepReply) -> None:
        step = self.definition.task(record.step)
        assert step.compensation is not None  # nosec B101 # narrows the type: only steps with a compensation are ever COMPENSATING
        policy = step.compensation.retry
        if reply.outcome is Outcome.SUCCEEDED:
            # The compensation happened; its output is informative only, so an oversized one is not kept.
            output = None if self.oversized else reply.output
            self.set_step(_settled(record, StepStatus.COMPENSATED, comp_output=output))
            return
        left = self._budget_left(record, policy)
        # A deferral (an open circuit, or no time left on arrival: no call made) uses no attempt, and is bounded by
        # the policy's time budget alone: a breaker that stays open through a 15-minute outage must not use up the
        # compensation's attempts, nor give up before the budget does.
        if _no_call_made(reply) and left > 0:
            delay = min(_retry_delay(reply, self.now), left)
            if reply.deferred_by == "limit":
                # A busy service (the agent's call limits): counted apart, as for the action, and not as trouble.
                base = record.evolve(limit_deferrals=record.limit_deferrals + 1)
            else:
                base = record.evolve(comp_deferrals=record.comp_deferrals + 1)
            self._dispatch_compensation(base, record.comp_attempt, self.now + delay, delay=delay)
            return
        # A compensation makes one call per attempt, so every failure that is not a definitive refusal uses one
        # supervised attempt and is retried with backoff while attempts and time remain (a business refusal cannot
        # improve). The last retry falls no later than the budget's end.
        if reply.outcome is not Outcome.REJECTED and record.comp_attempts_used < policy.max_attempts and left > 0:
            delay = min(round(policy.delay_seconds(record.comp_attempt, self.rng)), left, _MAX_SQS_DELAY)
            self._dispatch_compensation(record, record.comp_attempt + 1, self.now + delay, delay=delay)
            return
        self.set_step(_settled(record, StepStatus.COMPENSATION_FAILED, error=self._gave_up(record, reply, left)))

    def _budget_left(self, record: StepRecord, policy: CompensationRetryPolicy) -> int:
        """Seconds of the compensation's time budget left now (0 when it has run out)."""
        since = record.comp_since if record.comp_since is not None else self.now
        return max(0, since + policy.budget_minutes * 60 - self.now)

    def _gave_up(self, record: StepRecord, reply: StepReply, left: int) -> dict[str, Any]:
        error = _error(reply)
        if left <= 0 and reply.outcome is not Outcome.REJECTED:
            # Say which limit ended it: the person paged reads this first.
            message = f"{error.get('message', '')} (gave up: the compensation's time budget ran out)"
            error = {**error, "message": message}
        return error

    def _compensation_timed_out(self, record: StepRecord, step: AnyStep) -> None:
        assert step.compensation is not None  # nosec B101 # narrows the type: only a step with a compensation is COMPENSATING
        policy = step.compensation.retry
        if record.comp_attempts_used < policy.max_attempts and self._budget_left(record, policy) > 0:
            self.history.resent(step.name, Phase.COMPENSATION, record.comp_attempt)
            self._dispatch_compensation(record.evolve(resends=record.resends + 1), record.comp_attempt + 1, self.now)
            self.count("SupervisorResends")
            return
        self.history.timed_out(step.name, Phase.COMPENSATION, record.comp_attempt)
        error = {"code": "TIMED_OUT", "message": f"no reply to compensation attempt {record.comp_attempt}"}
        self.set_step(_settled(record, StepStatus.COMPENSATION_FAILED, error=error))

    def _unwind(self) -> None:
        """Compensate, in reverse dependency order, every step whose action may have happened (DESIGN Rule 6)."""
        definition = self.definition
        # 1. Seal never-dispatched steps: none of them may start once unwinding has begun.
        for name in reversed(definition.order):
            if name not in self.snapshot.steps:
                self.set_step(StepRecord(step=name, status=StepStatus.SKIPPED))
        # 2. End the waits and the callbacks: they have nothing to undo, and their answer no longer matters. End a map
        #    in flight too: its children are unwound by its compensation (those started may have done something).
        for name in definition.order:
            record = self.snapshot.steps[name]
            if record.status is not StepStatus.PROCESSING:
                continue
            kind = definition.step(name)
            if isinstance(kind, (WaitStep, CallbackStep)):
                error = {"code": "UNWOUND", "message": "the workflow unwound while this step waited"}
                self.set_step(_settled(record, StepStatus.FAILED, error=error, may_have_happened=False))
            elif isinstance(kind, MapStep):
                error = {"code": "UNWOUND", "message": "the workflow unwound while this map step's children ran"}
                started = record.map is not None and record.map.launched > 0
                self.set_step(_settled(record, StepStatus.FAILED, error=error, may_have_happened=started))
        steps = self.snapshot.steps
        # 3. Wait while a forward action is in flight: its reply or its timeout decides whether it happened.
        if any(r.status is StepStatus.PROCESSING for r in steps.values()):
            return
        compensating = any(r.status is StepStatus.COMPENSATING for r in steps.values())
        if any(r.status is StepStatus.COMPENSATION_FAILED for r in steps.values()):
            if not compensating:
                self._finish(WorkflowStatus.COMPENSATION_FAILED)
            return

        def needs(name: str) -> bool:
            record = steps[name]
            kind = definition.step(name)
            # a map step is undone by unwinding the children it started: one that started none has nothing to undo
            started = isinstance(kind, MapStep) and record.map is not None and record.map.launched > 0
            has_compensation = kind.compensation is not None or started
            maybe = record.status is StepStatus.COMPLETED or (
                record.status is StepStatus.FAILED and record.may_have_happened
            )
            return has_compensation and maybe

        def settled(name: str) -> bool:
            return not needs(name) and steps[name].status is not StepStatus.COMPENSATING

        pending = [name for name in reversed(definition.order) if needs(name)]
        if not pending and not compensating:
            cancelled = self.snapshot.workflow.status is WorkflowStatus.CANCELLING
            self._finish(WorkflowStatus.CANCELLED if cancelled else WorkflowStatus.COMPENSATED)
            return
        if self.snapshot.workflow.paused:
            return  # an operator paused it: compensations in flight finish, no new one starts
        descendants = definition.descendants
        for name in pending:
            if all(settled(d) for d in descendants[name]):
                self._dispatch_compensation(steps[name], 1, self.now)
                self.count("CompensationsStarted")

    def _dispatch_compensation(self, record: StepRecord, comp_attempt: int, start_at: int, *, delay: int = 0) -> None:
        """Put the compensation of ``record`` in flight; one that cannot be prepared is COMPENSATION_FAILED."""
        if isinstance(self.definition.step(record.step), MapStep):
            self._start_map_compensation(record)  # its children unwind (transitions.mapping)
            return
        step = self.definition.task(record.step)
        compensation = step.compensation
        assert compensation is not None  # nosec B101 # narrows the type: only steps with a compensation are compensated
        complete_by = start_at + compensation.timeout_seconds
        try:
            context = dict(self.context())
            output = record.output if self.claims is None else self.claims.resolve(record.output, self.workflow_id)
            context["step"] = {"input": self.input_of(step.name), "output": output}
            # The compensated step's output is unknown when its action timed out: `step.*` may render null (the
            # agent then finds the action by its original token); any other reference that finds nothing fails it.
            comp_input = render(
                compensation.input,
                context,
                where=f"steps[{step.name}].compensation.input",
                nullable_roots=frozenset({"step"}),
            )
            comp_input = self.claim_input(comp_input, f"the compensation input of step {step.name}")
            outgoing = self._request(
                step.name,
                Phase.COMPENSATION,
                step.agent,
                compensation.action,
                attempt=comp_attempt,
                complete_by=complete_by,
                token_action=record.token_action(compensation.action),
                original_action=record.token_action(step.action),
                step_input=comp_input,
                retry=compensation.retry,
                # One call per compensation attempt: retries are new supervised attempts, delayed by the backoff.
                max_calls=1,
                delay=delay,
            )
        except _PREPARATION_ERRORS as error:
            # Nothing can undo this step without a person: it waits, COMPENSATION_FAILED, with the reason.
            self._refuse(step.name, error, Phase.COMPENSATION)
            self.set_step(_settled(record, StepStatus.COMPENSATION_FAILED, error=_preparation_error(error)))
            return
        since = record.comp_since if record.comp_since is not None else self.now  # the budget starts at attempt 1
        self.set_step(
            record.evolve(
                status=StepStatus.COMPENSATING, comp_attempt=comp_attempt, complete_by=complete_by, comp_since=since
            )
        )
        self.history.dispatched(step.name, Phase.COMPENSATION, comp_attempt, complete_by)
        self.messages.append(outgoing)
