"""The transitions of one call to one workflow, worked out in memory: the base every concern builds on.

A `Transition` (``transitions.Transition``) starts from the snapshot the scheduler read and replaces it, never
mutating it, with every change: apply a reply or a timeout, then advance (dispatch ready steps, finish, or unwind).
The scheduler stores the result with one conditional write (DESIGN Rule 2) and only then sends ``messages``. The
concerns live in modules of their own: ``forward`` (the steps' actions), ``compensation`` (unwinding),
``operator`` (cancel and the operator actions); this module holds what they share and the routing of a reply or a
timeout to them. Nothing outside this package decides a workflow's next state.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from jmespath.exceptions import JMESPathError

from ..claim_check import ClaimCheck, Upload, reference_key
from ..definition import MapStep, RetryPolicy, WaitStep, WorkflowDefinition, render
from ..errors import (
    ClaimCheckMissingError,
    InvalidDefinitionError,
    MissingReferenceError,
    PayloadTooLargeError,
    StepNotEvaluatedError,
)
from ..fanout import ChildCommand, ParentRef
from ..history import HistoryWriter
from ..limits import MAX_STEP_INPUT_BYTES, json_size
from ..messages import StepError, StepReply, StepRequest, encode, remote_token
from ..ports import Counter, Outgoing
from ..records import Snapshot, StepRecord
from ..settings import EngineConfig
from ..states import DONE_STEP, TERMINAL_WORKFLOW, UNWINDING_WORKFLOW, Outcome, Phase, StepStatus, WorkflowStatus
from ..tenancy import fair_group

#: The history's code of a deferred reply (no call made, no attempt used): the agent's call limits (a busy service),
#: or an open circuit (a failing one).
CALLS_LIMITED = "CALLS_LIMITED"
CIRCUIT_OPEN = "CIRCUIT_OPEN"

logger = logging.getLogger("sasflow.scheduler")

_MAX_SQS_DELAY = 900
#: How a held workflow's reason ends, and how it ends once the hold timeout unwinds it (the cause is kept before).
HELD_SUFFIX = " (held for a person)"
HOLD_TIMEOUT_SUFFIX = " (held past its hold timeout)"
#: Passes of `TransitionBase.advance`: dispatch, then unwind what a failed dispatch started, then finish; more is a
#: bug.
_MAX_ADVANCE_PASSES = 8


def backoff_seconds(policy: RetryPolicy, attempt: int, rng: random.Random) -> float:
    """Delay before try ``attempt + 1`` after ``attempt`` failed (seconds).

    Exponential backoff ``base * 2**(attempt-1)`` capped at ``cap``, with full jitter (uniform in [0, delay]) when
    the policy asks for it (AWS Architecture Blog, "Exponential Backoff and Jitter").
    """
    delay = min(policy.backoff_cap_seconds, policy.backoff_base_seconds * (2 ** max(0, attempt - 1)))
    return rng.uniform(0, delay) if policy.jitter else delay


class TransitionBase:
    """The transitions one call makes to one workflow, worked out in memory from the snapshot it read.

    ``snapshot`` starts as the snapshot read and is replaced (never mutated) by every change; it stays the very same
    object when nothing changed. ``messages`` and the metrics count only once the caller has stored the result.
    ``oversized`` is set when a first try did not fit in the store's item: a reply's output is then refused (a
    forward step fails with ``OUTPUT_TOO_LARGE``, a compensation keeps no output).

    Parameters
    ----------
    config:
        Engine settings (agents, grace, retention, deferral budget).
    rng:
        Random source of backoff jitter.
    metrics:
        Counter the metrics of this call go to, once it is stored (`emit_metrics`).
    base:
        The snapshot read.
    now:
        The time of this call (epoch seconds).
    claims:
        The claim-check of large payloads (``claim_check.py``), or None: every payload then travels as it is.
    """

    def __init__(
        self,
        config: EngineConfig,
        rng: random.Random,
        metrics: Counter,
        base: Snapshot,
        now: int,
        *,
        oversized: bool = False,
        claims: ClaimCheck | None = None,
    ) -> None:
        self.config = config
        self.claims = claims
        #: Claim-checked rendered inputs of this call's requests: written after the write, before the send.
        self.uploads: list[Upload] = []
        #: Objects written ``pending`` (an agent's output, a start's or a child's input) that this call's write makes
        #: its workflow's: re-stamped to the workflow's retention (live, or terminal once it has its TTL) after it.
        self.claimed: list[str] = []
        self.rng = rng
        self.metrics = metrics
        self.snapshot = base
        self.now = now
        self.oversized = oversized
        self.messages: list[Outgoing] = []
        #: Requests that could not be prepared in this call (their steps were failed); a start refuses on them.
        self.refusals: list[Exception] = []
        #: What the scheduler does to map steps' children once this call's write is stored (transitions.mapping).
        self.children: list[ChildCommand] = []
        self._metrics: list[tuple[str, int]] = []
        workflow = base.workflow
        #: The history of this call: every event is appended to ``snapshot``, so the write that stores the change
        #: stores its events (history.py).
        self.history = HistoryWriter(
            workflow.created_at, now, [s.name for s in workflow.definition.steps], self._append_event
        )

    def _append_event(self, line: str) -> None:
        self.snapshot = self.snapshot.with_events([line])

    # ------------------------------------------------------------------ bookkeeping
    def set_step(self, record: StepRecord) -> None:
        """Replace the step of ``record``'s name (stamped with this call's time)."""
        self.snapshot = self.snapshot.with_step(record)
        self._touch()

    def set_status(self, status: WorkflowStatus, *, reason: str | None = None) -> None:
        """Move the workflow to ``status``; a terminal one gets its TTL (``expires_at``)."""
        workflow = self.snapshot.workflow
        changes: dict[str, Any] = {"status": status}
        if reason is not None:
            changes["reason"] = reason
        if status in TERMINAL_WORKFLOW:
            # A map step's child is kept while its parent may compensate it: its retention starts when its parent
            # ends (SchedulerService._retain_children), not when it does.
            retained = workflow.parent is None
            changes["expires_at"] = self.now + self.config.terminal_retention_days * 86_400 if retained else None
            changes["paused"] = False  # nothing is left to dispatch: a finished workflow is not paused
        if status is not WorkflowStatus.HELD:
            changes["hold_until"] = None  # a hold timeout applies only while held
        self.snapshot = self.snapshot.with_workflow(workflow.evolve(**changes))
        self._touch()
        if status in TERMINAL_WORKFLOW:
            self.history.finished(status.value)
            parent = self.snapshot.workflow.parent
            if parent is not None:  # a map step's child tells its parent, by the write that ends it
                self.messages.append(child_report(self.config.response_queue_url, parent, status.value))
        elif status in UNWINDING_WORKFLOW and workflow.status not in UNWINDING_WORKFLOW:
            self.history.unwinding(_reason_code(reason))

    def retain(self, expires_at: int | None) -> None:
        """Give this ended map step's child the retention of its parent: ``expires_at`` (epoch seconds), the
        parent's TTL once it has ended, or None while an operator has taken the parent out of its end.

        Changes nothing unless the workflow is terminal (a child that has not ended gets its retention when it ends).
        """
        workflow = self.snapshot.workflow
        if workflow.status in TERMINAL_WORKFLOW and workflow.expires_at != expires_at:
            self.snapshot = self.snapshot.with_workflow(workflow.evolve(expires_at=expires_at))

    def _touch(self) -> None:
        workflow = self.snapshot.workflow
        if workflow.updated_at != self.now:
            workflow = workflow.evolve(updated_at=self.now)
        attention = workflow.needs_attention
        if attention != workflow.attention:
            # Into or out of the sparse attention index: its key moves only when what the person waits on changes.
            workflow = workflow.evolve(attention=attention, attention_since=self.now if attention else None)
        if workflow is not self.snapshot.workflow:
            self.snapshot = self.snapshot.with_workflow(workflow)

    def count(self, metric: str, value: int = 1) -> None:
        """Count ``metric`` (by ``value``) once this call's write is stored."""
        self._metrics.append((metric, value))

    def emit_metrics(self) -> None:
        """Hand the counted metrics to the counter (after the write succeeded)."""
        for name, value in self._metrics:
            self.metrics(name, value)

    @property
    def definition(self) -> WorkflowDefinition:
        """The workflow's definition."""
        return self.snapshot.workflow.definition

    @property
    def workflow_id(self) -> str:
        """The workflow's id."""
        return self.snapshot.workflow.workflow_id

    # ------------------------------------------------------------------ payloads (claim_check.py)
    def context(self) -> dict[str, Any]:
        """The JMESPath context of this workflow, its claim-checked input and outputs resolved.

        Raises
        ------
        ClaimCheckMissingError
            When a referenced object is missing (a step it prepares fails with ``CLAIM_CHECK_MISSING``).
        """
        context = self.snapshot.context()
        return context if self.claims is None else self.claims.resolve_context(context, self.workflow_id)

    def input_of(self, step: str) -> dict[str, Any]:
        """The rendered input of ``step`` (``Snapshot.input_of``), from the resolved `context`."""
        record = self.snapshot.steps.get(step)
        if record is not None and record.input_override is not None:
            return record.input_override
        template = self.definition.step(step).input
        return render(template, self.context(), where=f"steps[{step}].input")

    def claim_input(self, value: dict[str, Any], what: str) -> dict[str, Any]:
        """A rendered input as its request carries it: itself, or its claim-check reference above the threshold.

        The object is written after this call's write and before its messages go (``uploads``).

        Raises
        ------
        PayloadTooLargeError
            Above ``MAX_STEP_INPUT_BYTES`` without a claim-check, above ``max_payload_bytes`` with one.
        """
        if self.claims is None:
            json_size(value, MAX_STEP_INPUT_BYTES, what=what)
            return value
        claimed, upload = self.claims.prepare(self.workflow_id, value, what=what)
        if upload is not None:
            self.uploads.append(upload)
            self.count("PayloadsClaimChecked")
            if not self.snapshot.workflow.claim_checked:
                self.snapshot = self.snapshot.with_workflow(self.snapshot.workflow.evolve(claim_checked=True))
        return dict(claimed)

    def _note_claimed_output(self, reply: StepReply) -> None:
        """Keep track of an agent's claim-checked output even when the reply is dropped: the agent wrote it
        ``pending`` (it expires unless a workflow keeps it), and it is under the workflow's prefix, so the workflow
        re-stamps it to its own retention after this call, and its objects when it ends."""
        key = reference_key(reply.output)
        if key is None or not key.startswith(f"{self.workflow_id}/"):
            return  # never another workflow's object (resolve refuses such a reference too)
        self.claimed.append(key)
        workflow = self.snapshot.workflow
        if workflow.status not in TERMINAL_WORKFLOW and not workflow.claim_checked:
            self.snapshot = self.snapshot.with_workflow(workflow.evolve(claim_checked=True))

    # ------------------------------------------------------------------ replies
    def apply_reply(self, reply: StepReply) -> None:
        """Apply an agent's reply if it answers the step's current attempt of its current phase (DESIGN Rule 5).

        One exception: the success of an earlier attempt of an action still in flight under the same remote token
        (`ForwardTransitions._earlier_success`) completes the step, since the current attempt would get the same
        answer. A failure of an earlier attempt never moves the step.
        """
        self._note_claimed_output(reply)
        record = self.snapshot.steps.get(reply.step)
        if record is None:
            logger.warning("reply for a step never dispatched", extra={"workflow_id": reply.workflow_id})
            return
        if isinstance(self.definition.step(reply.step), MapStep):
            self._map_reply(record, reply)  # a child's report, or the step's tick (transitions.mapping)
            self.advance()
            return
        in_flight_status = StepStatus.COMPENSATING if reply.phase is Phase.COMPENSATION else StepStatus.PROCESSING
        if self._earlier_success(record, reply):
            self.history.reply(reply.step, reply.phase, reply.attempt, reply.outcome, reply.calls, None)
            self.count("EarlierSuccessesApplied")
            self._forward_outcome(record, reply)
            self.advance()
            return
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
        if reply.phase is Phase.ACTION and isinstance(self.definition.step(reply.step), WaitStep):
            self._wait_timer(record)  # a wait step's own timer (forward.ForwardTransitions)
            self.advance()
            return
        code = reply.error.code if reply.error is not None else None
        if code is None and reply.outcome is Outcome.DEFERRED:
            # which wait it was, for the person reading the history: a busy service or a failing one
            code = CALLS_LIMITED if reply.deferred_by == "limit" else CIRCUIT_OPEN
        self.history.reply(reply.step, reply.phase, reply.attempt, reply.outcome, reply.calls, code)
        if reply.phase is Phase.ACTION:
            self._forward_outcome(record, reply)
        else:
            self._compensation_outcome(record, reply)
        self.advance()

    # ------------------------------------------------------------------ timeouts
    def handle_overdue(self) -> None:
        """Resend or fail every step overdue now (``now > complete_by + grace``), resume every wait whose time has
        come, and send the timer of every long wait now within SQS's longest delay of its time; then advance."""
        for name in self.definition.order:
            record = self.snapshot.steps.get(name)
            timer_at = record.timer_at if record is not None and self._waits(name) else None
            if record is not None and timer_at is not None and timer_at <= self.now < (record.complete_by or 0):
                # A wait longer than 900 s could not be given its delayed message at the start: send it now, so it
                # resumes at its time, not at the first sweep after its time plus the grace.
                self._wait_timer(record)
                self.count("WaitTimersSentBySupervisor")
        cutoff = self.now - self.config.deadline_grace_seconds
        overdue = [
            self.snapshot.steps[name]
            for name in self.definition.order
            if name in self.snapshot.steps
            and self.snapshot.steps[name].in_flight
            # a wait's complete-by is its resume time: due then, with no reply to wait for
            and (self.snapshot.steps[name].complete_by or 0) < (self.now + 1 if self._waits(name) else cutoff)
        ]
        if not overdue:
            if self.snapshot.workflow.status is WorkflowStatus.HELD:
                self.advance()  # its hold timeout has passed (its index key): compensate it
                return
            if self.snapshot.workflow.status not in TERMINAL_WORKFLOW and not any(
                r.in_flight for r in self.snapshot.steps.values()
            ):
                # Safety net: nothing in flight, so no reply can move this workflow; advance it.
                self.count("WorkflowsStalled")
                self.advance()
                return
            key, due = self.snapshot.stored_key, self.snapshot.due_key(self.config.deadline_grace_seconds)
            if key is not None and due is not None and key < due:
                # A lower bound kept by earlier writes (records.index_key_for) fell due: store the true key.
                self.snapshot = self.snapshot.with_index_key(due)
                self.count("DeadlineKeysRefreshed")
            return  # otherwise the index entry was out of date (it is eventually consistent)
        for record in overdue:
            step = self.definition.step(record.step)
            if isinstance(step, MapStep):
                self._map_timed_out(record, step)
            elif record.status is StepStatus.PROCESSING:
                self._forward_timed_out(record, step)
            else:
                self._compensation_timed_out(record, step)
        self.advance()

    # ------------------------------------------------------------------ a tenant's queue (tenancy.py)
    def dequeue(self) -> None:
        """Start a QUEUED workflow that now holds a slot of its tenant: RUNNING, its first steps dispatched in the
        same write. Changes nothing when it is not QUEUED any more (started by another call, or cancelled)."""
        if self.snapshot.workflow.status is not WorkflowStatus.QUEUED:
            return
        self.set_status(WorkflowStatus.RUNNING)
        self.history.dequeued()
        self.count("WorkflowsDequeued")
        self.advance()

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
                self.fail_workflow(first.step, f"step {first.step} failed: {(first.error or {}).get('code', 'FAILED')}")
                return
            if all(self.snapshot.status_of(name) in DONE_STEP for name in self.definition.order):
                self._finish(WorkflowStatus.COMPLETED)
                return
            self._dispatch_ready()
        elif workflow.status is WorkflowStatus.HELD:
            if workflow.hold_until is not None and self.now > workflow.hold_until:
                # The reason keeps the failure that held it (what the unwind undoes it for), and says why now.
                cause = (workflow.reason or "held").removesuffix(HELD_SUFFIX)
                self.set_status(WorkflowStatus.COMPENSATING, reason=f"{cause}{HOLD_TIMEOUT_SUFFIX}")
                self._unwind()
        elif workflow.status in UNWINDING_WORKFLOW:
            self._unwind()

    def fail_workflow(self, step: str, reason: str) -> None:
        """Step ``step`` failed for good: unwind the workflow, or hold it for a person under the ``hold`` policy.

        A held workflow keeps its steps as they are (the failed one FAILED, others in flight finish) and dispatches
        nothing new; under a hold timeout it is in the deadline index until then, and the supervisor compensates it
        once the timeout has passed.
        """
        if self.definition.failure_policy(step) == "hold":
            timeout = self.definition.hold_timeout_seconds
            hold_until = None if timeout is None else self.now + timeout
            self.snapshot = self.snapshot.with_workflow(self.snapshot.workflow.evolve(hold_until=hold_until))
            self.set_status(WorkflowStatus.HELD, reason=f"{reason}{HELD_SUFFIX}")
            self.history.held(_reason_code(reason))
            self.count("WorkflowsHeld")
            return
        self.set_status(WorkflowStatus.COMPENSATING, reason=reason)
        self._unwind()

    def _finish(self, status: WorkflowStatus, *, reason: str | None = None) -> None:
        self.set_status(status, reason=reason)
        # WorkflowsCompleted, WorkflowsCompensated, WorkflowsCancelled, WorkflowsCompensationFailed (alarmed)
        self.count("Workflows" + status.value.title().replace("_", ""))

    def _refuse(self, step: str, error: Exception, phase: Phase = Phase.ACTION) -> None:
        self.history.not_prepared(step, phase, str(_preparation_error(error)["code"]))
        logger.warning(
            "step request could not be prepared",
            extra={"workflow_id": self.workflow_id, "step": step, "error": str(error)[:500]},
        )
        kept = isinstance(error, (PayloadTooLargeError, InvalidDefinitionError))  # MissingReferenceError is one
        self.refusals.append(error if kept else InvalidDefinitionError(str(error)))
        self.count("StepsNotPrepared")

    def _request(
        self,
        step: str,
        phase: Phase,
        agent: str,
        action: str,
        *,
        attempt: int,
        complete_by: int,
        token_action: str,
        step_input: dict[str, Any],
        retry: RetryPolicy,
        max_calls: int,
        delay: int,
        original_action: str | None = None,
    ) -> Outgoing:
        """The message of one step request to ``agent``: its remote token derived from ``token_action`` (and, for a
        compensation, the forward action's ``original_action``), its backoff from ``retry``.

        Raises
        ------
        InvalidDefinitionError
            When ``agent`` is not configured (template ``AGENTS``).
        PayloadTooLargeError
            When the message would be over SQS's limit.
        """
        request = StepRequest(
            workflow_id=self.workflow_id,
            step=step,
            phase=phase,
            agent=agent,
            action=action,
            attempt=attempt,
            complete_by=complete_by,
            token=remote_token(self.workflow_id, step, token_action),
            original_token=None if original_action is None else remote_token(self.workflow_id, step, original_action),
            input=step_input,
            backoff_base_seconds=retry.backoff_base_seconds,
            backoff_cap_seconds=retry.backoff_cap_seconds,
            jitter=retry.jitter,
            max_calls=max_calls,
            priority=self.snapshot.workflow.priority,
            tenant=fair_group(self.snapshot.workflow.tenant, self.snapshot.workflow.owner),
        )
        return self._outgoing(agent, request, delay)

    def _outgoing(self, agent: str, request: StepRequest, delay: int) -> Outgoing:
        try:
            queue_url = self.config.agent_queue_urls[agent]
        except KeyError:
            raise InvalidDefinitionError(f"agent {agent!r} is not configured (template AGENTS)") from None
        return Outgoing(
            queue_url=queue_url,
            body=encode(request),
            delay_seconds=max(0, min(_MAX_SQS_DELAY, delay)),
            workflow_id=request.workflow_id,
            group=request.tenant,
        )

    def _waits(self, name: str) -> bool:
        record = self.snapshot.steps[name]
        return record.status is StepStatus.PROCESSING and isinstance(self.definition.step(name), WaitStep)

    # ------------------------------------------------------------------ the concerns (transitions/*.py)
    def _wait_timer(self, record: StepRecord) -> None:
        raise NotImplementedError  # forward.ForwardTransitions

    def _map_reply(self, record: StepRecord, reply: StepReply) -> None:
        raise NotImplementedError  # mapping.MapTransitions

    def _map_timed_out(self, record: StepRecord, step: MapStep) -> None:
        raise NotImplementedError  # mapping.MapTransitions

    def _start_map(self, step: MapStep, attempt: int, base: StepRecord | None) -> None:
        raise NotImplementedError  # mapping.MapTransitions

    def _start_map_compensation(self, record: StepRecord) -> None:
        raise NotImplementedError  # mapping.MapTransitions

    def _earlier_success(self, record: StepRecord, reply: StepReply) -> bool:
        raise NotImplementedError  # forward.ForwardTransitions

    def _forward_outcome(self, record: StepRecord, reply: StepReply) -> None:
        raise NotImplementedError  # forward.ForwardTransitions

    def _forward_timed_out(self, record: StepRecord, step: Any) -> None:
        raise NotImplementedError  # forward.ForwardTransitions

    def _dispatch_ready(self) -> None:
        raise NotImplementedError  # forward.ForwardTransitions

    def _compensation_outcome(self, record: StepRecord, reply: StepReply) -> None:
        raise NotImplementedError  # compensation.CompensationTransitions

    def _compensation_timed_out(self, record: StepRecord, step: Any) -> None:
        raise NotImplementedError  # compensation.CompensationTransitions

    def _unwind(self) -> None:
        raise NotImplementedError  # compensation.CompensationTransitions

    def _dispatch_forward(
        self, step: Any, attempt: int, start_at: int, *, base: StepRecord | None = None, delay: int = 0
    ) -> None:
        raise NotImplementedError  # forward.ForwardTransitions

    def _dispatch_compensation(self, record: StepRecord, comp_attempt: int, start_at: int, *, delay: int = 0) -> None:
        raise NotImplementedError  # compensation.CompensationTransitions


