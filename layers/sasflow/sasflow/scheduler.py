"""The scheduler: every workflow and step transition happens here.

The API (start), the scheduler Lambda (agents' replies) and the supervisor (overdue steps) all call this service;
it decides from a consistent snapshot and writes with conditional writes only (DESIGN Rule 2). It returns the
messages to send instead of sending them, so that callers send after the state that expects them is durable
(Rule 1, write-ahead) and can batch the sends.

Redelivery is the redo log: a reply whose transition is already stored is re-run through ``advance``, which
finishes whatever its first delivery left undone (a crash between two writes). ``advance`` is idempotent: every
write it makes is conditioned on the state it read.
"""

from __future__ import annotations

import logging
import random
import uuid
import zlib
from dataclasses import dataclass, field, replace
from typing import Any

from .clock import Clock, epoch_seconds
from .definition import RetryPolicy, StepDefinition, WorkflowDefinition, render
from .errors import (
    ConditionFailedError,
    IdempotencyKeyConflictError,
    InvalidDefinitionError,
    SasflowError,
    WorkflowNotFoundError,
)
from .messages import StepError, StepReply, StepRequest, encode, remote_token
from .ports import Counter, Outgoing, StateStore, no_metrics
from .records import Snapshot, StepRecord, WorkflowRecord
from .settings import EngineConfig
from .states import TERMINAL_WORKFLOW, UNWINDING_WORKFLOW, Outcome, Phase, StepStatus, WorkflowStatus

logger = logging.getLogger("sasflow.scheduler")

_WORKFLOW_ID_NAMESPACE = uuid.UUID("0d4f7a3e-8a54-4a43-b1c6-7e4fd1b3c2aa")
_MAX_RELOADS = 5
_MAX_SQS_DELAY = 900


@dataclass(frozen=True)
class StartResult:
    """What ``start_workflow`` did: the workflow, whether this call created it, and the messages to send.

    ``steps`` holds the step records this call wrote (empty for a repeat), so a caller can show the new workflow
    without reading back what it just wrote.
    """

    workflow: WorkflowRecord
    created: bool
    messages: list[Outgoing] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)


def workflow_id_for(idempotency_key: str | None) -> str:
    """Return the workflow id for a start request.

    With an Idempotency-Key the id is derived from it (UUID v5), so a repeated start finds the same workflow with one
    conditional write and no extra item; without one it is a random UUID v4.
    """
    if idempotency_key:
        return str(uuid.uuid5(_WORKFLOW_ID_NAMESPACE, idempotency_key))
    return str(uuid.uuid4())


def deadline_shard(workflow_id: str, step: str | None, shards: int) -> str:
    """Return the deadline-index partition of a step (or of the workflow when ``step`` is None).

    A stable hash spreads in-flight items over ``shards`` partitions so no partition is hot (DESIGN Rule 3).
    """
    key = f"{workflow_id}/{step or ''}".encode()
    return f"{zlib.crc32(key) % shards:02d}"


