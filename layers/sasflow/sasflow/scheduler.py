"""The scheduler: every workflow and step transition happens here.

The API (start, cancel), the scheduler Lambda (agents' replies) and the supervisor (overdue steps) all call this
service. Each call reads the workflow's one record, works out every transition it allows in memory (a
`Transition`: apply the reply or the timeout, then advance: dispatch ready steps, finish, or unwind), and stores
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
from dataclasses import dataclass, field, replace
from typing import Any

from .callbacks import CallbackNotFoundError, CallbackRequest, CallbackResult, parse_token
from .claim_check import (
    LIVE,
    PENDING,
    REFERENCE_KEY,
    TERMINAL,
    ClaimCheck,
    Upload,
    reference_key,
    uses_claim_check,
)
from .clock import Clock, epoch_seconds
from .definition import MapStep, WorkflowDefinition
from .errors import (
    ClaimCheckMissingError,
    ConditionFailedError,
    ConfigurationError,
    ContentionError,
    IdempotencyKeyConflictError,
    InvalidDefinitionError,
    PayloadTooLargeError,
    TenantLimitError,
    WorkflowNotFoundError,
)
from .fanout import ChildCommand, child_id
from .messages import DEFAULT_PRIORITY, StepError, StepReply, canonical_hash, encode
from .ports import Counter, Outgoing, StateStore, TriggerStore, no_metrics
from .records import Snapshot, StepRecord, TriggerRef, WorkflowRecord, index_key_for
from .settings import EngineConfig
from .states import ENDED_RUN, TERMINAL_WORKFLOW, Outcome, Phase, StepStatus, WorkflowStatus
from .tenancy import (
    HOLDER_GRACE_SECONDS,
    MAX_PROMOTIONS,
    QUEUE_CHECK_SECONDS,
    QueueEntry,
    TenantGate,
    TenantSlotStore,
    tenant_of,
)
from .transitions import MIN_DEFERRAL_SECONDS, NO_OUTPUT, Transition, backoff_seconds
from .transitions.base import child_report
from .transitions.mapping import MAP_CHILD_ID_TAKEN

__all__ = [
    "MIN_DEFERRAL_SECONDS",
    "OPERATOR_ACTIONS",
    "SchedulerService",
    "StartResult",
    "backoff_seconds",
    "workflow_id_for",
]

logger = logging.getLogger("sasflow.scheduler")

#: The operator actions (``SchedulerService.operate``), as the API's routes and the CLI's commands name them.
OPERATOR_ACTIONS = ("retry", "skip", "compensate", "retry-compensation", "resolve", "pause", "resume", "cancel")
#: Reads (and conditional writes) one call makes before it gives up on a workflow that keeps changing under it.
MAX_ATTEMPTS = 6
#: After a lost write, wait a random time in [0, min(cap, base * 2**losses)] before reading again (seconds; full
#: jitter, AWS Architecture Blog "Exponential Backoff and Jitter"), so racing writers do not stay in lockstep.
CONFLICT_BACKOFF_BASE_SECONDS = 0.01
CONFLICT_BACKOFF_CAP_SECONDS = 0.2
_MAX_SQS_DELAY = 900
#: Passes of `Transition.advance`: dispatch, then unwind what a failed dispatch started, then finish; more is a bug.
_MAX_ADVANCE_PASSES = 8


@dataclass(frozen=True)
class StartResult:
    """What ``start_workflow`` did: the workflow as stored, whether this call created it, and the messages to send."""

    snapshot: Snapshot
    created: bool
    messages: list[Outgoing] = field(default_factory=list)
    #: A start QUEUED behind its tenant's running workflows: its place in the queue when it was queued (1: next;
    #: workflows cancelled ahead of it since make it start sooner). None for a start that runs.
    queue_position: int | None = None

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
    correlate:
        Called with the workflow id before each call works on a workflow: handlers pass powertools'
        ``Logger.set_correlation_id``, so every log line is found by the workflow's id.
    claims:
        The claim-check of large payloads (``claim_check.py``; None: payloads travel as they are). The scheduler
        claim-checks a large workflow input before the workflow is created, writes its rendered inputs' objects
        after the write that dispatches them and before their requests are returned, and re-stamps a workflow's
        objects when it ends (or an operator takes it out of its end).
    triggers:
        The triggers' items (``ports.TriggerStore``; None: no trigger holds a slot). A run that holds its
        trigger's slot (``overlap: skip`` or ``buffer_one``) gives it back in the call whose write ended it, and
        again in any later call on it (the first give-back may have crashed); the tick waiting for the slot is
        among the messages returned.
    tenancy:
        The tenants' items (``tenancy.TenantSlotStore``; None: no definition limits its tenants here). A start of a
        definition with ``tenancy`` takes a slot of its tenant before it writes its workflow, or is refused
        (``errors.TenantLimitError``); the workflow gives it back in the call whose write ended it, and again in any
        later call on it.
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
        correlate: Callable[[str], None] | None = None,
        claims: ClaimCheck | None = None,
        triggers: TriggerStore | None = None,
        tenancy: TenantSlotStore | None = None,
    ) -> None:
        self.correlate = correlate or (lambda workflow_id: None)
        self.tenants = None if tenancy is None else TenantGate(tenancy, self._status_of)
        self.claims = claims
        self.triggers = triggers
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
        trigger: TriggerRef | None = None,
        priority: int | None = None,
    ) -> StartResult:
        """Record a new workflow of ``owner`` and dispatch its first steps (``priority``: 1 to 5, None the default).

        The workflow and its first steps, PROCESSING with attempt 1 and their complete-by, are written with one
        conditional write before any message is sent (write-ahead). A repeated start with the same
        Idempotency-Key by the same owner returns the existing workflow and writes nothing. A start by a trigger
        (``triggers.py``) names it and its occurrence (``trigger``), in the record and the first history event.

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
            When the input is over ``max_payload_bytes`` (or, without a claim-check, does not fit in the record),
            or a first step's input, a request message or the record would exceed its limit (nothing is written).
        TenantKeyError
            When the definition's ``tenancy.tenant_key`` gives no tenant on this input.
        TenantLimitError
            When the tenant runs ``tenancy.max_running`` workflows of the definition already (nothing is written),
            under ``over_limit: refuse``; under ``queue`` the workflow is written QUEUED instead (``queue_position``).
        """
        self.check_agents(definition)
        tenant = None if definition.tenancy is None else tenant_of(definition.tenancy, owner, workflow_input)
        if REFERENCE_KEY in workflow_input:
            raise InvalidDefinitionError(f"the input's key {REFERENCE_KEY!r} is reserved for claim-check references")
        now = epoch_seconds(self.clock)
        workflow_id = workflow_id_for(owner, idempotency_key, self.id_secret)
        stored_input: dict[str, Any] = workflow_input
        pending: Upload | None = None
        if self.claims is not None:
            # Written before the workflow that names it (write-ahead), pending until the workflow exists: a start
            # that fails in between leaves an object the bucket expires. The same input of a repeated start has the
            # same key, so a repeat writes the same object again.
            claimed, pending = self.claims.prepare(workflow_id, workflow_input, what="the workflow input")
            stored_input = dict(claimed)
        workflow = WorkflowRecord(
            workflow_id=workflow_id,
            status=WorkflowStatus.RUNNING,
            definition=definition,
            input=stored_input,
            claim_checked=pending is not None,
            request_hash=request_hash,
            created_at=now,
            updated_at=now,
            idempotency_key=idempotency_key,
            owner=owner,
            trigger=trigger,
            tenant=tenant,
            priority=None if priority == DEFAULT_PRIORITY else priority,
        )
        self.correlate(workflow.workflow_id)
        transition = Transition(self.config, self.rng, self.metrics, Snapshot(workflow), now, claims=self.claims)
        transition.history.started(trigger)
        transition.advance()
        if transition.refusals:
            # Bad input is refused at the edge (DESIGN Rule 9): a first step that cannot be sent writes nothing.
            raise transition.refusals[0]
        position: int | None = None
        if tenant is not None:
            taken = self._take_tenant_slot(definition, tenant, workflow_id, now, request_hash, idempotency_key)
            if isinstance(taken, StartResult):
                return taken
            if taken is not None:  # queued behind the tenant's running workflows: nothing is dispatched
                ticket, position = taken
                workflow = workflow.evolve(status=WorkflowStatus.QUEUED, queue_ticket=ticket)
                transition = Transition(
                    self.config, self.rng, self.metrics, Snapshot(workflow), now, claims=self.claims
                )
                transition.history.started(trigger)
                transition.history.queued(ticket)
                transition.count("WorkflowsQueued")
        if pending is not None and self.claims is not None:
            self.claims.upload([pending], state=PENDING)
            transition.claimed.append(pending.key)  # made live by _settle_payloads once the workflow exists
        try:
            stored = self.store.create(self._keyed(None, transition.snapshot, now))
        except ConditionFailedError:
            existing = self.store.load(workflow.workflow_id)
            if existing is None:  # pragma: no cover - the condition failed, so it exists (TTL aside)
                raise
            # A repeat of a start whose workflow has ended: the slot this call took (or one never given back) goes.
            given_back = self._give_back_tenant_slot(existing)
            self._reclaim_input(existing, transition.claimed)
            return replace(_repeated(existing, request_hash), messages=given_back)
        except PayloadTooLargeError:
            # Refused before the write: no workflow will hold the slot (or the queue entry) this call took. (After any
            # other failure the write may have happened; a slot whose workflow never came is given back by a start
            # that needs it, an entry whose workflow never came is dropped by the queue's promoter.)
            if tenant is not None and self.tenants is not None:
                if workflow.queue_ticket is not None:
                    self.tenants.slots.dequeue(definition.name, tenant, workflow.queue_ticket)
                else:
                    self.tenants.slots.release(definition.name, tenant, workflow_id)
            raise
        self._settle_payloads(None, stored, transition)
        self.metrics("WorkflowsStarted")
        transition.emit_metrics()
        log_moves(None, stored)
        messages = transition.messages + self._run_children(stored, transition.children)
        return StartResult(stored, created=True, messages=messages, queue_position=position)

    def _take_tenant_slot(
        self,
        definition: WorkflowDefinition,
        tenant: str,
        workflow_id: str,
        now: int,
        request_hash: str,
        idempotency_key: str | None,
    ) -> StartResult | tuple[int, int] | None:
        """Take a slot of ``tenant`` for the workflow (`tenancy.TenantGate.take`): None when it holds one (go on).

        A start over its tenant's limit that repeats one already made (the same Idempotency-Key) gets that workflow
        (a `StartResult`). Otherwise, under ``over_limit: queue``, it gets a ticket in the tenant's queue (also when
        others wait there, slot free or not: they start first): (ticket, position); under ``refuse`` it is refused.
        """
        if self.tenants is None or definition.tenancy is None:
            raise ConfigurationError(
                f"definition {definition.name} limits its tenants, but this function has no tenant store"
            )
        queueing = definition.tenancy.over_limit == "queue"
        head = self.tenants.slots.head(definition.name, tenant) if queueing else None
        refused: TenantLimitError | None = None
        if head is None:
            try:
                self.tenants.take(definition, tenant, workflow_id, now)
                return None
            except TenantLimitError as error:
                refused = error
        existing = None if idempotency_key is None else self.store.load(workflow_id)  # a new id: none to find
        if existing is not None:
            return _repeated(existing, request_hash)
        if not queueing and refused is not None:
            raise refused
        ticket = self.tenants.slots.enqueue(definition.name, tenant, workflow_id, now, now + QUEUE_CHECK_SECONDS)
        # Its place from the head as it is now, its own entry written (concurrent starts each count the others)
        first = self.tenants.slots.head(definition.name, tenant)
        return ticket, _place(ticket, first)

    def queue_position(self, snapshot: Snapshot) -> int | None:
        """A QUEUED workflow's place in its tenant's queue now (1: it starts next; cancelled workflows ahead of it
        make it start sooner), from one read of the queue's head; None for any other workflow."""
        workflow = snapshot.workflow
        if workflow.status is not WorkflowStatus.QUEUED or workflow.queue_ticket is None or workflow.tenant is None:
            return None
        if self.tenants is None:
            return None
        first = self.tenants.slots.head(workflow.definition.name, workflow.tenant)
        return _place(workflow.queue_ticket, first)

    def _status_of(self, workflow_id: str) -> WorkflowStatus | None:
        # Strongly consistent: a stale read could show a running holder as not yet written, and free its slot.
        snapshot = self.store.load(workflow_id, consistent=True)
        return None if snapshot is None else snapshot.workflow.status

    def _give_back_tenant_slot(self, snapshot: Snapshot) -> list[Outgoing]:
        """Give back the tenant's slot the workflow holds once it has ended (``tenancy.py``); a repeat is harmless.
        A slot given back while the tenant's queue waits (whatever the ending workflow's own ``over_limit``: a
        version that refuses shares the slots of one that queues) starts the queue's head: its messages."""
        workflow = snapshot.workflow
        if workflow.tenant is None or workflow.status not in ENDED_RUN:
            return []
        if self.tenants is None:
            raise ConfigurationError(
                f"workflow {workflow.workflow_id} holds a slot of tenant {workflow.tenant}, but this function has no "
                "tenant store to give it back"
            )
        name = workflow.definition.name
        released = self.tenants.slots.release(name, workflow.tenant, workflow.workflow_id)
        if not released.queue_waiting:
            return []
        try:
            return self.promote(name, workflow.tenant)
        except Exception:  # its write is stored: the supervisor's look at the queue starts the head (tenancy.py)
            logger.exception("queue promotion failed", extra={"tenant": workflow.tenant, "definition": name})
            self.metrics("QueuePromotionsFailed")
            return []

    def promote(self, definition: str, tenant: str) -> list[Outgoing]:
        """Start the head of ``tenant``'s queue of ``definition`` while a slot is free: take the slot for it, move it
        ``QUEUED → RUNNING`` with its first dispatches by one conditional write, then delete its entry (each safe to
        repeat: a call that crashed midway is finished by the next). Returns the messages to send.

        An entry whose workflow does not exist is dropped once `HOLDER_GRACE_SECONDS` have passed (its start
        crashed before writing it), and waits before then (it may be written yet). An entry whose workflow is not
        QUEUED any more (started, or cancelled), or QUEUED under another ticket, is dropped; a slot taken for one
        that has ended goes back.
        """
        if self.tenants is None:
            raise ConfigurationError(f"a queue of tenant {tenant} is looked at, but this function has no tenant store")
        slots = self.tenants.slots
        messages: list[Outgoing] = []
        for _ in range(MAX_PROMOTIONS):
            head = slots.head(definition, tenant)
            if head is None:
                break
            now = epoch_seconds(self.clock)
            self.correlate(head.workflow_id)
            queued = self.store.load(head.workflow_id, consistent=True)
            if queued is None:
                if head.since > now - HOLDER_GRACE_SECONDS:
                    break  # its start may still write it: the supervisor looks again
                slots.dequeue(definition, tenant, head.ticket)
                continue
            workflow = queued.workflow
            if workflow.status is not WorkflowStatus.QUEUED or workflow.queue_ticket != head.ticket:
                # Started or cancelled already; or an entry of an earlier try of its start (a client's retry after
                # a crash between the entry and the workflow's write): the workflow waits under its own ticket.
                if workflow.status in ENDED_RUN:
                    slots.release(definition, tenant, workflow.workflow_id)  # a slot a promoter took for it
                slots.dequeue(definition, tenant, head.ticket)
                continue
            try:
                self.tenants.take(workflow.definition, tenant, workflow.workflow_id, now)
            except TenantLimitError:
                break  # every slot is held by a running workflow: the next give-back starts it
            transition = Transition(self.config, self.rng, self.metrics, queued, now, claims=self.claims)
            transition.dequeue()
            try:
                stored = self.store.save(self._keyed(queued, transition.snapshot, now), expect=queued)
            except ConditionFailedError:
                continue  # another call started (or a person cancelled) it since our read: read the head again
            self._settle_payloads(queued, stored, transition)
            transition.emit_metrics()
            log_moves(queued, stored)
            messages += transition.messages + self._run_children(stored, transition.children)
            if stored.workflow.status in ENDED_RUN:  # it ended in its first write (no step to run): its slot goes
                slots.release(definition, tenant, workflow.workflow_id)
            slots.dequeue(definition, tenant, head.ticket)
        return messages

    def check_queue(self, definition: str, tenant: str) -> list[Outgoing]:
        """The supervisor's look at a tenant's queue whose time has come (``tenancy.py``): start its heads while
        slots are free (freeing those of holders that ended without giving theirs back), then look again in
        `QUEUE_CHECK_SECONDS`, or take the queue out of the deadline index when it is empty. Returns the messages."""
        if self.tenants is None:
            raise ConfigurationError(f"a queue of tenant {tenant} is looked at, but this function has no tenant store")
        seen = self.tenants.slots.slots(definition, tenant).next_ticket
        messages = self.promote(definition, tenant)
        empty = self.tenants.slots.head(definition, tenant) is None
        due = None if empty else epoch_seconds(self.clock) + QUEUE_CHECK_SECONDS
        self.tenants.slots.queue_checked(definition, tenant, due, seen)
        return messages

    def workflow_id(self, owner: str, idempotency_key: str) -> str:
        """The id a start of ``owner`` with ``idempotency_key`` gets (`workflow_id_for`), known before it starts."""
        return workflow_id_for(owner, idempotency_key, self.id_secret)

    def check_agents(self, definition: WorkflowDefinition) -> None:
        """Refuse a definition that names an agent, or an action of one, this deployment does not have.

        Raises
        ------
        InvalidDefinitionError
            With every unknown agent, or every (step, agent.action) its agent does not accept (template ``AGENTS``).
        """
        agents = self.config.agents
        calls = definition.agent_calls()
        unknown = sorted({agent for _, agent, _ in calls} - set(agents))
        if unknown:
            raise InvalidDefinitionError(f"unknown agent(s) {unknown}; known agents: {sorted(agents)}")
        refused = [f"{step}: {agent}.{action}" for step, agent, action in calls if action not in agents[agent].actions]
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

        def apply_all(transition: Transition) -> None:
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
    def cancel(
        self,
        workflow_id: str,
        *,
        owner: str | None,
        principal: str | None = None,
        reason: str = "cancelled by request",
        action_id: str = "",
        batch: str | None = None,
    ) -> tuple[Snapshot, list[Outgoing]]:
        """Ask a running (or held) workflow to stop: it becomes CANCELLING and compensates what may have happened.

        ``owner`` is the calling client's principal: a workflow of another principal is not found. An operator
        passes ``owner=None`` and its own ``principal``. The cancel is audited in the history (who, why). A cancel
        of a workflow that is CANCELLING or CANCELLED already changes nothing and returns it as it is.

        Returns
        -------
        tuple[Snapshot, list[Outgoing]]
            The workflow as stored after the cancel, and the messages to send.

        Raises
        ------
        WorkflowNotFoundError
            When there is no such workflow, or it belongs to another principal.
        ConditionFailedError
            When the workflow is neither RUNNING nor HELD, nor cancelled already (the caller maps this to 409).
        """

        queued: list[bool] = [False]

        def cancel(transition: Transition) -> None:
            if owner is not None and transition.snapshot.workflow.owner != owner:
                raise WorkflowNotFoundError(workflow_id)
            queued[0] = transition.snapshot.workflow.status is WorkflowStatus.QUEUED
            transition.batch = batch
            transition.cancel(principal or owner or "operator", reason=reason, action_id=action_id)

        stored, messages = self._update(workflow_id, cancel)
        if stored is None:
            raise WorkflowNotFoundError(workflow_id)
        workflow = stored.workflow
        if queued[0] and workflow.tenant is not None and workflow.queue_ticket is not None and self.tenants is not None:
            # Cancelled while queued: its entry goes (if this crashes first, the queue's promoter drops it).
            self.tenants.slots.dequeue(workflow.definition.name, workflow.tenant, workflow.queue_ticket)
        return stored, messages

    # ------------------------------------------------------------------ callbacks
    def callback(
        self, token: str, request: CallbackRequest, *, owner: str | None, audit: dict[str, str] | None = None
    ) -> tuple[Snapshot, CallbackResult, list[Outgoing]]:
        """Apply a use of a callback step's task token: complete or fail its attempt, or a heartbeat.

        ``owner`` is the calling client's principal: a token of another principal's workflow is not found. None is an
        operator's answer (``POST /ops/callbacks/{token}``), for any workflow: ``audit`` (``action``, ``principal``,
        ``reason``, ``id``) is then written to the history as an operator action in the same write as the answer,
        once (the same answer again writes nothing). The use is applied with one conditional write like any
        transition; a refusal is confirmed by a consistent read.

        Returns
        -------
        tuple
            The workflow as stored, the `CallbackResult` of the step, and the messages to send.

        Raises
        ------
        CallbackNotFoundError
            A token this engine did not issue, or of another owner's workflow (HTTP 404).
        CallbackUsedError
            Its attempt was answered already with another answer (HTTP 409); the same answer again is the first
            result (``callbacks.answer_digest``).
        CallbackExpiredError
            Its attempt timed out, or the workflow no longer waits for it (HTTP 410).
        """
        parsed = parse_token(token)

        def use(transition: Transition) -> None:
            if owner is not None and transition.snapshot.workflow.owner != owner:
                raise CallbackNotFoundError("no such task token")
            transition.apply_callback(parsed, request, audit=audit)

        stored, messages = self._update(parsed.workflow_id, use)
        if stored is None:
            raise CallbackNotFoundError("no such task token")
        record = stored.steps[parsed.step]
        # An answer (first or repeated) is given the result of the write that applied it, kept on the step.
        answer = record.answer if request.status != "heartbeat" and record.attempt == parsed.attempt else None
        result = CallbackResult(
            workflow_id=parsed.workflow_id,
            step=parsed.step,
            attempt=parsed.attempt,
            step_status=answer["step_status"] if answer else record.status.value,
            workflow_status=answer["workflow_status"] if answer else stored.workflow.status.value,
            complete_by=record.complete_by,
        )
        return stored, result, messages

    # ------------------------------------------------------------------ operator actions
    def operate(
        self,
        workflow_id: str,
        action: str,
        *,
        principal: str,
        reason: str,
        action_id: str,
        step: str | None = None,
        step_input: dict[str, Any] | None = None,
        output: Any = NO_OUTPUT,
        batch: str | None = None,
    ) -> tuple[Snapshot, list[Outgoing]]:
        """Apply an operator action (``OPERATOR_ACTIONS``) with one conditional write, audited in the history.

        ``action_id`` makes the action idempotent: a repeat of an id the history holds changes nothing and returns
        the workflow as it is. ``step`` names the step of ``retry``, ``skip``, ``retry-compensation`` and
        ``resolve`` (needed when several could apply), ``step_input`` is a retry's edited input, ``output`` a skip's
        output (any JSON, null too; ``transitions.NO_OUTPUT`` when none is given). What each action does:
        ``transitions.operator``. ``batch``: the batch the action is part of (``batches.py``), kept in its history
        event.

        Returns
        -------
        tuple[Snapshot, list[Outgoing]]
            The workflow as stored after the action, and the messages to send.

        Raises
        ------
        ValueError
            When ``action`` is not one of ``OPERATOR_ACTIONS``.
        WorkflowNotFoundError
            When there is no such workflow.
        ConditionFailedError
            When the action does not apply to the workflow as it is (the message says why; the API's 409).
        OutputNeededError
            When a skip gives no output and a later step's reference needs it (the API's 422 MISSING_REFERENCE).
        """
        if action not in OPERATOR_ACTIONS:
            raise ValueError(f"unknown operator action {action!r}; one of {list(OPERATOR_ACTIONS)}")
        if action == "cancel":
            return self.cancel(
                workflow_id, owner=None, principal=principal, reason=reason, action_id=action_id, batch=batch
            )

        def apply(transition: Transition) -> None:
            transition.batch = batch
            who = (principal, reason, action_id)
            if action == "retry":
                transition.retry(*who, step=step, step_input=step_input)
            elif action == "skip":
                transition.skip(*who, step=step, output=output)
            elif action == "compensate":
                transition.compensate(*who)
            elif action == "retry-compensation":
                transition.retry_compensation(*who, step=step)
            elif action == "resolve":
                transition.resolve(*who, step=step)
            elif action == "pause":
                transition.pause(*who)
            else:
                transition.resume(*who)

        stored, messages = self._update(workflow_id, apply)
        if stored is None:
            raise WorkflowNotFoundError(workflow_id)
        logger.info(
            "operator action",
            extra={"workflow_id": workflow_id, "action": action, "principal": principal, "step": step, "batch": batch},
        )
        return stored, messages

    # ------------------------------------------------------------------ read, decide, write
    def _update(self, workflow_id: str, change: Callable[[Transition], None]) -> tuple[Snapshot | None, list[Outgoing]]:
        """Read the workflow, apply ``change`` to it in memory, and store the result with one conditional write.

        Returns the workflow as stored (None when there is no such workflow) and the messages to send.

        The first read is eventually consistent (half the read units of a strong one). That is safe because the
        write is conditional on the version read: a stale view can only lose its write, never commit. What a stale
        view must not do is acknowledge a message it decided needs nothing (a reply for an attempt it does not show
        yet would look stale and be dropped), so such a decision is confirmed from a strongly consistent read, as
        is every read after a lost write, and every refusal (an operator's resume refused as "not paused" by a view
        that does not show the pause yet would be wrong: a paused flag moves both ways).
        """
        self.correlate(workflow_id)
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
            transition = Transition(
                self.config,
                self.rng,
                self.metrics,
                base,
                epoch_seconds(self.clock),
                oversized=oversized,
                claims=self.claims,
            )
            try:
                change(transition)
            except ConditionFailedError:
                if not consistent:
                    # A refusal from a stale view is confirmed first: the latest write may allow the change (a
                    # resume of a workflow whose pause the stale view does not show yet).
                    consistent = True
                    continue
                raise
            if transition.snapshot is base:
                if not consistent:
                    consistent = True
                    continue
                self._settle_payloads(base, base, transition)  # a late claim-checked output of an ended workflow
                self._settle_retention(base, base)
                transition.emit_metrics()  # nothing to write (a stale or repeated message)
                return base, self._give_back_slot(base) + self._give_back_tenant_slot(base)
            try:
                stored = self.store.save(self._keyed(base, transition.snapshot, transition.now), expect=base)
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
            self._settle_payloads(base, stored, transition)
            self._settle_retention(base, stored)
            transition.emit_metrics()
            log_moves(base, stored)
            children = self._run_children(stored, transition.children)
            started = self._give_back_tenant_slot(stored)
            return stored, transition.messages + children + self._give_back_slot(stored) + started
        raise ContentionError(workflow_id, MAX_ATTEMPTS)

    def _give_back_slot(self, snapshot: Snapshot) -> list[Outgoing]:
        """Give back the trigger's slot the workflow holds once it has ended (``triggers.py``): the message that
        starts the tick waiting for it, if one waits. Conditional on it holding the slot; a repeat is harmless."""
        workflow = snapshot.workflow
        if workflow.trigger is None or not workflow.trigger.slot or workflow.status not in ENDED_RUN:
            return []
        if self.triggers is None:
            raise ConfigurationError(
                f"workflow {workflow.workflow_id} holds trigger {workflow.trigger.name}'s slot, but this function has "
                "no trigger store to give it back"
            )
        waiting = self.triggers.release(workflow.trigger.name, workflow.workflow_id)
        return [] if waiting is None else [waiting]

    # ------------------------------------------------------------------ map steps' children (transitions.mapping)
    def _run_children(self, parent: Snapshot, commands: Sequence[ChildCommand]) -> list[Outgoing]:
        """Carry out what the parent's stored write decided for its children; return the messages to send.

        Each command is safe to repeat (a child's start is a conditional create, a report is applied once), and one
        that fails is logged and left to the supervisor's check of the map step, as a crash here would be: the
        parent's write is stored, so its own messages must still go.
        """
        messages: list[Outgoing] = []
        for command in commands:
            try:
                if command.kind == "collect":
                    messages += self._collect(parent, command)
                elif command.kind == "unwind":
                    messages += self._unwind_child(parent, command)
                else:
                    messages += self._start_child(parent, command)
            except Exception:  # the supervisor's check of the map step does it again
                logger.exception(
                    "map step child command failed",
                    extra={"workflow_id": parent.workflow.workflow_id, "child": command.child_id, "kind": command.kind},
                )
                self.metrics("ChildCommandsFailed")
        return messages

    def _child_definition(self, parent: Snapshot, step: str) -> WorkflowDefinition:
        map_step = parent.workflow.definition.step(step)
        if not isinstance(map_step, MapStep):  # pragma: no cover - commands come only from map steps
            raise TypeError(f"step {step} is not a map step")
        return map_step.definition

    def _child_transition(self, parent: Snapshot, command: ChildCommand, now: int) -> Transition:
        """A child's first transition: its workflow record (its input claim-checked above the threshold, as a
        client's start input is) and its ``started`` event."""
        workflow_input = command.input or {}
        claimed: Any = workflow_input
        upload: Upload | None = None
        if self.claims is not None and workflow_input:
            # Pending until the child exists (then live, _settle_payloads): a start lost in between leaves nothing.
            claimed, upload = self.claims.prepare(
                command.child_id, workflow_input, what=f"the input of {command.child_id}"
            )
            if upload is not None:
                self.claims.upload([upload], state=PENDING)
        workflow = WorkflowRecord(
            workflow_id=command.child_id,
            status=WorkflowStatus.RUNNING,
            definition=self._child_definition(parent, command.parent.step),
            input=claimed,
            request_hash=canonical_hash({"parent": command.parent.doc(), "input": workflow_input}),
            created_at=now,
            updated_at=now,
            owner=parent.workflow.owner,
            parent=command.parent,
            claim_checked=claimed is not workflow_input,
        )
        transition = Transition(self.config, self.rng, self.metrics, Snapshot(workflow), now, claims=self.claims)
        transition.history.started()
        if upload is not None:
            transition.claimed.append(upload.key)
        return transition

    def _note_child_id_taken(self, parent: Snapshot, command: ChildCommand) -> None:
        """Log and count a map step's child id held by a workflow that is not that child (``is_child_of``)."""
        logger.warning(
            "map step child id taken by another workflow",
            extra={"workflow_id": parent.workflow.workflow_id, "child": command.child_id},
        )
        self.metrics("MapChildIdsTaken")

    def _start_child(self, parent: Snapshot, command: ChildCommand) -> list[Outgoing]:
        """Start child ``command.child_id`` unless it exists; report one that has ended (a ``check`` finds it)."""
        self.correlate(command.child_id)  # its lines name the child (the parent's write is logged already)
        existing = self.store.load(command.child_id, consistent=False) if command.kind == "check" else None
        if existing is None:
            now = epoch_seconds(self.clock)
            transition = self._child_transition(parent, command, now)
            transition.advance()  # a first step that cannot be prepared fails it: the child unwinds and reports
            try:
                stored = self.store.create(self._keyed(None, transition.snapshot, now))
            except ConditionFailedError:
                existing = self.store.load(command.child_id)
                self._reclaim_input(existing, transition.claimed)
            else:
                self._settle_payloads(None, stored, transition)
                transition.emit_metrics()
                log_moves(None, stored)
                return transition.messages
        if existing is not None and not is_child_of(existing, command):
            self._note_child_id_taken(parent, command)
            return [child_id_taken(self.config.response_queue_url, command)]
        if existing is not None and existing.workflow.status in TERMINAL_WORKFLOW:
            return [child_report(self.config.response_queue_url, command.parent, existing.workflow.status.value)]
        return []

    def _unwind_child(self, parent: Snapshot, command: ChildCommand) -> list[Outgoing]:
        """Unwind one child of an unwinding map step; report it at once when there is nothing left to do."""
        child = self.store.load(command.child_id)
        if child is None:
            if command.reported:
                # It reported its end, so it existed, and it is gone: its retention (TTL) passed. Nothing can undo
                # what it did any more: the map step's compensation fails for a person to look at.
                return [child_report(self.config.response_queue_url, command.parent, "COMPENSATION_FAILED")]
            # Never started (its start was decided, then lost): store it CANCELLED, so no late start can run it.
            now = epoch_seconds(self.clock)
            transition = self._child_transition(parent, command, now)
            transition.history.parent_unwound()
            for name in transition.definition.order:
                transition.set_step(StepRecord(step=name, status=StepStatus.SKIPPED))
            transition.set_status(WorkflowStatus.CANCELLED, reason="its parent unwound before it started")
            try:
                stored = self.store.create(transition.snapshot)
            except ConditionFailedError:
                self._reclaim_input(self.store.load(command.child_id), transition.claimed)
                return self._unwind_child(parent, command)  # it started meanwhile: unwind it as it is
            self._settle_payloads(None, stored, transition)  # its input, if claim-checked, is its own now
            return transition.messages
        if not is_child_of(child, command):
            # Another workflow holds the id, so no child of ours ever ran under it (a start is a conditional create),
            # unless ours reported and is gone: the stranger is never cancelled or compensated by this parent.
            self._note_child_id_taken(parent, command)
            status = WorkflowStatus.COMPENSATION_FAILED if command.reported else WorkflowStatus.CANCELLED
            return [child_report(self.config.response_queue_url, command.parent, status.value)]
        if child.workflow.status in TERMINAL_WORKFLOW and child.workflow.status is not WorkflowStatus.COMPLETED:
            return [child_report(self.config.response_queue_url, command.parent, child.workflow.status.value)]
        _, messages = self._update(command.child_id, lambda transition: transition.unwind_by_parent())
        return messages

    def _collect(self, parent: Snapshot, command: ChildCommand) -> list[Outgoing]:
        """Read the children's outputs (BatchGetItem) and complete the map step with them."""
        name, attempt = command.parent.step, command.parent.attempt
        record = parent.steps.get(name)
        if record is None or record.map is None:  # pragma: no cover - a collect comes from a map step in flight
            return []
        workflow_id = parent.workflow.workflow_id
        step_index = parent.workflow.definition.order.index(name)
        ids = [child_id(workflow_id, step_index, index) for index in range(record.map.total)]
        children = self.store.load_many(ids)
        results = [child_output(children.get(i)) for i in ids]
        _, messages = self._update(workflow_id, lambda transition: transition.complete_map(name, attempt, results))
        return messages

    def _settle_payloads(self, base: Snapshot | None, stored: Snapshot, transition: Transition) -> None:
        """After a write: write the claim-checked inputs of its requests (before they are sent: Rule 1), and set
        the retention of the workflow's objects when the write ended it or took it out of its end.

        An upload that fails raises: the requests are not sent, and the supervisor resends their steps after
        complete-by (rendered and written again). A re-stamp of the whole workflow that fails is logged and counted
        (``ClaimCheckRestampFailures``): the objects then stay live, never deleted early. A crash between the write
        and the re-stamp leaves the message that ended the workflow undeleted: it comes again, finds nothing to
        write, and re-stamps them.

        The objects written ``pending`` that the write made the workflow's (``Transition.claimed``) are re-stamped
        to its retention, and a failure raises: the message comes again and re-stamps them, where a pending object
        left under a running workflow would expire under it. The first write after a create re-stamps the input
        again, for a create whose re-stamp was lost.
        """
        claims = self.claims
        if claims is None:
            return
        claims.upload(transition.uploads)
        workflow_id = stored.workflow.workflow_id
        was_terminal = base is not None and base.workflow.status in TERMINAL_WORKFLOW
        is_terminal = stored.workflow.status in TERMINAL_WORKFLOW
        state = retention_state(stored)
        settled = False
        try:
            if was_terminal != is_terminal and uses_claim_check(stored) and (state == TERMINAL or was_terminal):
                claims.settle(workflow_id, state)
                settled = True
            elif state == TERMINAL and was_terminal and uses_claim_check(stored):
                # A message of an ended workflow came again (nothing to write, or a late event of its own): the
                # invocation that ended it may have crashed after its write and before the re-stamp, which is why
                # the message came back. Re-stamping is idempotent, so do it again (found by the simulation: an
                # object left live for ever).
                claims.settle(workflow_id, TERMINAL)
                settled = True
        except Exception:  # the write is stored: a failed re-stamp only keeps objects longer
            logger.exception("claim-checked objects not re-stamped", extra={"workflow_id": workflow_id})
            self.metrics("ClaimCheckRestampFailures")
        if settled:
            return
        keys = list(transition.claimed)
        input_key = reference_key(stored.workflow.input)
        if base is not None and base is not stored and base.version == 1 and input_key is not None:
            keys.append(input_key)
        for key in dict.fromkeys(keys):
            try:
                claims.store.restamp(key, state)
            except ClaimCheckMissingError:
                continue  # gone (a pending object a day old): a read of it fails its step with the reason
            self.metrics("ClaimCheckRestamps")

    def _reclaim_input(self, existing: Snapshot | None, written: Sequence[str]) -> None:
        """After a create that found its workflow stored already (a repeated start, a child started meanwhile): the
        repeat's PUT of the same input (same key: its hash) tagged the existing workflow's own object ``pending``,
        so give it back that workflow's retention. An object the existing workflow does not name stays pending and
        expires (an input the other workflow never held).

        Raises ``ClaimCheckMissingError`` only if the object vanished since the PUT (never in practice).
        """
        if self.claims is None or existing is None:
            return
        input_key = reference_key(existing.workflow.input)
        if input_key is not None and input_key in written:
            self.claims.store.restamp(input_key, retention_state(existing))

    def _settle_retention(self, base: Snapshot, stored: Snapshot) -> None:
        """After a write: start the retention of a map step's children when their parent ended, and stop it when an
        operator takes the parent out of its end.

        A child is compensated by its parent's unwind, which an operator may start while the parent is HELD (or
        resume from COMPENSATION_FAILED), so an ended child has no TTL, and its objects stay live, until its parent
        ends; then it gets the parent's ``expires_at`` and its objects are re-stamped terminal, so both go with the
        parent. A child that ends after its parent (or once the parent is gone) takes its retention at once.

        Raises (the write is stored) when the retention of an ended workflow's children could not be set, as a crash
        would: the message then comes again, and this call on the ended workflow sets it. The ending write sends
        nothing that matters (an ended workflow dispatches nothing; a child's report to an ended parent is dropped).
        Until then the children are kept longer, never expired early. When an operator takes the parent out of its
        end, a failure is logged and counted instead (``ChildRetentionFailures``): that write's requests must go,
        and the parent's unwind takes each child it reaches out of its end anyway.
        """
        workflow = stored.workflow
        is_terminal = workflow.status in TERMINAL_WORKFLOW
        was_terminal = base.workflow.status in TERMINAL_WORKFLOW
        # Any call on a workflow that had ended already (a message that comes again, with or without a write of its
        # own: a late reply is recorded) does it again: the call that ended it may have failed before this point.
        if workflow.parent is not None:
            if is_terminal and workflow.expires_at is None:
                parent = self.store.load(workflow.parent.workflow_id)
                if parent is None or parent.workflow.status in TERMINAL_WORKFLOW:
                    now = epoch_seconds(self.clock)
                    expires_at = now + self.config.terminal_retention_days * 86_400
                    if parent is not None and parent.workflow.expires_at is not None:
                        expires_at = parent.workflow.expires_at
                    self._retain_child(stored, expires_at, force=True)
        elif is_terminal:
            self._retain_children(stored, workflow.expires_at, force=was_terminal)
        elif was_terminal:
            try:
                self._retain_children(stored, None, force=False)
            except Exception:  # the write is stored and its requests must go; the unwind reaches the children
                logger.exception(
                    "map step children's retention not lifted", extra={"workflow_id": workflow.workflow_id}
                )
                self.metrics("ChildRetentionFailures")

    def _retain_children(self, parent: Snapshot, expires_at: int | None, *, force: bool) -> None:
        """Give every ended child of ``parent``'s map steps ``expires_at`` (None: kept) and re-stamp its objects.

        One BatchGetItem per 100 children, then one conditional write per child whose TTL changes (a child that has
        not ended is left alone: it takes its retention when it ends). ``force`` re-stamps the objects of children
        whose TTL is already right (a repeat after a crash between the two).
        """
        definition = parent.workflow.definition
        ids = [
            child_id(parent.workflow.workflow_id, definition.order.index(step.name), index)
            for step in definition.steps
            if isinstance(step, MapStep)
            for record in [parent.steps.get(step.name)]
            if record is not None and record.map is not None
            for index in range(record.map.launched)
        ]
        if not ids:
            return
        parent_id = parent.workflow.workflow_id
        for child in self.store.load_many(ids).values():
            ref = child.workflow.parent
            if ref is not None and ref.workflow_id == parent_id:  # never a stranger holding a child's id
                self._retain_child(child, expires_at, force=force)

    def _retain_child(self, child: Snapshot, expires_at: int | None, *, force: bool) -> None:
        """Store ``expires_at`` on ended child ``child`` (a conditional write; a lost race reads it again) and
        re-stamp its objects to match, when it changed or ``force``."""
        workflow_id = child.workflow.workflow_id
        changed = False
        current: Snapshot | None = child
        for _ in range(MAX_ATTEMPTS):
            if current is None or current.workflow.status not in TERMINAL_WORKFLOW:
                return
            now = epoch_seconds(self.clock)
            transition = Transition(self.config, self.rng, self.metrics, current, now, claims=self.claims)
            transition.retain(expires_at)
            if transition.snapshot is current:
                break
            try:
                current = self.store.save(self._keyed(current, transition.snapshot, now), expect=current)
            except ConditionFailedError:
                current = self.store.load(workflow_id)
                continue
            changed = True
            self.metrics("ChildRetentionsSet")
            break
        else:
            raise ContentionError(workflow_id, MAX_ATTEMPTS)
        if self.claims is not None and (changed or force) and current is not None and uses_claim_check(current):
            self.claims.settle(workflow_id, TERMINAL if expires_at is not None else LIVE)

    def _keyed(self, base: Snapshot | None, snapshot: Snapshot, now: int) -> Snapshot:
        """``snapshot`` with the deadline-index key its write stores (``records.index_key_for``): no later than
        its earliest complete-by, nor than the time a long wait's timer is due (``Snapshot.due_key``)."""
        previous = base.stored_key if base is not None else None
        grace = self.config.deadline_grace_seconds
        return snapshot.with_index_key(index_key_for(previous, snapshot.due_key(grace), now, grace))