#: What preparing a step request can raise: the input's JMESPath at run time (a function given a wrong type), a
#: size over a limit, an agent no longer configured, a value the request model refuses, or nesting too deep.
_PREPARATION_ERRORS = (
    JMESPathError,
    ClaimCheckMissingError,
    PayloadTooLargeError,
    InvalidDefinitionError,
    ValueError,
    TypeError,
    RecursionError,
)


def _preparation_error(error: Exception) -> dict[str, Any]:
    """The step's error for a request that could not be prepared: a code and a message without internals."""
    if isinstance(error, ClaimCheckMissingError):
        code, message = "CLAIM_CHECK_MISSING", str(error)
    elif isinstance(error, PayloadTooLargeError):
        code, message = "INPUT_TOO_LARGE", f"{error.what} is {error.size} bytes; the limit is {error.limit} bytes"
    elif isinstance(error, MissingReferenceError):
        code, message = "MISSING_REFERENCE", str(error)
    elif isinstance(error, StepNotEvaluatedError):
        code, message = error.code, str(error)
    elif isinstance(error, InvalidDefinitionError):
        code, message = "AGENT_NOT_CONFIGURED", str(error)
    elif isinstance(error, RecursionError):
        code, message = "INPUT_NOT_RENDERED", "the input nests too deeply to render"
    else:
        code, message = "INPUT_NOT_RENDERED", f"the input could not be rendered: {type(error).__name__}: {error}"
    return StepError(code=code, message=message[:2048]).model_dump()


