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

import hashlib
import hmac
import logging
import random
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from jmespath.exceptions import JMESPathError

from .clock import Clock, epoch_seconds
from .definition import RetryPolicy, StepDefinition, WorkflowDefinition, render
from .errors import (
    ConditionFailedError,
    ConfigurationError,
    ContentionError,
    IdempotencyKeyConflictError,
    InvalidDefinitionError,
    PayloadTooLargeError,
    WorkflowNotFoundError,
)
from .limits import MAX_STEP_INPUT_BYTES, json_size
from .messages import StepError, StepReply, StepRequest, encode, remote_token
from .ports import Counter, Outgoing, StateStore, no_metrics
from .records import Snapshot, StepRecord, WorkflowRecord
from .settings import EngineConfig
from .states import TERMINAL_WORKFLOW, UNWINDING_WORKFLOW, Outcome, Phase, StepStatus, WorkflowStatus

logger = logging.getLogger("sasflow.scheduler")

#: Reads (and conditional writes) one call makes before it gives up on a workflow that keeps changing under it.
MAX_ATTEMPTS = 6
#: After a lost write, wait a random time in [0, min(cap, base * 2**losses)] before reading again (seconds; full
#: jitter, AWS Architecture Blog "Exponential Backoff and Jitter"), so racing writers do not stay in lockstep.
CONFLICT_BACKOFF_BASE_SECONDS = 0.01
CONFLICT_BACKOFF_CAP_SECONDS = 0.2
_MAX_SQS_DELAY = 900
#: Passes of `_Transition.advance`: dispatch, then unwind what a failed dispatch started, then finish; more is a bug.
_MAX_ADVANCE_PASSES = 8


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


