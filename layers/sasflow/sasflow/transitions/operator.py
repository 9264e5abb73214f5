"""Transitions a person asks for: cancel, and the operator actions, each audited in the workflow's history.

Every action is a transition like any other (DESIGN "Operator actions"): computed from one read, stored with one
conditional write, its event (who, why, the action's id) written with it. It is idempotent: an action whose id the
history already holds changes nothing and answers the workflow as it is. Where it does not apply it raises
`ConditionFailedError` (the API's 409) with the reason, and nothing is written.

=================== ==================================== ===================================================
action              applies to                           does
=================== ==================================== ===================================================
retry               a HELD workflow's failed step        tries the step again with a new budget of attempts,
                                                         optionally with an edited input
skip                a HELD workflow's failed step        marks it COMPLETED with the given output; the next
                                                         steps run with it (no output given: refused 422 when
                                                         a later step's reference needs it; null may be given)
compensate          RUNNING or HELD                      unwinds now (what may have happened is undone)
retry-compensation  COMPENSATION_FAILED (or unwinding)   tries the failed compensations again, new budget
resolve             COMPENSATION_FAILED (or unwinding)   marks the failed compensations done by hand; the
                                                         unwind goes on and ends COMPENSATED
pause / resume      a workflow that is not terminal      no new dispatches while paused (replies and timeouts
                                                         of steps in flight are still handled)
cancel              RUNNING or HELD                      CANCELLING: compensates what may have happened; again
                                                         on CANCELLING or CANCELLED changes nothing
=================== ==================================== ===================================================
"""

from __future__ import annotations

from typing import Any

from ..definition import AnyStep, MapStep
from ..errors import ConditionFailedError, IdempotencyKeyConflictError, OutputNeededError, UnknownStepError
from ..records import StepRecord
from ..states import TERMINAL_WORKFLOW, StepStatus, WorkflowStatus
from .base import TransitionBase


class _NoOutput:
    """The type of `NO_OUTPUT`."""

    def __repr__(self) -> str:
        return "NO_OUTPUT"


#: A skip that gives no output (the request has no ``output``), unlike one that gives JSON null.
NO_OUTPUT: Any = _NoOutput()