def backoff_seconds(policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """Delay before try ``attempt + 1`` after ``attempt`` failed (seconds).

    Exponential backoff ``base * 2**(attempt-1)`` capped at ``cap``, with full jitter (uniform in [0, delay]) when
    the policy asks for it (AWS Architecture Blog, "Exponential Backoff and Jitter").
    """
    delay = min(policy.backoff_cap_seconds, policy.backoff_base_seconds * (2 ** max(0, attempt - 1)))
    return rng.uniform(0, delay) if policy.jitter else delay


def stall_budget(definition: WorkflowDefinition, grace: int) -> int:
    """Seconds after which a non-terminal workflow is re-examined by the supervisor (a safety net).

    It is the sum of every step's and compensation's ``timeout * max_attempts`` plus the grace: a healthy workflow
    finishes well within it, so the check costs nothing on the happy path.
    """
    total = grace
    for step in definition.steps:
        total += step.timeout_seconds * step.retry.max_attempts
        if step.compensation is not None:
            total += step.compensation.timeout_seconds * step.compensation.retry.max_attempts
    return total


class SchedulerService:
    """Owns the workflow and step state machine.

    Parameters
    ----------
    store:
        The state store port.
    clock:
        Injected time (DESIGN Rule 7).
    config:
        Engine settings (agents' queues, deadline index, grace).
    rng:
        Random source for backoff jitter (seeded in simulations).
    metrics:
        Counter for metrics such as ``WorkflowCompensationFailed``.
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

        The workflow item and the first steps' PROCESSING items are written in one transaction before any message
        is sent (write-ahead). A repeated start with the same Idempotency-Key returns the existing workflow.

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
            When a request message or an item would exceed its AWS limit (nothing is written).
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
        snapshot = Snapshot(workflow, {})
        records: list[StepRecord] = []
        messages: list[Outgoing] = []
        context = self._context(snapshot)
        for name in definition.order:
            if definition.dependencies[name]:
                continue
            record, message = self._dispatch_forward(snapshot, definition.step(name), 1, now, context=context)
            records.append(record)
            messages.append(message)
        try:
            self.store.create_workflow(
                workflow,
                records,
                stall_at=now + stall_budget(definition, self.config.deadline_grace_seconds),
                shard=deadline_shard(workflow.workflow_id, None, self.config.deadline_shards),
            )
        except ConditionFailedError:
            existing = self.store.get_workflow(workflow.workflow_id)
            if existing is None:  # pragma: no cover - the condition failed, so it exists (TTL aside)
                raise
            if existing.request_hash != request_hash:
                raise IdempotencyKeyConflictError(
                    "Idempotency-Key was already used with a different request body"
                ) from None
            return StartResult(existing, created=False)
        self.metrics("WorkflowsStarted")
        return StartResult(workflow, created=True, messages=messages, steps=records)

    # ------------------------------------------------------------------ replies
    def on_reply(self, reply: StepReply) -> list[Outgoing]:
        """Apply an agent's reply and return the messages to send next.

        A reply is applied only when it answers the step's current attempt of the current phase (DESIGN Rule 5).
        A redelivered reply whose transition is already stored re-runs ``advance`` (finishing a crashed delivery);
        any other reply is stale, acknowledged and without effect.
        """
        snapshot = self.store.load(reply.workflow_id)
        if snapshot is None:
            logger.warning("reply for unknown workflow", extra={"workflow_id": reply.workflow_id})
            return []
        record = snapshot.steps.get(reply.step)
        if record is None:
            logger.warning("reply for a step never dispatched", extra={"workflow_id": reply.workflow_id})
            return []
        in_flight_status = StepStatus.COMPENSATING if reply.phase is Phase.COMPENSATION else StepStatus.PROCESSING
        if record.attempt_for(reply.phase) != reply.attempt or (
            reply.phase is Phase.COMPENSATION and record.phase is Phase.ACTION
        ):
            logger.debug("stale reply dropped", extra={"workflow_id": reply.workflow_id, "step": reply.step})
            self.metrics("StaleReplies")
            return []
        if record.status is not in_flight_status:
            # Same attempt, already applied: a redelivery. Finish what the first delivery may have left undone.
            return self.advance(snapshot)
        now = epoch_seconds(self.clock)
        if reply.phase is Phase.ACTION:
            updated, messages = self._forward_outcome(snapshot, record, reply, now)
        else:
            updated, messages = self._compensation_outcome(snapshot, record, reply, now)
        try:
            self.store.put_step(updated, expect=record)
        except ConditionFailedError:
            logger.debug("lost race applying reply", extra={"workflow_id": reply.workflow_id, "step": reply.step})
            return []
        return messages + self._advance_after_write(snapshot, updated)

    def _forward_outcome(
        self, snapshot: Snapshot, record: StepRecord, reply: StepReply, now: int
    ) -> tuple[StepRecord, list[Outgoing]]:
        step = snapshot.workflow.definition.step(record.step)
        running = snapshot.workflow.status is WorkflowStatus.RUNNING
        if reply.outcome is Outcome.SUCCEEDED:
            return self._settled(record, StepStatus.COMPLETED, now, output=reply.output), []
        if reply.outcome is Outcome.REJECTED:
            return self._settled(record, StepStatus.FAILED, now, error=_error(reply), may_have_happened=False), []
        if _no_call_made(reply) and running and record.deferrals < self.config.max_deferrals:
            retry_at = max(now, reply.retry_at or now)
            updated, message = self._dispatch_forward(
                snapshot, step, record.attempt, retry_at, base=record, delay=retry_at - now
            )
            return updated.evolve(deferrals=record.deferrals + 1), [message]
        retryable = reply.outcome is Outcome.DEFERRED or _retryable(reply)
        if retryable and running and record.attempt < step.retry.max_attempts:
            delay = round(backoff_seconds(step.retry, record.attempt, self.rng))
            updated, message = self._dispatch_forward(
                snapshot, step, record.attempt + 1, now + delay, base=record, delay=delay
            )
            return updated, [message]
        return self._settled(record, StepStatus.FAILED, now, error=_error(reply), may_have_happened=True), []

    def _compensation_outcome(
        self, snapshot: Snapshot, record: StepRecord, reply: StepReply, now: int
    ) -> tuple[StepRecord, list[Outgoing]]:
        step = snapshot.workflow.definition.step(record.step)
        assert step.compensation is not None  # only steps with a compensation are ever COMPENSATING
        policy = step.compensation.retry
        if reply.outcome is Outcome.SUCCEEDED:
            return self._settled(record, StepStatus.COMPENSATED, now, comp_output=reply.output), []
        if _no_call_made(reply) and record.deferrals < self.config.max_deferrals:
            retry_at = max(now, reply.retry_at or now)
            updated, message = self._dispatch_compensation(
                snapshot, record, record.comp_attempt, retry_at, delay=retry_at - now
            )
            return updated.evolve(deferrals=record.deferrals + 1), [message]
        # A compensation makes one call per attempt, so every failure that is not a definitive refusal uses one
        # supervised attempt and is retried with backoff while attempts remain (a business refusal cannot improve).
        if reply.outcome is not Outcome.REJECTED and record.comp_attempt < policy.max_attempts:
            delay = round(backoff_seconds(policy, record.comp_attempt, self.rng))
            updated, message = self._dispatch_compensation(
                snapshot, record, record.comp_attempt + 1, now + delay, delay=delay
            )
            return updated, [message]
        return self._settled(record, StepStatus.COMPENSATION_FAILED, now, error=_error(reply)), []

    # ------------------------------------------------------------------ timeouts (called by the supervisor)
    def on_step_overdue(self, workflow_id: str, step: str) -> list[Outgoing]:
        """Handle a step found overdue in the deadline index: resend it, or give up and unwind.

        The step is re-read with a consistent read and must still be in flight with ``now > complete_by + grace``;
        the resend is a conditional write on status, attempt and complete-by, so two supervisors resend once.
        """
        snapshot = self.store.load(workflow_id)
        if snapshot is None:
            return []
        record = snapshot.steps.get(step)
        now = epoch_seconds(self.clock)
        if record is None or not record.in_flight or record.complete_by is None:
            return []
        if not now > record.complete_by + self.config.deadline_grace_seconds:
            return []
        definition = snapshot.workflow.definition.step(step)
        if record.status is StepStatus.PROCESSING:
            return self._forward_timed_out(snapshot, record, definition, now)
        return self._compensation_timed_out(snapshot, record, definition, now)

    def _forward_timed_out(
        self, snapshot: Snapshot, record: StepRecord, step: StepDefinition, now: int
    ) -> list[Outgoing]:
        workflow = snapshot.workflow
        if workflow.status is WorkflowStatus.RUNNING and record.attempt < step.retry.max_attempts:
            updated, message = self._dispatch_forward(snapshot, step, record.attempt + 1, now, base=record)
            updated = updated.evolve(resends=record.resends + 1)
            try:
                self.store.put_step(updated, expect=record)
            except ConditionFailedError:
                logger.debug("lost race resending", extra={"workflow_id": workflow.workflow_id, "step": step.name})
                return []
            self.metrics("SupervisorResends")
            return [message]
        # Give up. Unwind the workflow first: if we crash before the step write, the step stays overdue and the
        # next sweep finishes the job; the other order could strand a FAILED step in a RUNNING workflow.
        if workflow.status is WorkflowStatus.RUNNING:
            reason = f"step {step.name} timed out after {record.attempt} attempt(s)"
            try:
                self.store.set_workflow_status(
                    workflow.workflow_id, WorkflowStatus.RUNNING, WorkflowStatus.COMPENSATING, now=now, reason=reason
                )
            except ConditionFailedError:
                return self._reload_and_advance(workflow.workflow_id)
            snapshot = snapshot.with_workflow(_evolve_workflow(workflow, WorkflowStatus.COMPENSATING, now, reason))
        error = {"code": "TIMED_OUT", "message": f"no reply by complete-by after attempt {record.attempt}"}
        failed = self._settled(record, StepStatus.FAILED, now, error=error, may_have_happened=True)
        try:
            self.store.put_step(failed, expect=record)
        except ConditionFailedError:
            return self._reload_and_advance(workflow.workflow_id)
        self.metrics("StepsTimedOut")
        return self._advance_after_write(snapshot, failed)

    def _compensation_timed_out(
        self, snapshot: Snapshot, record: StepRecord, step: StepDefinition, now: int
    ) -> list[Outgoing]:
        assert step.compensation is not None
        if record.comp_attempt < step.compensation.retry.max_attempts:
            updated, message = self._dispatch_compensation(snapshot, record, record.comp_attempt + 1, now)
            updated = updated.evolve(resends=record.resends + 1)
            try:
                self.store.put_step(updated, expect=record)
            except ConditionFailedError:
                return []
            self.metrics("SupervisorResends")
            return [message]
        error = {"code": "TIMED_OUT", "message": f"no reply to compensation attempt {record.comp_attempt}"}
        failed = self._settled(record, StepStatus.COMPENSATION_FAILED, now, error=error)
        try:
            self.store.put_step(failed, expect=record)
        except ConditionFailedError:
            return self._reload_and_advance(snapshot.workflow.workflow_id)
        return self._advance_after_write(snapshot, failed)

    def on_workflow_stalled(self, workflow_id: str) -> list[Outgoing]:
        """Safety net for a non-terminal workflow past its stall deadline: advance it, then re-arm the deadline.

        This repairs a workflow whose progress was lost between two writes when no redelivery can repair it (for
        example its reply went to the dead-letter queue).
        """
        snapshot = self.store.load(workflow_id)
        if snapshot is None or snapshot.workflow.status in TERMINAL_WORKFLOW:
            return []
        messages = self.advance(snapshot)
        fresh = self.store.get_workflow(workflow_id)
        if fresh is not None and fresh.status not in TERMINAL_WORKFLOW:
            now = epoch_seconds(self.clock)
            stall_at = now + stall_budget(fresh.definition, self.config.deadline_grace_seconds)
            try:
                if fresh.stall_at is not None:
                    self.store.push_stall_deadline(workflow_id, expect_stall_at=fresh.stall_at, stall_at=stall_at)
            except ConditionFailedError:
                logger.debug("stall deadline moved by someone else", extra={"workflow_id": workflow_id})
        self.metrics("WorkflowsStalled")
        return messages

    # ------------------------------------------------------------------ cancel
    def cancel(self, workflow_id: str) -> tuple[WorkflowRecord, list[Outgoing]]:
        """Ask a running workflow to stop: it becomes CANCELLING and compensates what may have happened.

        Raises
        ------
        WorkflowNotFoundError
            When there is no such workflow.
        ConditionFailedError
            When the workflow is no longer RUNNING (the caller maps this to 409).
        """
        snapshot = self.store.load(workflow_id)
        if snapshot is None:
            raise WorkflowNotFoundError(workflow_id)
        workflow = snapshot.workflow
        if workflow.status is not WorkflowStatus.RUNNING:
            raise ConditionFailedError(f"workflow is {workflow.status.value}")
        now = epoch_seconds(self.clock)
        self.store.set_workflow_status(
            workflow_id, WorkflowStatus.RUNNING, WorkflowStatus.CANCELLING, now=now, reason="cancelled by request"
        )
        cancelled = _evolve_workflow(workflow, WorkflowStatus.CANCELLING, now, "cancelled by request")
        return cancelled, self.advance(snapshot.with_workflow(cancelled))

    # ------------------------------------------------------------------ advance
    def advance(self, snapshot: Snapshot) -> list[Outgoing]:
        """Make every step the snapshot allows: dispatch ready steps, finish the workflow, or unwind it.

        Idempotent: each write is conditioned on what the snapshot shows, so running it twice (a redelivery, two
        callers) changes nothing the second time. On a lost race it reloads, at most a few times.
        """
        messages: list[Outgoing] = []
        for _ in range(_MAX_RELOADS):
            try:
                messages += self._advance_once(snapshot)
                return messages
            except _Reload:
                fresh = self.store.load(snapshot.workflow.workflow_id)
                if fresh is None:
                    return messages
                snapshot = fresh
        logger.info("advance gave way to concurrent progress", extra={"workflow_id": snapshot.workflow.workflow_id})
        return messages

    def _advance_after_write(self, snapshot: Snapshot, written: StepRecord) -> list[Outgoing]:
        """Advance after writing one step, from a view that includes every concurrent sibling's write.

        Each writer conditions only its own step. When another step was in flight in our snapshot (parallel
        branches), its outcome may have been written concurrently by a writer whose own snapshot still showed ours
        in flight; if both advanced from their stale views, neither would start the join step or finish the
        workflow. Re-reading after our write fixes that: of two concurrent writers, the one that reads last sees
        both writes. A chain has no other step in flight, so it pays no extra read.
        """
        others_in_flight = any(r.in_flight for name, r in snapshot.steps.items() if name != written.step)
        if others_in_flight:
            return self._reload_and_advance(snapshot.workflow.workflow_id)
        return self.advance(snapshot.with_step(written))

    def _reload_and_advance(self, workflow_id: str) -> list[Outgoing]:
        fresh = self.store.load(workflow_id)
        return self.advance(fresh) if fresh is not None else []

    def _advance_once(self, snapshot: Snapshot) -> list[Outgoing]:
        workflow = snapshot.workflow
        if workflow.status in TERMINAL_WORKFLOW:
            return []
        now = epoch_seconds(self.clock)
        definition = workflow.definition
        if workflow.status is WorkflowStatus.RUNNING:
            failed = [r for r in snapshot.steps.values() if r.status is StepStatus.FAILED]
            if failed:
                first = failed[0]
                reason = f"step {first.step} failed: {(first.error or {}).get('code', 'FAILED')}"
                self._set_status(workflow, WorkflowStatus.COMPENSATING, now, reason=reason)
                snapshot = snapshot.with_workflow(_evolve_workflow(workflow, WorkflowStatus.COMPENSATING, now, reason))
                return self._unwind(snapshot, now)
            if all(snapshot.status_of(name) is StepStatus.COMPLETED for name in definition.order):
                self._finish(workflow, WorkflowStatus.COMPLETED, now)
                return []
            return self._dispatch_ready(snapshot, now)
        if workflow.status in UNWINDING_WORKFLOW:
            return self._unwind(snapshot, now)
        return []  # pragma: no cover - every status is handled above

    def _dispatch_ready(self, snapshot: Snapshot, now: int) -> list[Outgoing]:
        definition = snapshot.workflow.definition
        messages: list[Outgoing] = []
        context: dict[str, Any] | None = None
        for name in definition.order:
            if name in snapshot.steps:
                continue
            if not all(snapshot.status_of(p) is StepStatus.COMPLETED for p in definition.dependencies[name]):
                continue
            context = context or self._context(snapshot)
            record, message = self._dispatch_forward(snapshot, definition.step(name), 1, now, context=context)
            try:
                self.store.put_step(record, expect=None)
            except ConditionFailedError:
                logger.debug("step already dispatched or sealed", extra={"step": name})
                continue
            messages.append(message)
        return messages

    def _unwind(self, snapshot: Snapshot, now: int) -> list[Outgoing]:
        """Compensate, in reverse dependency order, every step whose action may have happened (DESIGN Rule 6)."""
        workflow = snapshot.workflow
        definition = workflow.definition
        # 1. Seal never-dispatched steps, last first, so that no step can start once unwinding has begun.
        for name in reversed(definition.order):
            if name in snapshot.steps:
                continue
            sealed = StepRecord(
                workflow_id=workflow.workflow_id,
                step=name,
                agent=definition.step(name).agent,
                status=StepStatus.SKIPPED,
                updated_at=now,
            )
            try:
                self.store.put_step(sealed, expect=None)
            except ConditionFailedError:
                raise _Reload() from None
            snapshot = snapshot.with_step(sealed)
        steps = snapshot.steps
        # 2. Wait while a forward action is in flight: its reply or its timeout decides whether it happened.
        if any(r.status is StepStatus.PROCESSING for r in steps.values()):
            return []
        compensating = any(r.status is StepStatus.COMPENSATING for r in steps.values())
        if any(r.status is StepStatus.COMPENSATION_FAILED for r in steps.values()):
            if not compensating:
                self._finish(workflow, WorkflowStatus.COMPENSATION_FAILED, now)
            return []

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
            final = (
                WorkflowStatus.CANCELLED if workflow.status is WorkflowStatus.CANCELLING else WorkflowStatus.COMPENSATED
            )
            self._finish(workflow, final, now)
            return []
        descendants = definition.descendants
        messages: list[Outgoing] = []
        for name in pending:
            if not all(settled(d) for d in descendants[name]):
                continue
            record = steps[name]
            updated, message = self._dispatch_compensation(snapshot, record, 1, now)
            try:
                self.store.put_step(updated, expect=record)
            except ConditionFailedError:
                raise _Reload() from None
            self.metrics("CompensationsStarted")
            messages.append(message)
        return messages

    # ------------------------------------------------------------------ building blocks
    def _dispatch_forward(
        self,
        snapshot: Snapshot,
        step: StepDefinition,
        attempt: int,
        start_at: int,
        *,
        base: StepRecord | None = None,
        context: dict[str, Any] | None = None,
        delay: int = 0,
    ) -> tuple[StepRecord, Outgoing]:
        workflow_id = snapshot.workflow.workflow_id
        if base is None:
            rendered = render(step.input, context if context is not None else self._context(snapshot))
            base = StepRecord(workflow_id=workflow_id, step=step.name, agent=step.agent, status=StepStatus.PENDING)
        else:
            rendered = base.input
        complete_by = start_at + step.timeout_seconds
        record = base.evolve(
            status=StepStatus.PROCESSING,
            attempt=attempt,
            complete_by=complete_by,
            dl_shard=deadline_shard(workflow_id, step.name, self.config.deadline_shards),
            input=rendered,
            updated_at=epoch_seconds(self.clock),
        )
        request = StepRequest(
            workflow_id=workflow_id,
            step=step.name,
            phase=Phase.ACTION,
            agent=step.agent,
            action=step.action,
            attempt=attempt,
            complete_by=complete_by,
            token=remote_token(workflow_id, step.name, step.action),
            input=rendered,
            backoff_base_seconds=step.retry.backoff_base_seconds,
            backoff_cap_seconds=step.retry.backoff_cap_seconds,
            jitter=step.retry.jitter,
            max_calls=step.retry.max_attempts,
        )
        return record, self._outgoing(step.agent, request, delay)

    def _dispatch_compensation(
        self, snapshot: Snapshot, record: StepRecord, comp_attempt: int, start_at: int, *, delay: int = 0
    ) -> tuple[StepRecord, Outgoing]:
        workflow = snapshot.workflow
        step = workflow.definition.step(record.step)
        compensation = step.compensation
        assert compensation is not None
        complete_by = start_at + compensation.timeout_seconds
        context = self._context(snapshot)
        context["step"] = {"input": record.input, "output": record.output}
        rendered = render(compensation.input, context)
        updated = record.evolve(
            status=StepStatus.COMPENSATING,
            comp_attempt=comp_attempt,
            complete_by=complete_by,
            dl_shard=deadline_shard(workflow.workflow_id, step.name, self.config.deadline_shards),
            updated_at=epoch_seconds(self.clock),
        )
        request = StepRequest(
            workflow_id=workflow.workflow_id,
            step=step.name,
            phase=Phase.COMPENSATION,
            agent=step.agent,
            action=compensation.action,
            attempt=comp_attempt,
            complete_by=complete_by,
            token=remote_token(workflow.workflow_id, step.name, compensation.action),
            original_token=remote_token(workflow.workflow_id, step.name, step.action),
            input=rendered,
            backoff_base_seconds=compensation.retry.backoff_base_seconds,
            backoff_cap_seconds=compensation.retry.backoff_cap_seconds,
            jitter=compensation.retry.jitter,
            # One call per compensation attempt: retries are new supervised attempts, delayed by the backoff.
            max_calls=1,
        )
        return updated, self._outgoing(step.agent, request, delay)

    def _outgoing(self, agent: str, request: StepRequest, delay: int) -> Outgoing:
        try:
            queue_url = self.config.agent_queue_urls[agent]
        except KeyError:
            raise InvalidDefinitionError(f"unknown agent {agent!r}") from None
        return Outgoing(queue_url=queue_url, body=encode(request), delay_seconds=max(0, min(_MAX_SQS_DELAY, delay)))

    @staticmethod
    def _settled(
        record: StepRecord,
        status: StepStatus,
        now: int,
        *,
        output: Any = None,
        error: dict[str, Any] | None = None,
        may_have_happened: bool | None = None,
        comp_output: Any = None,
    ) -> StepRecord:
        changes: dict[str, Any] = {"status": status, "complete_by": None, "dl_shard": None, "updated_at": now}
        if status is StepStatus.COMPLETED:
            changes.update(output=output, error=None)
        elif status is StepStatus.COMPENSATED:
            changes.update(comp_output=comp_output)
        else:
            changes.update(error=error)
        if may_have_happened is not None:
            changes.update(may_have_happened=may_have_happened)
        return record.evolve(**changes)

    @staticmethod
    def _context(snapshot: Snapshot) -> dict[str, Any]:
        return {
            "input": snapshot.workflow.input,
            "steps": {name: {"output": r.output} for name, r in snapshot.steps.items() if r.output is not None},
        }

    def _set_status(self, workflow: WorkflowRecord, status: WorkflowStatus, now: int, *, reason: str) -> None:
        try:
            self.store.set_workflow_status(workflow.workflow_id, workflow.status, status, now=now, reason=reason)
        except ConditionFailedError:
            raise _Reload() from None

    def _finish(self, workflow: WorkflowRecord, status: WorkflowStatus, now: int) -> None:
        expires_at = now + self.config.terminal_retention_days * 86_400
        try:
            self.store.set_workflow_status(
                workflow.workflow_id, workflow.status, status, now=now, expires_at=expires_at
            )
        except ConditionFailedError:
            raise _Reload() from None
        # WorkflowsCompleted, WorkflowsCompensated, WorkflowsCancelled, WorkflowsCompensationFailed (alarmed)
        self.metrics("Workflows" + status.value.title().replace("_", ""))


class _Reload(SasflowError):
    """Internal: a conditional write in ``advance`` lost a race; reload the snapshot and try again."""


def _error(reply: StepReply) -> dict[str, Any]:
    if reply.error is not None:
        return reply.error.model_dump()
    return StepError(code=reply.outcome.value.upper(), message="no detail").model_dump()


def _no_call_made(reply: StepReply) -> bool:
    """An attempt that never reached the service (open circuit, or no time left on arrival) is not used up."""
    return reply.outcome is Outcome.DEFERRED or (_retryable(reply) and reply.calls == 0)


def _retryable(reply: StepReply) -> bool:
    return reply.outcome is Outcome.FAILED and reply.retryable


def _evolve_workflow(workflow: WorkflowRecord, status: WorkflowStatus, now: int, reason: str | None) -> WorkflowRecord:
    return replace(workflow, status=status, updated_at=now, reason=reason or workflow.reason)