def workflow_id_for(owner: str, idempotency_key: str | None, secret: Callable[[], bytes] | None) -> str:
    """Return the workflow id for a start request, a UUID-formatted string of 128 bits.

    With an Idempotency-Key the id is ``HMAC-SHA256(secret, owner || key)``: a repeated start of the same principal
    finds the same workflow with one conditional write and no extra item, the same key from two principals gives two
    workflows, and nobody without the secret (the stack's ``WorkflowIdSecret``) can compute an id from a key.
    Without a key it is a random UUID v4.

    Raises
    ------
    ConfigurationError
        When a key is given and no secret is configured.
    """
    if not idempotency_key:
        return str(uuid.uuid4())
    if secret is None:
        raise ConfigurationError("WORKFLOW_ID_SECRET is not set: starts with an Idempotency-Key need it")
    message = f"{owner}\n{idempotency_key}".encode()
    return str(uuid.UUID(bytes=hmac.new(secret(), message, hashlib.sha256).digest()[:16]))


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
    id_secret:
        Returns the key of the workflow ids of Idempotency-Key starts (read once, lazily: only the API needs it).
    """

    def __init__(
        self,
        store: StateStore,
        clock: Clock,
        config: EngineConfig,
        *,
        rng: random.Random | None = None,
        metrics: Counter = no_metrics,
        id_secret: Callable[[], bytes] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.config = config
        self.rng = rng or random.Random()  # nosec B311 # backoff jitter only; workflow ids are HMAC-SHA256 or uuid4
        self.metrics = metrics
        self.id_secret = id_secret

    # ------------------------------------------------------------------ start
    def start_workflow(
        self,
        definition: WorkflowDefinition,
        workflow_input: dict[str, Any],
        *,
        request_hash: str,
        owner: str,
        idempotency_key: str | None = None,
    ) -> StartResult:
        """Record a new workflow of ``owner`` and dispatch its first steps.

        The workflow and its first steps, PROCESSING with attempt 1 and their complete-by, are written with one
        conditional write before any message is sent (write-ahead). A repeated start with the same
        Idempotency-Key by the same owner returns the existing workflow and writes nothing.

        Returns
        -------
        StartResult
            ``created`` is False for a repeat; ``messages`` must be sent by the caller.

        Raises
        ------
        InvalidDefinitionError
            When a step names an agent that has no queue, or an action (or compensating action) its agent does not
            accept (template ``AGENTS``, from agents.yaml), or a first step's input cannot be rendered.
        IdempotencyKeyConflictError
            When the key was used with a different request body.
        PayloadTooLargeError
            When a first step's input, a request message or the record would exceed its limit (nothing is written).
        """
        self._check_agents(definition)
        now = epoch_seconds(self.clock)
        workflow = WorkflowRecord(
            workflow_id=workflow_id_for(owner, idempotency_key, self.id_secret),
            status=WorkflowStatus.RUNNING,
            definition=definition,
            input=workflow_input,
            request_hash=request_hash,
            created_at=now,
            updated_at=now,
            idempotency_key=idempotency_key,
            owner=owner,
        )
        transition = _Transition(self, Snapshot(workflow), now)
        transition.advance()
        if transition.refusals:
            # Bad input is refused at the edge (DESIGN Rule 9): a first step that cannot be sent writes nothing.
            raise transition.refusals[0]
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

    def _check_agents(self, definition: WorkflowDefinition) -> None:
        agents = self.config.agents
        unknown = sorted({s.agent for s in definition.steps} - set(agents))
        if unknown:
            raise InvalidDefinitionError(f"unknown agent(s) {unknown}; known agents: {sorted(agents)}")
        refused = []
        for step in definition.steps:
            allowed = agents[step.agent].actions
            actions = [step.action] + ([step.compensation.action] if step.compensation else [])
            refused += [f"{step.name}: {step.agent}.{action}" for action in actions if action not in allowed]
        if refused:
            raise InvalidDefinitionError(
                "action(s) their agent does not accept: "
                + "; ".join(refused)
                + " (allowed: "
                + "; ".join(f"{name}: {', '.join(agent.actions)}" for name, agent in sorted(agents.items()))
                + ")"
            )

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
    def cancel(self, workflow_id: str, *, owner: str | None) -> tuple[Snapshot, list[Outgoing]]:
        """Ask a running workflow to stop: it becomes CANCELLING and compensates what may have happened.

        ``owner`` is the caller's principal; a workflow of another principal is not found (an operator passes None).

        Returns
        -------
        tuple[Snapshot, list[Outgoing]]
            The workflow as stored after the cancel, and the messages to send.

        Raises
        ------
        WorkflowNotFoundError
            When there is no such workflow, or it belongs to another principal.
        ConditionFailedError
            When the workflow is no longer RUNNING (the caller maps this to 409).
        """

        def cancel(transition: _Transition) -> None:
            if owner is not None and transition.snapshot.workflow.owner != owner:
                raise WorkflowNotFoundError(workflow_id)
            transition.cancel()

        stored, messages = self._update(workflow_id, cancel)
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
        #: Requests that could not be prepared in this call (their steps were failed); a start refuses on them.
        self.refusals: list[Exception] = []
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
        # An attempt that made calls without a definitive answer (a failed probe of a half-open circuit, a read
        # timeout) may have had its effect: remembered on the step, so an unwind compensates it.
        reached = record.may_have_happened or reply.calls > 0 or reply.outcome_unknown
        if _no_call_made(reply) and running and record.deferrals < self.config.max_deferrals:
            delay = _retry_delay(reply, self.now)
            base = record.evolve(deferrals=record.deferrals + 1, may_have_happened=reached)
            self._dispatch_forward(step, record.attempt, self.now + delay, base=base, delay=delay)
            return
        retryable = reply.outcome is Outcome.DEFERRED or _retryable(reply)
        if retryable and running and record.attempt < step.retry.max_attempts:
            delay = round(backoff_seconds(step.retry, record.attempt, self.service.rng))
            base = record.evolve(may_have_happened=reached)
            self._dispatch_forward(step, record.attempt + 1, self.now + delay, base=base, delay=delay)
            return
        self.set_step(_settled(record, StepStatus.FAILED, error=_error(reply), may_have_happened=True))

    def _compensation_outcome(self, record: StepRecord, reply: StepReply) -> None:
        step = self.definition.step(record.step)
        assert step.compensation is not None  # nosec B101 # narrows the type: only steps with a compensation are ever COMPENSATING
        policy = step.compensation.retry
        if reply.outcome is Outcome.SUCCEEDED:
            # The compensation happened; its output is informative only, so an oversized one is not kept.
            output = None if self.oversized else reply.output
            self.set_step(_settled(record, StepStatus.COMPENSATED, comp_output=output))
            return
        # The compensation has a deferral budget of its own: deferrals of the forward action (the outage that made
        # the workflow unwind, often) must not use up the compensation's attempts.
        if _no_call_made(reply) and record.comp_deferrals < self.config.max_deferrals:
            delay = _retry_delay(reply, self.now)
            base = record.evolve(comp_deferrals=record.comp_deferrals + 1)
            self._dispatch_compensation(base, record.comp_attempt, self.now + delay, delay=delay)
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
        assert step.compensation is not None  # nosec B101 # narrows the type: only a step with a compensation is COMPENSATING
        if record.comp_attempt < step.compensation.retry.max_attempts:
            self._dispatch_compensation(record.evolve(resends=record.resends + 1), record.comp_attempt + 1, self.now)
            self.count("SupervisorResends")
            return
        error = {"code": "TIMED_OUT", "message": f"no reply to compensation attempt {record.comp_attempt}"}
        self.set_step(_settled(record, StepStatus.COMPENSATION_FAILED, error=error))

    # ------------------------------------------------------------------ advance
    def advance(self) -> None:
        """Make every transition the snapshot allows: dispatch ready steps, finish the workflow, or unwind it.

        Passes repeat until one changes nothing: a step whose request could not be prepared fails during a pass, and
        the next pass unwinds the workflow (or finishes it COMPENSATION_FAILED) in the same write.
        """
        for _ in range(_MAX_ADVANCE_PASSES):
            before = self.snapshot
            self._advance_once()
            if self.snapshot is before:
                return

    def _advance_once(self) -> None:
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
                token=remote_token(self.workflow_id, step.name, step.action),
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
        self.messages.append(outgoing)

    def _dispatch_compensation(self, record: StepRecord, comp_attempt: int, start_at: int, *, delay: int = 0) -> None:
        """Put the compensation of ``record`` in flight; one that cannot be prepared is COMPENSATION_FAILED."""
        step = self.definition.step(record.step)
        compensation = step.compensation
        assert compensation is not None  # nosec B101 # narrows the type: only steps with a compensation are compensated
        complete_by = start_at + compensation.timeout_seconds
        try:
            context = self.snapshot.context()
            context["step"] = {"input": self.snapshot.input_of(step.name), "output": record.output}
            comp_input = render(compensation.input, context)
            json_size(comp_input, MAX_STEP_INPUT_BYTES, what=f"the compensation input of step {step.name}")
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
                input=comp_input,
                backoff_base_seconds=compensation.retry.backoff_base_seconds,
                backoff_cap_seconds=compensation.retry.backoff_cap_seconds,
                jitter=compensation.retry.jitter,
                # One call per compensation attempt: retries are new supervised attempts, delayed by the backoff.
                max_calls=1,
            )
            outgoing = self._outgoing(step.agent, request, delay)
        except _PREPARATION_ERRORS as error:
            # Nothing can undo this step without a person: it waits, COMPENSATION_FAILED, with the reason.
            self._refuse(step.name, error)
            self.set_step(_settled(record, StepStatus.COMPENSATION_FAILED, error=_preparation_error(error)))
            return
        self.set_step(record.evolve(status=StepStatus.COMPENSATING, comp_attempt=comp_attempt, complete_by=complete_by))
        self.messages.append(outgoing)

    def _refuse(self, step: str, error: Exception) -> None:
        logger.warning(
            "step request could not be prepared",
            extra={"workflow_id": self.workflow_id, "step": step, "error": str(error)[:500]},
        )
        self.refusals.append(error if isinstance(error, PayloadTooLargeError) else InvalidDefinitionError(str(error)))
        self.count("StepsNotPrepared")

    def _outgoing(self, agent: str, request: StepRequest, delay: int) -> Outgoing:
        try:
            queue_url = self.config.agent_queue_urls[agent]
        except KeyError:
            raise InvalidDefinitionError(f"agent {agent!r} is not configured (template AGENTS)") from None
        return Outgoing(queue_url=queue_url, body=encode(request), delay_seconds=max(0, min(_MAX_SQS_DELAY, delay)))


#: What preparing a step request can raise: the input's JMESPath at run time (a function given a wrong type), a
#: size over a limit, an agent no longer configured, a value the request model refuses, or nesting too deep.
_PREPARATION_ERRORS = (
    JMESPathError,
    PayloadTooLargeError,
    InvalidDefinitionError,
    ValueError,
    TypeError,
    RecursionError,
)


def _preparation_error(error: Exception) -> dict[str, Any]:
    """The step's error for a request that could not be prepared: a code and a message without internals."""
    if isinstance(error, PayloadTooLargeError):
        code, message = "INPUT_TOO_LARGE", f"{error.what} is {error.size} bytes; the limit is {error.limit} bytes"
    elif isinstance(error, InvalidDefinitionError):
        code, message = "AGENT_NOT_CONFIGURED", str(error)
    elif isinstance(error, RecursionError):
        code, message = "INPUT_NOT_RENDERED", "the input nests too deeply to render"
    else:
        code, message = "INPUT_NOT_RENDERED", f"the input could not be rendered: {type(error).__name__}: {error}"
    return StepError(code=code, message=message[:2048]).model_dump()


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
        # Sticky: once an attempt may have reached the service without a definitive answer, the step is compensated
        # if the workflow unwinds, whatever a later attempt reports (DESIGN Rule 6).
        changes.update(may_have_happened=may_have_happened or record.may_have_happened)
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