class OperatorTransitions(TransitionBase):
    """Cancel and the operator actions. ``batch``: the batch an action is part of (``batches.py``), set by the
    scheduler before it applies one, written to the action's history event (its lineage)."""

    batch: str | None = None

    # ------------------------------------------------------------------ bookkeeping
    def already_done(self, action_id: str, action: str, step: str | None = None) -> bool:
        """Whether the history holds an operator action of this id (a repeated request: answer, change nothing).

        Raises
        ------
        IdempotencyKeyConflictError
            When the id was used for another action, or for the same action on another step (the API's 409
            ``IDEMPOTENCY_KEY_REUSED``): a reused key must not answer "done" for what it did not do.
        """
        detail = self.snapshot.operator_action(action_id) if action_id else None
        if detail is None:
            return False
        if detail.get("action") != action or (step is not None and detail.get("step") not in (None, step)):
            done = str(detail.get("action")) + (f" of step {detail['step']}" if detail.get("step") else "")
            raise IdempotencyKeyConflictError(
                f"Idempotency-Key {action_id!r} was already used for {done}, not this {action}"
            )
        return True

    def _audit(
        self,
        action: str,
        principal: str,
        reason: str,
        action_id: str,
        step: str | None = None,
        *,
        input_edited: bool | None = None,
        replaced_attempt: int | None = None,
    ) -> None:
        self.history.operator(
            action,
            principal,
            reason,
            step=step,
            id=action_id,
            input_edited=input_edited,
            replaced_attempt=replaced_attempt,
            batch=self.batch,
        )
        self.count("OperatorActions")

    def _status(self) -> WorkflowStatus:
        return self.snapshot.workflow.status

    def _refuse_unless(self, allowed: bool, message: str) -> None:
        if not allowed:
            raise ConditionFailedError(message)

    def _held_failed_step(self, step: str | None) -> StepRecord:
        self._refuse_unless(
            self._status() is WorkflowStatus.HELD,
            f"workflow is {self._status().value}: only a step of a HELD workflow can be retried or skipped",
        )
        if step is not None and step not in {s.name for s in self.definition.steps}:
            names = ", ".join(s.name for s in self.definition.steps)
            raise UnknownStepError(f"the workflow has no step {step!r}; its steps: {names}")
        failed = [r for r in self.snapshot.steps.values() if r.status is StepStatus.FAILED]
        if step is None:
            self._refuse_unless(len(failed) == 1, f"name the step: {sorted(r.step for r in failed)} failed")
            return failed[0]
        record = self.snapshot.steps.get(step)
        self._refuse_unless(
            record is not None and record.status is StepStatus.FAILED,
            f"step {step} is {record.status.value if record else 'PENDING'}, not FAILED",
        )
        assert record is not None  # nosec B101 # narrows the type: refused above otherwise
        return record

    # ------------------------------------------------------------------ cancel
    def cancel(self, principal: str, *, reason: str = "cancelled by request", action_id: str = "") -> None:
        """Stop a workflow: CANCELLING, which compensates what may have happened (audited: who asked).

        A cancel of a workflow that is CANCELLING or CANCELLED already changes nothing (a client retrying its
        cancel gets the same answer). A QUEUED workflow has done nothing: it is CANCELLED at once (the scheduler
        then deletes its entry in its tenant's queue).

        Raises
        ------
        ConditionFailedError
            When the workflow is neither RUNNING, HELD nor QUEUED (a COMPLETED one compensates nothing).
        """
        status = self._status()
        if status in (WorkflowStatus.CANCELLING, WorkflowStatus.CANCELLED) or self.already_done(action_id, "cancel"):
            return
        if status is WorkflowStatus.QUEUED:
            self._audit("cancel", principal, reason, action_id)
            self._finish(WorkflowStatus.CANCELLED, reason="cancelled by request while queued")
            return
        self._refuse_unless(
            status in (WorkflowStatus.RUNNING, WorkflowStatus.HELD), f"workflow is {status.value}: nothing to cancel"
        )
        self._audit("cancel", principal, reason, action_id)
        self.set_status(WorkflowStatus.CANCELLING, reason="cancelled by request")
        self.advance()

    # ------------------------------------------------------------------ a held workflow
    def retry(
        self,
        principal: str,
        reason: str,
        action_id: str,
        *,
        step: str | None = None,
        step_input: dict[str, Any] | None = None,
    ) -> None:
        """Try a held workflow's failed step again, with a new budget of attempts and optionally an edited input.

        The step keeps its remote token when its failure may have had an effect (the service then answers what it
        did, so the retry cannot double it); after a refusal, nothing happened under the old token, so the step gets
        a new one and the service sees the retry as new (with the edited input).

        Raises
        ------
        ConditionFailedError
            When the workflow is not HELD, or the step is not FAILED.
        """
        if self.already_done(action_id, "retry", step):
            return
        record = self._held_failed_step(step)
        self._refuse_unless(not self.snapshot.workflow.paused, "workflow is paused: resume it, then retry the step")
        definition = self.definition.step(record.step)
        self._refuse_unless(
            not isinstance(definition, MapStep),
            f"step {record.step} is a map step: its children ran as workflows of their own; skip it (with the "
            "output its later steps need) or compensate the workflow",
        )
        # the audit says whether the operator changed the input (the input itself: GET .../steps/{step}/input)
        self._audit(
            "retry",
            principal,
            reason,
            action_id,
            record.step,
            input_edited=True if step_input else None,
            replaced_attempt=record.attempt,
        )
        base = record.evolve(
            attempt_base=record.attempt,
            generation=record.generation if record.may_have_happened else record.generation + 1,
            input_override=step_input if step_input is not None else record.input_override,
            error=None,
        )
        self.snapshot = self.snapshot.with_workflow(self.snapshot.workflow.evolve(hold_until=None, reason=None))
        self.set_status(WorkflowStatus.RUNNING)
        # The edited input is on the step before its request is prepared (Snapshot.input_of reads it from there).
        self.set_step(base)
        self._resume_step(definition, base)
        self.advance()

    def _resume_step(self, definition: AnyStep, base: StepRecord) -> None:
        self._dispatch_forward(definition, base.attempt + 1, self.now, base=base)

    def skip(
        self, principal: str, reason: str, action_id: str, *, step: str | None = None, output: Any = NO_OUTPUT
    ) -> None:
        """Mark a held workflow's failed step COMPLETED with ``output``; the steps after it then run with it.

        ``output`` is any JSON, null too; `NO_OUTPUT` (none given) is refused when a reference of another step needs
        the output (``WorkflowDefinition.references_needing``): it would fail with ``MISSING_REFERENCE`` and hold
        the workflow again one step later. A skipped step counts as COMPLETED: if the workflow unwinds later, its
        compensation (if it has one) runs like any completed step's. The skip's history event says so
        (``compensated``).

        Raises
        ------
        ConditionFailedError
            When the workflow is not HELD, or the step is not FAILED.
        OutputNeededError
            When no output is given and a later step's reference without a default reads it (HTTP 422).
        """
        if self.already_done(action_id, "skip", step):
            return
        record = self._held_failed_step(step)
        if output is NO_OUTPUT:
            needing = self.definition.references_needing(record.step)
            if needing:
                raise OutputNeededError(record.step, *needing[0])
            output = None
        compensated = self.definition.step(record.step).compensation is not None
        self.history.operator(
            "skip",
            principal,
            reason,
            step=record.step,
            id=action_id,
            compensated_on_unwind=compensated,
            batch=self.batch,
        )
        self.count("OperatorActions")
        self.set_step(record.evolve(status=StepStatus.COMPLETED, output=output, error=None))
        self.snapshot = self.snapshot.with_workflow(self.snapshot.workflow.evolve(hold_until=None, reason=None))
        self.set_status(WorkflowStatus.RUNNING)
        self.advance()

    def compensate(self, principal: str, reason: str, action_id: str) -> None:
        """Unwind now: compensate, in reverse dependency order, every step whose action may have happened.

        Raises
        ------
        ConditionFailedError
            When the workflow is neither RUNNING nor HELD.
        """
        if self.already_done(action_id, "compensate"):
            return
        status = self._status()
        self._refuse_unless(
            status in (WorkflowStatus.RUNNING, WorkflowStatus.HELD),
            f"workflow is {status.value}: only a RUNNING or HELD workflow can be compensated",
        )
        self._audit("compensate", principal, reason, action_id)
        self.set_status(WorkflowStatus.COMPENSATING, reason="compensation requested by an operator")
        self.advance()

    # ------------------------------------------------------------------ failed compensations
    def _failed_compensations(self, step: str | None) -> list[StepRecord]:
        status = self._status()
        self._refuse_unless(
            status is WorkflowStatus.COMPENSATION_FAILED or status in (WorkflowStatus.COMPENSATING,),
            f"workflow is {status.value}: no failed compensation to act on",
        )
        failed = [r for r in self.snapshot.steps.values() if r.status is StepStatus.COMPENSATION_FAILED]
        if step is not None:
            failed = [r for r in failed if r.step == step]
        self._refuse_unless(bool(failed), f"no COMPENSATION_FAILED step{f' {step}' if step else ''}")
        return failed

    def _unwind_again(self) -> None:
        workflow = self.snapshot.workflow
        if workflow.status is WorkflowStatus.COMPENSATION_FAILED:
            cancelled = workflow.reason == "cancelled by request"
            self.snapshot = self.snapshot.with_workflow(workflow.evolve(expires_at=None))
            self.set_status(WorkflowStatus.CANCELLING if cancelled else WorkflowStatus.COMPENSATING)

    def _reopen(self, action: str, principal: str, reason: str, action_id: str, step: str | None) -> list[StepRecord]:
        """Audit ``action`` on the failed compensations (all, or ``step``'s) and unwind again; return them."""
        failed = self._failed_compensations(step)
        self._audit(action, principal, reason, action_id, step)
        self._unwind_again()
        return failed

    def retry_compensation(self, principal: str, reason: str, action_id: str, *, step: str | None = None) -> None:
        """Try the failed compensations again (all, or ``step``'s), each with a new budget of attempts and time.

        Raises
        ------
        ConditionFailedError
            When no compensation failed.
        """
        if self.already_done(action_id, "retry-compensation", step):
            return
        for record in self._reopen("retry-compensation", principal, reason, action_id, step):
            base = record.evolve(
                comp_attempt_base=record.comp_attempt, comp_error=None, comp_deferrals=0, comp_since=None
            )
            self._dispatch_compensation(base, record.comp_attempt + 1, self.now)
        self.advance()

    def resolve(self, principal: str, reason: str, action_id: str, *, step: str | None = None) -> None:
        """Mark the failed compensations (all, or ``step``'s) as done by hand; the unwind then goes on.

        Raises
        ------
        ConditionFailedError
            When no compensation failed.
        """
        if self.already_done(action_id, "resolve", step):
            return
        for record in self._reopen("resolve", principal, reason, action_id, step):
            done_by_hand = {"resolved_by": principal, "reason": reason}
            self.set_step(record.evolve(status=StepStatus.COMPENSATED, comp_output=done_by_hand))
        self.advance()

    # ------------------------------------------------------------------ pause
    def pause(self, principal: str, reason: str, action_id: str) -> None:
        """Stop new dispatches until `resume` (steps in flight finish; their timeouts are still handled).

        Raises
        ------
        ConditionFailedError
            When the workflow is terminal or paused already.
        """
        if self.already_done(action_id, "pause"):
            return
        workflow = self.snapshot.workflow
        self._refuse_unless(
            workflow.status not in TERMINAL_WORKFLOW,
            f"workflow is {workflow.status.value}: it has finished, nothing is left to pause or resume",
        )
        self._refuse_unless(not workflow.paused, "workflow is paused already")
        self._audit("pause", principal, reason, action_id)
        self.snapshot = self.snapshot.with_workflow(workflow.evolve(paused=True))
        self._touch()

    def resume(self, principal: str, reason: str, action_id: str) -> None:
        """Let a paused workflow go on: what waited is dispatched now.

        Raises
        ------
        ConditionFailedError
            When the workflow is not paused.
        """
        if self.already_done(action_id, "resume"):
            return
        workflow = self.snapshot.workflow
        self._refuse_unless(
            workflow.status not in TERMINAL_WORKFLOW,
            f"workflow is {workflow.status.value}: it has finished, nothing is left to pause or resume",
        )
        self._refuse_unless(workflow.paused, "workflow is not paused")
        self._audit("resume", principal, reason, action_id)
        self.snapshot = self.snapshot.with_workflow(workflow.evolve(paused=False))
        self._touch()
        self.advance()
