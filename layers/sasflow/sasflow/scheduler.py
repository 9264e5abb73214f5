"""The scheduler: every workflow and step transition happens here.

The API (start, cancel), the scheduler Lambda (agents' replies) and the supervisor (overdue steps) all call this
service. Each call reads the workflow's one record, works out every transition it allows in memory (a
`_Transition`: apply the reply or the timeout, then advance: dispatch ready steps, finish, or unwind), and stores
the result with **one** conditional write on the record's version (DESIGN Rule 2). A writer that loses the race
(a duplicate reply, a parallel sibling's reply, the supervisor, a cancel) reads again and works it out again from
the fresh state, at most ``MAX_ATTEMPTS`` times; the transitions never depend on which writer wins.

It returns the messages to send instead of sending them, so callers send only after the state that expects them is
durable (Rule 1, write-ahead) and can batch the sends. A crash after the write and before the send leaves a step in
flight with no message: the supervisor resends it after its complete-by.
"""

from __future__ import annotations

import logging
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .clock import Clock, epoch_seconds
from .definition import RetryPolicy, StepDefinition, WorkflowDefinition, render
from .errors import (
    ConditionFailedError,
    ContentionError,
    IdempotencyKeyConflictError,
    InvalidDefinitionError,
    PayloadTooLargeError,
    WorkflowNotFoundError,
)
from .messages import StepError, StepReply, StepRequest, encode, remote_token
from .ports import Counter, Outgoing, StateStore, no_metrics
from .records import Snapshot, StepRecord, WorkflowRecord
from .settings import EngineConfig
from .states import TERMINAL_WORKFLOW, UNWINDING_WORKFLOW, Outcome, Phase, StepStatus, WorkflowStatus

logger = logging.getLogger("sasflow.scheduler")

_WORKFLOW_ID_NAMESPACE = uuid.UUID("0d4f7a3e-8a54-4a43-b1c6-7e4fd1b3c2aa")
#: Reads (and conditional writes) one call makes before it gives up on a workflow that keeps changing under it.
MAX_ATTEMPTS = 6
#: After a lost write, wait a random time in [0, min(cap, base * 2**losses)] before reading again (seconds; full
#: jitter, AWS Architecture Blog "Exponential Backoff and Jitter"), so racing writers do not stay in lockstep.
CONFLICT_BACKOFF_BASE_SECONDS = 0.01
CONFLICT_BACKOFF_CAP_SECONDS = 0.2
_MAX_SQS_DELAY = 900


@dataclass(frozen=True)
class StartResult:
    """What ``start_workflow`` did: the workflow as stored, whether this call created it, and the messages to send."""

    snapshot: Snapshot
    created: bool
    messages: list[Outgoing] = field(default_factory=list)

    @property
    def workflow(self) -> WorkflowRecord:
        """The workflow record (shortcut for ``snapshot.workflow``)."""
        return self.snapshot.workflow


def workflow_id_for(idempotency_key: str | None) -> str:
    """Return the workflow id for a start request.

    With an Idempotency-Key the id is derived from it (UUID v5), so a repeated start finds the same workflow with one
    conditional write and no extra item; without one it is a random UUID v4.
    """
    if idempotency_key:
        return str(uuid.uuid5(_WORKFLOW_ID_NAMESPACE, idempotency_key))
    return str(uuid.uuid4())