#: Shortest wait before an attempt deferred by an open circuit is tried again (seconds): never a hot loop.
MIN_DEFERRAL_SECONDS = 1


def _retry_delay(reply: StepReply, now: int) -> int:
    """Seconds to wait before an attempt that made no call is dispatched again (an SQS delay, 0..900).

    An attempt that reached its agent after its complete-by goes again at once, with a new complete-by. One deferred
    by an open circuit waits for the breaker: ``retry_after_seconds``, a duration the agent measured on its own
    clock, so a skewed agent clock cannot make the wait too short (an absolute ``retry_at`` read against the
    scheduler's clock could, and an agent 4 s behind then deferred the same attempt again and again within one
    second: a hot loop that used up the deferral budget). At least `MIN_DEFERRAL_SECONDS`.
    """
    if reply.outcome is not Outcome.DEFERRED:
        return 0
    if reply.retry_after_seconds is not None:
        wait = reply.retry_after_seconds
    elif reply.retry_at is not None:  # a reply of an agent that predates retry_after_seconds
        wait = reply.retry_at - now
    else:
        wait = 0
    return max(MIN_DEFERRAL_SECONDS, min(_MAX_SQS_DELAY, wait))


def _no_call_made(reply: StepReply) -> bool:
    """An attempt that never reached the service (open circuit, or no time left on arrival) is not used up."""
    return reply.outcome is Outcome.DEFERRED or (_retryable(reply) and reply.calls == 0)


def _retryable(reply: StepReply) -> bool:
    return reply.outcome is Outcome.FAILED and reply.retryable