def _reason_code(reason: str | None) -> str | None:
    """The short code of an unwinding reason ("step x failed: CODE" gives CODE; a timeout TIMED_OUT)."""
    if not reason:
        return None
    if ": " in reason:
        return reason.rsplit(": ", 1)[1]
    return "TIMED_OUT" if "timed out" in reason else reason.split(" ", 1)[0].upper()


def _settled(
    record: StepRecord,
    status: StepStatus,
    *,
    output: Any = None,
    error: dict[str, Any] | None = None,
    may_have_happened: bool | None = None,
    comp_output: Any = None,
) -> StepRecord:
    changes: dict[str, Any] = {"status": status, "complete_by": None, "timer_at": None}
    if status is StepStatus.COMPLETED:
        changes.update(output=output, error=None)
    elif status is StepStatus.COMPENSATED:
        changes.update(comp_output=comp_output, comp_error=None)
    elif status is StepStatus.COMPENSATION_FAILED:
        changes.update(comp_error=error)  # the action's own error stays: an operator needs both
    else:
        changes.update(error=error)
    if may_have_happened is not None:
        # Sticky: once an attempt may have reached the service without a definitive answer, the step is compensated
        # if the workflow unwinds, whatever a later attempt reports (DESIGN Rule 6).
        changes.update(may_have_happened=may_have_happened or record.may_have_happened)
    return record.evolve(**changes)


def child_report(queue_url: str, parent: ParentRef, status: str) -> Outgoing:
    """The message by which child ``parent.index`` reports its terminal ``status`` to its parent's map step."""
    report = StepReply(
        workflow_id=parent.workflow_id,
        step=parent.step,
        phase=Phase.ACTION,
        attempt=parent.attempt,
        outcome=Outcome.SUCCEEDED if status == WorkflowStatus.COMPLETED.value else Outcome.REJECTED,
        child=parent.index,
        child_status=status,  # type: ignore[arg-type]  # a terminal status's value
    )
    return Outgoing(queue_url=queue_url, body=encode(report), workflow_id=report.workflow_id)


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