def backoff_seconds(policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """Delay before try ``attempt + 1`` after ``attempt`` failed (seconds).

    Exponential backoff ``base * 2**(attempt-1)`` capped at ``cap``, with full jitter (uniform in [0, delay]) when
    the policy asks for it (AWS Architecture Blog, "Exponential Backoff and Jitter").
    """
    delay = min(policy.backoff_cap_seconds, policy.backoff_base_seconds * (2 ** max(0, attempt - 1)))
    return rng.uniform(0, delay) if policy.jitter else delay


class SchedulerService:
    """Owns the workflow and step state machine.

    Parameters
    ----------
    store:
        The state store port.
    clock:
        Injected time (DESIGN Rule 7).
    config:
        Engine settings (agents' queues, deadline grace, retention).
    rng:
        Random source for backoff jitter (seeded in simulations).
    metrics:
        Counter for metrics such as ``WorkflowsCompensationFailed``.
    """

    def __init__(
        self,
        store: StateStore,
        clock: Clock,
        config: EngineConfig,
        *,
        rng: random.Random | None = None,
        metrics: Counter = no_metrics,
    ) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.rng = rng or random.Random()
        self.metrics = metrics

    # ------------------------------------------------------------------ start
    def start_workflow(
        self,
        definition: WorkflowDefinition,
        workflow_input: dict[str, Any],
        *,
        request_hash: str,
        idempotency_key: str | None = None,
    ) -> StartResult:
        """Record a new workflow and dispatch its first steps.

        The workflow and its first steps, PROCESSING with attempt 1 and their complete-by, are written with one
        conditional write before any message is sent (write-ahead). A repeated start with the same
        Idempotency-Key returns the existing workflow and writes nothing.

        Returns
        -------
        StartResult
            ``created`` is False for a repeat; ``messages`` must be sent by the caller.

        Raises
        ------
        InvalidDefinitionError
            When a step names an agent that has no queue.
        IdempotencyKeyConflictError
            When the key was used with a different request body.
        PayloadTooLargeError
            When a request message or the record would exceed its AWS limit (nothing is written).
        """
        unknown = sorted({s.agent for s in definition.steps} - set(self.config.agent_queue_urls))
        if unknown:
            raise InvalidDefinitionError(
                f"unknown agent(s) {unknown}; known agents: {sorted(self.config.agent_queue_urls)}"
            )
        now = epoch_seconds(self.clock)
        workflow = WorkflowRecord(
            workflow_id=workflow_id_for(idempotency_key),
            status=WorkflowStatus.RUNNING,
            definition=definition,
            input=workflow_input,
            request_hash=request_hash,
            created_at=now,
            updated_at=now,
            idempotency_key=idempotency_key,
        )
        transition = _Transition(self, Snapshot(workflow), now)
        transition.advance()
        try:
            stored = self.store.create(transition.snapshot)
        except ConditionFailedError:
            existing = self.store.load(workflow.workflow_id)
            if existing is None:  # pragma: no cover - the condition failed, so it exists (TTL aside)
                raise
            if existing.workflow.request_hash != request_hash:
                raise IdempotencyKeyConflictError(
                    "Idempotency-Key was already used with a different request body"
                ) from None
            return StartResult(existing, created=False)
        self.metrics("WorkflowsStarted")
        transition.emit_metrics()
        return StartResult(stored, created=True, messages=transition.messages)

    # ------------------------------------------------------------------ replies
    def on_reply(self, reply: StepReply) -> list[Outgoing]:
        """Apply an agent's reply and return the messages to send next.

        A reply is applied only when it answers the step's current attempt of the current phase (DESIGN Rule 5);
        a duplicate, late or redriven reply is acknowledged and changes nothing.

        Raises
        ------
        ContentionError
            When the workflow kept changing under this call (the record then fails and SQS delivers it again).
        """
        return self.on_replies([reply])

    def on_replies(self, replies: Sequence[StepReply]) -> list[Outgoing]:
        """Apply several replies of **one** workflow together: one read and one write, whatever their number.

        The replies of parallel steps often arrive in one batch; applied one by one, each would read and write the
        workflow's item, and concurrent batches would keep making each other's writes lose. Each reply is applied
        as ``on_reply`` would, in order.

        Raises
        ------
        ValueError
            When the replies are not all of one workflow.
        ContentionError
            When the workflow kept changing under this call.
        """
        workflow_ids = {reply.workflow_id for reply in replies}
        if len(workflow_ids) != 1:
            raise ValueError(f"on_replies takes the replies of one workflow, not {sorted(workflow_ids)}")

        def apply_all(transition: _Transition) -> None:
            for reply in replies:
                transition.apply_reply(reply)

        stored, messages = self._update(replies[0].workflow_id, apply_all)
        if stored is None:
            logger.warning("reply for unknown workflow", extra={"workflow_id": replies[0].workflow_id})
        return messages

    # ------------------------------------------------------------------ timeouts (called by the supervisor)
    def on_overdue(self, workflow_id: str) -> list[Outgoing]:
        """Handle a workflow found overdue in the deadline index: resend its overdue steps, or give up and unwind.

        Each in-flight step with ``now > complete_by + grace`` is resent as its next attempt while attempts remain,
        otherwise it fails (its outcome unknown) and the workflow unwinds. The write is conditional on the version
        read, so two supervisors resend a step once. A workflow with nothing in flight is advanced (safety net).

        Raises
        ------
        ContentionError
            When the workflow kept changing under this call (the next sweep takes it again).
        """
        stored, messages = self._update(workflow_id, lambda transition: transition.handle_overdue())
        if stored is None:
            logger.info("overdue entry of a workflow that is gone", extra={"workflow_id": workflow_id})
        return messages

    # ------------------------------------------------------------------ cancel
    def cancel(self, workflow_id: str) -> tuple[Snapshot, list[Outgoing]]:
        """Ask a running workflow to stop: it becomes CANCELLING and compensates what may have happened.

        Returns
        -------
        tuple[Snapshot, list[Outgoing]]
            The workflow as stored after the cancel, and the messages to send.

        Raises
        ------
        WorkflowNotFoundError
            When there is no such workflow.
        ConditionFailedError
            When the workflow is no longer RUNNING (the caller maps this to 409).
        """
        stored, messages = self._update(workflow_id, lambda transition: transition.cancel())
        if stored is None:
            raise WorkflowNotFoundError(workflow_id)
        return stored, messages

    # ------------------------------------------------------------------ read, decide, write
    def _update(
        self, workflow_id: str, change: Callable[[_Transition], None]
    ) -> tuple[Snapshot | None, list[Outgoing]]:
        """Read the workflow, apply ``change`` to it in memory, and store the result with one conditional write.

        Returns the workflow as stored (None when there is no such workflow) and the messages to send.

        The first read is eventually consistent (half the read units of a strong one). That is safe because the
        write is conditional on the version read: a stale view can only lose its write, never commit. What a stale
        view must not do is acknowledge a message it decided needs nothing (a reply for an attempt it does not show
        yet would look stale and be dropped), so such a decision is confirmed from a strongly consistent read, as
        is every read after a lost write. (A stale view that refuses a change, a cancel of a workflow no longer
        RUNNING, is right: statuses only move forward.)
        """
        consistent = False
        oversized = False
        losses = 0
        for _ in range(MAX_ATTEMPTS):
            base = self.store.load(workflow_id, consistent=consistent)
            if base is None:
                if not consistent:
                    consistent = True
                    continue
                return None, []
            transition = _Transition(self, base, epoch_seconds(self.clock), oversized=oversized)
            change(transition)
            if transition.snapshot is base:
                if not consistent:
                    consistent = True
                    continue
                transition.emit_metrics()  # nothing to write (a stale or repeated message)
                return base, []
            try:
                stored = self.store.save(transition.snapshot, expect=base)
            except ConditionFailedError:
                # Another writer changed the workflow since our read: decide again from its state.
                logger.debug("lost race; reading the workflow again", extra={"workflow_id": workflow_id})
                consistent = True
                losses += 1
                cap = min(CONFLICT_BACKOFF_CAP_SECONDS, CONFLICT_BACKOFF_BASE_SECONDS * 2**losses)
                self.clock.sleep(self.rng.uniform(0, cap))
                continue
            except PayloadTooLargeError:
                if oversized:
                    raise
                # The reply's output does not fit in the workflow's record: decide again with the output refused.
                logger.warning("reply output too large for the workflow's record", extra={"workflow_id": workflow_id})
                oversized = True
                continue
            transition.emit_metrics()
            return stored, transition.messages
        raise ContentionError(workflow_id, MAX_ATTEMPTS)


class _Transition:
    """The transitions one call makes to one workflow, worked out in memory from the snapshot it read.

    ``snapshot`` starts as the snapshot read and is replaced (never mutated) by every change; it stays the very same
    object when nothing changed. ``messages`` and the metrics count only once the caller has stored the result.
    ``oversized`` is set when a first try did not fit in the store's item: a reply's output is then refused (a
    forward step fails with ``OUTPUT_TOO_LARGE``, a compensation keeps no output).
    """

    def __init__(self, service: SchedulerService, base: Snapshot, now: int, *, oversized: bool = False) -> None:
        self.service = service
        self.config = service.config
        self.snapshot = base
        self.now = now
        self.oversized = oversized
        self.messages: list[Outgoing] = []
        self._metrics: list[str] = []

    # ------------------------------------------------------------------ bookkeeping
    def set_step(self, record: StepRecord) -> None:
        self.snapshot = self.snapshot.with_step(record.evolve(updated_at=self.now))
        self._touch()

    def set_status(self, status: WorkflowStatus, *, reason: str | None = None) -> None:
        workflow = self.snapshot.workflow
        changes: dict[str, Any] = {"status": status}
        if reason is not None:
            changes["reason"] = reason
        if status in TERMINAL_WORKFLOW:
            changes["expires_at"] = self.now + self.config.terminal_retention_days * 86_400
        self.snapshot = self.snapshot.with_workflow(workflow.evolve(**changes))
        self._touch()

    def _touch(self) -> None:
        if self.snapshot.workflow.updated_at != self.now:
            self.snapshot = self.snapshot.with_workflow(self.snapshot.workflow.evolve(updated_at=self.now))

    def count(self, metric: str) -> None:
        self._metrics.append(metric)

    def emit_metrics(self) -> None:
        for name in self._metrics:
            self.service.metrics(name)

    @property
    def definition(self) -> WorkflowDefinition:
        return self.snapshot.workflow.definition

    @property
    def workflow_id(self) -> str:
        return self.snapshot.workflow.workflow_id

    # ------------------------------------------------------------------ cancel
    def cancel(self) -> None:
        status = self.snapshot.workflow.status
        if status is not WorkflowStatus.RUNNING:
            raise ConditionFailedError(f"workflow is {status.value}")
        self.set_status(WorkflowStatus.CANCELLING, reason="cancelled by request")
        self.advance()

    # ------------------------------------------------------------------ replies
    def apply_reply(self, reply: StepReply) -> None:
        record = self.snapshot.steps.get(reply.step)
        if record is None:
            logger.warning("reply for a step never dispatched", extra={"workflow_id": reply.workflow_id})
            return
        in_flight_status = StepStatus.COMPENSATING if reply.phase is Phase.COMPENSATION else StepStatus.PROCESSING
        if record.attempt_for(reply.phase) != reply.attempt or (
            reply.phase is Phase.COMPENSATION and record.phase is Phase.ACTION
        ):
            logger.debug("stale reply dropped", extra={"workflow_id": reply.workflow_id, "step": reply.step})
            self.count("StaleReplies")
            return
        if record.status is not in_flight_status:
            # Same attempt, already applied: a redelivery or a duplicate. The write that applied it also advanced
            # the workflow, so this normally finds nothing to do.
            self.advance()
            return
        if reply.phase is Phase.ACTION:
            self._forward_outcome(record, reply)
        else:
            self._compensation_outcome(record, reply)
        self.advance()

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
        if _no_call_made(reply) and running and record.deferrals < self.config.max_deferrals:
            retry_at = max(self.now, reply.retry_at or self.now)
            self._dispatch_forward(
                step,
                record.attempt,
                retry_at,
                base=record.evolve(deferrals=record.deferrals + 1),
                delay=retry_at - self.now,
            )
            return
        retryable = reply.outcome is Outcome.DEFERRED or _retryable(reply)
        if retryable and running and record.attempt < step.retry.max_attempts:
            delay = round(backoff_seconds(step.retry, record.attempt, self.service.rng))
            self._dispatch_forward(step, record.attempt + 1, self.now + delay, base=record, delay=delay)
            return
        self.set_step(_settled(record, StepStatus.FAILED, error=_error(reply), may_have_happened=True))

    def _compensation_outcome(self, record: StepRecord, reply: StepReply) -> None:
        step = self.definition.step(record.step)
        assert step.compensation is not None  # only steps with a compensation are ever COMPENSATING
        policy = step.compensation.retry
        if reply.outcome is Outcome.SUCCEEDED:
            # The compensation happened; its output is informative only, so an oversized one is not kept.
            output = None if self.oversized else reply.output
            self.set_step(_settled(record, StepStatus.COMPENSATED, comp_output=output))
            return
        if _no_call_made(reply) and record.deferrals < self.config.max_deferrals:
            retry_at = max(self.now, reply.retry_at or self.now)
            self._dispatch_compensation(
                record.evolve(deferrals=record.deferrals + 1), record.comp_attempt, retry_at, delay=retry_at - self.now
            )
            return
        # A compensation makes one call per attempt, so every failure that is not a definitive refusal uses one
        # supervised attempt and is retried with backoff while attempts remain (a business refusal cannot improve).
        if reply.outcome is not Outcome.REJECTED and record.comp_attempt < policy.max_attempts:
            delay = round(backoff_seconds(policy, record.comp_attempt, self.service.rng))
            self._dispatch_compensation(record, record.comp_attempt + 1, self.now + delay, delay=delay)
            return
        self.set_step(_settled(record, StepStatus.COMPENSATION_FAILED, error=_error(reply)))

    # ------------------------------------------------------------------ timeouts
    def handle_overdue(self) -> None:
        cutoff = self.now - self.config.deadline_grace_seconds
        overdue = [
            self.snapshot.steps[name]
            for name in self.definition.order
            if name in self.snapshot.steps
            and self.snapshot.steps[name].in_flight
            and (self.snapshot.steps[name].complete_by or 0) < cutoff
        ]
        if not overdue:
            if self.snapshot.workflow.status not in TERMINAL_WORKFLOW and not any(
                r.in_flight for r in self.snapshot.steps.values()
            ):
                # Safety net: nothing in flight, so no reply can move this workflow; advance it.
                self.count("WorkflowsStalled")
                self.advance()
            return  # otherwise the index entry was out of date (it is eventually consistent)
        for record in overdue:
            step = self.definition.step(record.step)
            if record.status is StepStatus.PROCESSING:
                self._forward_timed_out(record, step)
            else:
                self._compensation_timed_out(record, step)
        self.advance()

    def _forward_timed_out(self, record: StepRecord, step: StepDefinition) -> None:
        if self.snapshot.workflow.status is WorkflowStatus.RUNNING and record.attempt < step.retry.max_attempts:
            self._dispatch_forward(step, record.attempt + 1, self.now, base=record.evolve(resends=record.resends + 1))
            self.count("SupervisorResends")
            return
        error = {"code": "TIMED_OUT", "message": f"no reply by complete-by after attempt {record.attempt}"}
        self.set_step(_settled(record, StepStatus.FAILED, error=error, may_have_happened=True))
        self.count("StepsTimedOut")
        if self.snapshot.workflow.status is WorkflowStatus.RUNNING:
            self.set_status(
                WorkflowStatus.COMPENSATING, reason=f"step {step.name} timed out after {record.attempt} attempt(s)"
            )

    def _compensation_timed_out(self, record: StepRecord, step: StepDefinition) -> None:
        assert step.compensation is not None
        if record.comp_attempt < step.compensation.retry.max_attempts:
            self._dispatch_compensation(record.evolve(resends=record.resends + 1), record.comp_attempt + 1, self.now)
            self.count("SupervisorResends")
            return
        error = {"code": "TIMED_OUT", "message": f"no reply to compensation attempt {record.comp_attempt}"}
        self.set_step(_settled(record, StepStatus.COMPENSATION_FAILED, error=error))

    # ------------------------------------------------------------------ advance
    def advance(self) -> None:
        """Make every transition the snapshot allows: dispatch ready steps, finish the workflow, or unwind it."""
        workflow = self.snapshot.workflow
        if workflow.status is WorkflowStatus.RUNNING:
            failed = [r for r in self.snapshot.steps.values() if r.status is StepStatus.FAILED]
            if failed:
                first = next(self.snapshot.steps[n] for n in self.definition.order if n in {r.step for r in failed})
                self.set_status(
                    WorkflowStatus.COMPENSATING,
                    reason=f"step {first.step} failed: {(first.error or {}).get('code', 'FAILED')}",
                )
                self._unwind()
                return
            if all(self.snapshot.status_of(name) is StepStatus.COMPLETED for name in self.definition.order):
                self._finish(WorkflowStatus.COMPLETED)
                return
            self._dispatch_ready()
        elif workflow.status in UNWINDING_WORKFLOW:
            self._unwind()

    def _dispatch_ready(self) -> None:
        dependencies = self.definition.dependencies
        for name in self.definition.order:
            if name in self.snapshot.steps:
                continue
            if all(self.snapshot.status_of(p) is StepStatus.COMPLETED for p in dependencies[name]):
                self._dispatch_forward(self.definition.step(name), 1, self.now)

    def _unwind(self) -> None:
        """Compensate, in reverse dependency order, every step whose action may have happened (DESIGN Rule 6)."""
        definition = self.definition
        # 1. Seal never-dispatched steps: none of them may start once unwinding has begun.
        for name in reversed(definition.order):
            if name not in self.snapshot.steps:
                self.set_step(StepRecord(step=name, status=StepStatus.SKIPPED))
        steps = self.snapshot.steps
        # 2. Wait while a forward action is in flight: its reply or its timeout decides whether it happened.
        if any(r.status is StepStatus.PROCESSING for r in steps.values()):
            return
        compensating = any(r.status is StepStatus.COMPENSATING for r in steps.values())
        if any(r.status is StepStatus.COMPENSATION_FAILED for r in steps.values()):
            if not compensating:
                self._finish(WorkflowStatus.COMPENSATION_FAILED)
            return

        def needs(name: str) -> bool:
            record = steps[name]
            has_compensation = definition.step(name).compensation is not None
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
        descendants = definition.descendants
        for name in pending:
            if all(settled(d) for d in descendants[name]):
                self._dispatch_compensation(steps[name], 1, self.now)
                self.count("CompensationsStarted")

    def _finish(self, status: WorkflowStatus) -> None:
        self.set_status(status)
        # WorkflowsCompleted, WorkflowsCompensated, WorkflowsCancelled, WorkflowsCompensationFailed (alarmed)
        self.count("Workflows" + status.value.title().replace("_", ""))

    # ------------------------------------------------------------------ dispatch
    def _dispatch_forward(
        self, step: StepDefinition, attempt: int, start_at: int, *, base: StepRecord | None = None, delay: int = 0
    ) -> None:
        complete_by = start_at + step.timeout_seconds
        record = (base or StepRecord(step=step.name, status=StepStatus.PENDING)).evolve(
            status=StepStatus.PROCESSING, attempt=attempt, complete_by=complete_by
        )
        request = StepRequest(
            workflow_id=self.workflow_id,
            step=step.name,
            phase=Phase.ACTION,
            agent=step.agent,
            action=step.action,
            attempt=attempt,
            complete_by=complete_by,
            token=remote_token(self.workflow_id, step.name, step.action),
            input=self.snapshot.input_of(step.name),
            backoff_base_seconds=step.retry.backoff_base_seconds,
            backoff_cap_seconds=step.retry.backoff_cap_seconds,
            jitter=step.retry.jitter,
            max_calls=step.retry.max_attempts,
        )
        self.set_step(record)
        self.messages.append(self._outgoing(step.agent, request, delay))

    def _dispatch_compensation(self, record: StepRecord, comp_attempt: int, start_at: int, *, delay: int = 0) -> None:
        step = self.definition.step(record.step)
        compensation = step.compensation
        assert compensation is not None
        complete_by = start_at + compensation.timeout_seconds
        context = self.snapshot.context()
        context["step"] = {"input": self.snapshot.input_of(step.name), "output": record.output}
        request = StepRequest(
            workflow_id=self.workflow_id,
            step=step.name,
            phase=Phase.COMPENSATION,
            agent=step.agent,
            action=compensation.action,
            attempt=comp_attempt,
            complete_by=complete_by,
            token=remote_token(self.workflow_id, step.name, compensation.action),
            original_token=remote_token(self.workflow_id, step.name, step.action),
            input=render(compensation.input, context),
            backoff_base_seconds=compensation.retry.backoff_base_seconds,
            backoff_cap_seconds=compensation.retry.backoff_cap_seconds,
            jitter=compensation.retry.jitter,
            # One call per compensation attempt: retries are new supervised attempts, delayed by the backoff.
            max_calls=1,
        )
        self.set_step(record.evolve(status=StepStatus.COMPENSATING, comp_attempt=comp_attempt, complete_by=complete_by))
        self.messages.append(self._outgoing(step.agent, request, delay))

    def _outgoing(self, agent: str, request: StepRequest, delay: int) -> Outgoing:
        try:
            queue_url = self.config.agent_queue_urls[agent]
        except KeyError:
            raise InvalidDefinitionError(f"unknown agent {agent!r}") from None
        return Outgoing(queue_url=queue_url, body=encode(request), delay_seconds=max(0, min(_MAX_SQS_DELAY, delay)))


def _settled(
    record: StepRecord,
    status: StepStatus,
    *,
    output: Any = None,
    error: dict[str, Any] | None = None,
    may_have_happened: bool | None = None,
    comp_output: Any = None,
) -> StepRecord:
    changes: dict[str, Any] = {"status": status, "complete_by": None}
    if status is StepStatus.COMPLETED:
        changes.update(output=output, error=None)
    elif status is StepStatus.COMPENSATED:
        changes.update(comp_output=comp_output)
    else:
        changes.update(error=error)
    if may_have_happened is not None:
        changes.update(may_have_happened=may_have_happened)
    return record.evolve(**changes)


def _output_too_large() -> dict[str, Any]:
    return StepError(
        code="OUTPUT_TOO_LARGE",
        message="the step's output does not fit in the workflow's record (DynamoDB items hold at most 400 KB: pass "
        "large data by reference)",
    ).model_dump()


def _error(reply: StepReply) -> dict[str, Any]:
    if reply.error is not None:
        return reply.error.model_dump()
    return StepError(code=reply.outcome.value.upper(), message="no detail").model_dump()


def _no_call_made(reply: StepReply) -> bool:
    """An attempt that never reached the service (open circuit, or no time left on arrival) is not used up."""
    return reply.outcome is Outcome.DEFERRED or (_retryable(reply) and reply.calls == 0)


def _retryable(reply: StepReply) -> bool:
    return reply.outcome is Outcome.FAILED and reply.retryable