def _place(ticket: int, head: QueueEntry | None) -> int:
    """The place of ``ticket`` in a queue whose head is ``head`` (1: next)."""
    return ticket - head.ticket + 1 if head is not None and head.ticket <= ticket else 1


def _repeated(existing: Snapshot, request_hash: str) -> StartResult:
    """A start whose workflow exists (its Idempotency-Key was used): that workflow, if the body is the same.

    Raises
    ------
    IdempotencyKeyConflictError
        When the key was used with a different request body.
    """
    if existing.workflow.request_hash != request_hash:
        raise IdempotencyKeyConflictError("Idempotency-Key was already used with a different request body") from None
    return StartResult(existing, created=False)


def retention_state(snapshot: Snapshot) -> str:
    """The retention tag ``snapshot``'s objects should carry: ``terminal`` once it has its TTL, else ``live``."""
    workflow = snapshot.workflow
    return TERMINAL if workflow.status in TERMINAL_WORKFLOW and workflow.expires_at is not None else LIVE


def is_child_of(snapshot: Snapshot, command: ChildCommand) -> bool:
    """Whether ``snapshot`` is the child ``command`` names: started by the same map step of the same workflow for
    the same item (any attempt of the step: an operator's retry of it finds the children started before)."""
    parent, ref = snapshot.workflow.parent, command.parent
    return parent is not None and (parent.workflow_id, parent.step, parent.index) == (
        ref.workflow_id,
        ref.step,
        ref.index,
    )


def child_id_taken(queue_url: str, command: ChildCommand) -> Outgoing:
    """The report that fails ``command``'s map step: its child's id is held by a workflow that is not that child
    (``MAP_CHILD_ID_TAKEN``), so the child can never start and the step would wait for it for ever."""
    ref = command.parent
    report = StepReply(
        workflow_id=ref.workflow_id,
        step=ref.step,
        phase=Phase.ACTION,
        attempt=ref.attempt,
        outcome=Outcome.REJECTED,
        child=ref.index,
        error=StepError(
            code=MAP_CHILD_ID_TAKEN,
            message=f"child {ref.index} cannot start: its id {command.child_id} is held by a workflow that is not "
            "this map step's child",
        ),
    )
    return Outgoing(queue_url=queue_url, body=encode(report), workflow_id=report.workflow_id)


def child_output(child: Snapshot | None) -> Any:
    """A map step child's output: the output of its last step that no other step depends on (None unless
    COMPLETED)."""
    if child is None or child.workflow.status is not WorkflowStatus.COMPLETED:
        return None
    last = child.workflow.definition.leaves()[-1]
    record = child.steps.get(last)
    return record.output if record is not None else None


def log_moves(before: Snapshot | None, after: Snapshot) -> None:
    """Write one INFO line for a stored write: the steps it moved and, when it moved, the workflow.

    The line is ``message`` ``moved`` (its correlation id is the workflow's id: every call names the workflow it
    works on first, ``correlate``, so the id is not written twice); ``steps``, each step that moved as
    ``name#attempt FROM>TO`` (the attempt of its phase: a compensation counts its own), comma-separated in the
    definition's order; and ``from``, ``to`` (and ``reason``) when the workflow's status changed. Never a request
    body, an input or an output. One line per write, not per move: CloudWatch Logs bills ingestion by the byte,
    and the in-item history holds every event with its time. The COMPENSATION_FAILED alarm's workflows are found by
    the Logs Insights query in docs/operate.md (``to = "COMPENSATION_FAILED"``). The line of a workflow's end also
    has ``definition`` and ``cost`` (dollars, three significant digits): the WorkflowCost metric (docs/cost.md).
    """
    if not logger.isEnabledFor(logging.INFO):
        return
    moves = []
    for name, record in after.steps.items():
        previous = before.steps.get(name) if before is not None else None
        old = previous.status.value if previous is not None else "PENDING"
        attempt = record.attempt_for(record.phase)
        if old != record.status.value or (previous is not None and previous.attempt_for(record.phase) != attempt):
            moves.append(f"{name}#{attempt} {old}>{record.status.value}")
    extra: dict[str, Any] = {}
    if moves:
        extra["steps"] = ", ".join(moves)
    old_status = before.workflow.status.value if before is not None else "NEW"
    if old_status != after.workflow.status.value:
        extra["from"] = old_status
        extra["to"] = after.workflow.status.value
        if after.workflow.reason:
            extra["reason"] = after.workflow.reason
        if after.workflow.status in TERMINAL_WORKFLOW and after.cost:
            # what the workflow cost (sasflow.cost), in dollars, on the line of its end: the template's metric
            # filters make it the WorkflowCost metric, by definition (p50, p95; the optional cost alarm)
            extra["definition"] = after.workflow.definition.name
            extra["cost"] = float(f"{after.cost.dollars():.3g}")
    if extra:
        logger.info("moved", extra=extra)
