"""Store records: what the state store holds for a workflow and its steps.

A workflow and all its steps are one record, a `Snapshot`, stored as one DynamoDB item and written as a whole with
one conditional write per transition (``adapters.dynamodb_store`` converts it to and from the item explicitly). The
``version`` of a snapshot is the store's optimistic-concurrency token: it grows by one with every write, so a write
conditioned on it loses against any concurrent change of the same workflow (DESIGN Rule 2). API and queue models
live elsewhere.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field, replace
from typing import Any

from .cost import Tally
from .definition import WorkflowDefinition, render
from .fanout import MapProgress, ParentRef
from .states import (
    IN_FLIGHT_STEP,
    NEEDS_A_PERSON,
    OPERATOR_WORKFLOW_TRANSITIONS,
    TERMINAL_WORKFLOW,
    Phase,
    StepStatus,
    WorkflowStatus,
    check_step_move,
    check_workflow_move,
)


@dataclass(frozen=True)
class TriggerRef:
    """What started a workflow besides ``POST /workflows``: a trigger of triggers.yaml and its occurrence
    (``tick 2026-12-04T10:00:00Z``), from which the start's Idempotency-Key derives (``triggers.py``), and whether
    the run holds the trigger's slot (``overlap: skip`` or ``buffer_one``), which its end gives back."""

    name: str
    occurrence: str
    slot: bool = False

    def doc(self) -> dict[str, Any]:
        """The stored form."""
        return {"n": self.name, "o": self.occurrence, **({"s": True} if self.slot else {})}

    @classmethod
    def from_doc(cls, doc: dict[str, Any] | None) -> TriggerRef | None:
        """Read the stored form back (None stays None)."""
        if doc is None:
            return None
        return cls(name=str(doc["n"]), occurrence=str(doc["o"]), slot=bool(doc.get("s", False)))


@dataclass(frozen=True)
class WorkflowRecord:
    """One workflow, without its steps.

    Attributes
    ----------
    workflow_id, status, definition, input:
        Identity, status, the validated definition and the workflow input (a JSON object).
    request_hash:
        SHA-256 (hex) of the canonical start request; compares repeated starts with one Idempotency-Key (stored as
        its 32 bytes).
    idempotency_key:
        The client's Idempotency-Key header, if any.
    created_at, updated_at:
        Epoch seconds; ``updated_at`` is the time of the last transition.
    reason:
        Why the workflow is unwinding (failed step and error), or null.
    expires_at:
        Once terminal: when DynamoDB's TTL may delete the workflow (epoch seconds). A map step's child gets its
        parent's, once the parent has ended: never while its parent may still compensate it.
    owner:
        The principal that started it (``identity.principal_of``); only it, and operators, may see or change it.
    paused:
        An operator paused it: no new dispatches until resumed (replies and timeouts of steps in flight still count).
    hold_until:
        While HELD under a hold timeout: when the supervisor compensates it (epoch seconds); None holds forever.
    attention, attention_since:
        Whether it waits for a person (``HELD``, ``COMPENSATION_FAILED``, ``PAUSED``), and since when (epoch
        seconds): the keys of the sparse attention index, so those workflows are listed at any table size.
    parent:
        For a child of a map step: its parent (``fanout.ParentRef``), which it reports to when it ends.
    claim_checked:
        Some payload of it was written to the payload store (``claim_check.py``): its objects are re-stamped when
        it ends, so their retention starts then. A reference in its input or outputs says so too.
    trigger:
        The trigger and occurrence that started it (``triggers.py``); None for a start through the API.
    tenant:
        The tenant whose slot it holds when its definition limits its tenants (``tenancy.py``): given back when it
        ends; None otherwise.
    queue_ticket:
        Its ticket in its tenant's queue when it was started QUEUED (``over_limit: queue``): the queue starts its
        workflows in ticket order. Kept after it starts; None for a workflow that never queued.
    priority:
        The priority it was started with, 1 (served first) to 5; None: the default (``messages.DEFAULT_PRIORITY``).
    """

    workflow_id: str
    status: WorkflowStatus
    definition: WorkflowDefinition
    input: dict[str, Any]
    request_hash: str
    created_at: int
    updated_at: int
    idempotency_key: str | None = None
    reason: str | None = None
    expires_at: int | None = None
    owner: str | None = None
    paused: bool = False
    hold_until: int | None = None
    attention: str | None = None
    attention_since: int | None = None
    parent: ParentRef | None = None
    claim_checked: bool = False
    trigger: TriggerRef | None = None
    tenant: str | None = None
    queue_ticket: int | None = None
    priority: int | None = None

    @property
    def needs_attention(self) -> str | None:
        """What makes this workflow wait for a person now: PAUSED (a person paused it, HELD or not: it waits for their
        resume first), or its status (HELD, COMPENSATION_FAILED)."""
        if self.paused and self.status not in TERMINAL_WORKFLOW:
            return "PAUSED"
        if self.status in NEEDS_A_PERSON:
            return self.status.value
        return None

    def evolve(self, **changes: Any) -> WorkflowRecord:
        """Return a copy with ``changes`` applied."""
        return replace(self, **changes)


@dataclass(frozen=True)
class StepRecord:
    """The state of one step of one workflow.

    ``attempt`` counts dispatches of the forward action and ``comp_attempt`` those of its compensation.
    ``complete_by`` (epoch seconds) is set exactly while the step is in flight (PROCESSING or COMPENSATING).
    ``may_have_happened`` is true once an attempt may have reached the service without a definitive answer
    (timeouts, transient errors, a probe of a half-open circuit that failed), so the step must be compensated if the
    workflow unwinds (Rule 6). ``deferrals`` and ``comp_deferrals`` count the dispatches an open circuit deferred
    without using an attempt, of the action and of its compensation; ``limit_deferrals`` those the agent's
    call limits deferred, of the action and of its compensation (a busy service: they count in no budget, and not as
    trouble). ``error`` is the
    action's last error, ``comp_error`` the compensation's. The times of a step are in the workflow's history. A step
    with no record is PENDING.

    ``comp_since`` (epoch seconds) is when the compensation's first attempt was dispatched: its policy's time
    budget (``CompensationRetryPolicy.budget_minutes``) counts from there.

    An operator's retry gives the step a new budget of attempts (``attempt_base``: the attempts before it do not
    count; ``comp_attempt_base`` and a new ``comp_since`` likewise for a retried compensation), may give it an
    edited input (``input_override``), and, when nothing can have happened under the old token (a refusal), a new token
    (``generation``, `token_action`).

    A callback step's attempt in flight keeps ``callback_nonce``: the secret part of its task token
    (``callbacks.task_token``), new with every attempt. Once an answer (success or failure) is applied, the step keeps
    ``answer``: its digest and the result it was given (``callbacks.answer_digest``), so that the same answer again
    (a caller whose response was lost) is 200 with that result, and another answer 409.

    A wait step longer than SQS's longest delay keeps ``timer_at`` (epoch seconds) until its timer is sent: the time
    (complete-by - 900 s) from which a delayed message can reach it at its resume time. The supervisor sends it
    then (``Snapshot.due_key`` keys the workflow early enough), so a long wait resumes on time as a short one does.

    A map step keeps its progress over its children: ``map`` forward, ``comp_map`` while they unwind
    (``fanout.MapProgress``).
    """

    step: str
    status: StepStatus
    attempt: int = 0
    comp_attempt: int = 0
    complete_by: int | None = None
    output: Any = None
    error: dict[str, Any] | None = None
    may_have_happened: bool = False
    resends: int = 0
    deferrals: int = 0
    limit_deferrals: int = 0
    comp_output: Any = None
    comp_deferrals: int = 0
    comp_error: dict[str, Any] | None = None
    attempt_base: int = 0
    comp_attempt_base: int = 0
    comp_since: int | None = None
    generation: int = 0
    input_override: dict[str, Any] | None = None
    callback_nonce: str | None = None
    answer: dict[str, str] | None = None
    timer_at: int | None = None
    map: MapProgress | None = None
    comp_map: MapProgress | None = None

    @property
    def attempts_used(self) -> int:
        """Attempts of the action that count against its retry policy (those since the last operator retry)."""
        return self.attempt - self.attempt_base

    @property
    def comp_attempts_used(self) -> int:
        """Attempts of the compensation that count against its retry policy."""
        return self.comp_attempt - self.comp_attempt_base

    def token_action(self, action: str) -> str:
        """The action name the remote token is derived from: the action itself, or ``action#<generation>``."""
        return action if self.generation == 0 else f"{action}#{self.generation}"

    @property
    def in_flight(self) -> bool:
        """True while the forward action or the compensation is in flight."""
        return self.status in IN_FLIGHT_STEP

    @property
    def phase(self) -> Phase:
        """The phase of the step's current or last attempt."""
        if self.status in (StepStatus.COMPENSATING, StepStatus.COMPENSATED, StepStatus.COMPENSATION_FAILED):
            return Phase.COMPENSATION
        return Phase.ACTION

    def attempt_for(self, phase: Phase) -> int:
        """Return the attempt counter of ``phase``."""
        return self.comp_attempt if phase is Phase.COMPENSATION else self.attempt

    def evolve(self, **changes: Any) -> StepRecord:
        """Return a copy with ``changes`` applied."""
        return replace(self, **changes)


@dataclass(frozen=True)
class Snapshot:
    """A workflow and all its steps, read and written together (one item).

    ``version`` is 0 for a snapshot that has not been stored yet, then 1, 2, ... with every write. ``history`` holds
    the workflow's events, oldest first, encoded by ``history.HistoryWriter``: the events of a write are stored by
    that same write.
    """

    workflow: WorkflowRecord
    steps: dict[str, StepRecord] = field(default_factory=dict)
    version: int = 0
    history: tuple[str, ...] = ()
    #: The key the workflow is stored under in the deadline index (epoch seconds), when it differs from
    #: ``deadline``: a lower bound kept from an earlier write (see `index_key_for`). None: the key is ``deadline``.
    index_key: int | None = None
    #: What the workflow's work has cost so far, as stored (`sasflow.cost`): the state store adds to it with every
    #: write; transitions never change it.
    cost: Tally = field(default_factory=Tally)

    def with_step(self, record: StepRecord) -> Snapshot:
        """Return a snapshot where ``record`` replaces the step of the same name."""
        return replace(self, steps={**self.steps, record.step: record})

    def with_workflow(self, workflow: WorkflowRecord) -> Snapshot:
        """Return a snapshot with ``workflow`` replaced."""
        return replace(self, workflow=workflow)

    def operator_action(self, action_id: str) -> dict[str, Any] | None:
        """What the history says of the operator action with Idempotency-Key ``action_id``, or None: none has it."""
        from .history import decode

        steps = [s.name for s in self.workflow.definition.steps]
        for event in decode(self.history, self.workflow.created_at, steps):
            if event.kind == "operator_action" and (event.detail or {}).get("id") == action_id:
                return event.detail
        return None

    def with_events(self, lines: list[str]) -> Snapshot:
        """Return a snapshot with the history ``lines`` appended."""
        return replace(self, history=self.history + tuple(lines)) if lines else self

    def stored_as(self, version: int) -> Snapshot:
        """Return this snapshot as stored at ``version``."""
        return replace(self, version=version)

    def with_index_key(self, key: int | None) -> Snapshot:
        """Return this snapshot keyed ``key`` in the deadline index (None: keyed at its ``deadline``)."""
        return replace(self, index_key=None if key == self.deadline else key)

    @property
    def stored_key(self) -> int | None:
        """The workflow's key in the deadline index as stored: ``index_key`` when set, else ``deadline``."""
        deadline = self.deadline
        if deadline is None:
            return None
        return self.index_key if self.index_key is not None else deadline

    def due_key(self, grace: int) -> int | None:
        """The latest deadline-index key this workflow may have (epoch seconds), or None when it is not indexed.

        The earliest complete-by in flight (`deadline`), or earlier when a long wait's timer is still to be sent:
        ``timer_at - grace``, so the sweep (which reads ``key < now - grace``) finds the workflow as soon as
        ``now > timer_at`` and sends the timer for the rest of the wait (``TransitionBase.handle_overdue``).
        """
        deadline = self.deadline
        if deadline is None:
            return None
        timers = [r.timer_at for r in self.steps.values() if r.in_flight and r.timer_at is not None]
        return min([deadline, *(at - grace for at in timers)])

    def status_of(self, step: str) -> StepStatus:
        """Return the status of ``step``; a step with no record is PENDING."""
        record = self.steps.get(step)
        return record.status if record else StepStatus.PENDING

    @property
    def error_codes(self) -> tuple[str, ...]:
        """The codes of its steps' last errors (action and compensation), sorted, each once: what ``/ops/workflows``
        finds by ``error_code``."""
        codes = set()
        for record in self.steps.values():
            for error in (record.error, record.comp_error):
                if isinstance(error, dict) and isinstance(error.get("code"), str):
                    codes.add(error["code"])
        return tuple(sorted(codes))

    @property
    def error_steps(self) -> tuple[str, ...]:
        """The steps whose last attempt (action or compensation) failed and that have not run again since, sorted:
        what ``/ops/workflows`` finds by ``step`` (the step a person would act on)."""
        return tuple(
            sorted(
                name
                for name, record in self.steps.items()
                if any(isinstance(error, dict) for error in (record.error, record.comp_error))
            )
        )

    @property
    def trouble(self) -> int:
        """Resends and deferrals of all its steps: how stuck it looks (``/ops/overdue`` lists those above a bar)."""
        return sum(r.resends + r.deferrals + r.comp_deferrals for r in self.steps.values())

    @property
    def deadline(self) -> int | None:
        """The workflow's key in the sparse deadline index (epoch seconds), or None when it is not in the index.

        It is the earliest complete-by among the steps in flight, so the entry is overdue exactly when one of
        them is (DESIGN Rule 3). A workflow that is not terminal but has nothing in flight cannot make progress
        by itself (no reply will come): it is indexed at its last update, so the supervisor advances it once the
        grace has passed. A terminal workflow is not in the index.
        """
        if self.workflow.status in TERMINAL_WORKFLOW or self.workflow.status is WorkflowStatus.QUEUED:
            return None  # a queued workflow has no deadline: its tenant's queue is supervised (tenancy.py)
        in_flight = [r.complete_by for r in self.steps.values() if r.in_flight and r.complete_by is not None]
        if in_flight:
            return min(in_flight)
        if self.workflow.status is WorkflowStatus.HELD:
            return self.workflow.hold_until  # waits for a person: supervised only under a hold timeout
        if self.workflow.paused:
            return None  # nothing moves until a person resumes it
        return self.workflow.updated_at

    def context(self) -> dict[str, Any]:
        """The JMESPath context of step inputs: ``{"input": ..., "steps": {name: {"output": ...}}}``."""
        return {
            "input": self.workflow.input,
            "steps": {name: {"output": r.output} for name, r in self.steps.items() if r.output is not None},
        }

    def input_of(self, step: str) -> dict[str, Any]:
        """The rendered input of ``step``.

        Rendering is deterministic: a step's references may only name its dependencies, which are COMPLETED before
        it is dispatched and whose outputs never change afterwards. So the input is rendered again whenever it is
        needed (a resend, a compensation's ``step.input``) instead of being stored with every write.
        """
        record = self.steps.get(step)
        if record is not None and record.input_override is not None:
            return record.input_override  # an operator's edited input, given with a retry
        return render(self.workflow.definition.step(step).input, self.context(), where=f"steps[{step}].input")


@dataclass(frozen=True)
class DeadlineEntry:
    """An entry of the deadline index: a workflow and its key, the earliest complete-by in flight (epoch seconds).

    The index is eventually consistent, so the supervisor re-reads the workflow before acting on it.
    """

    workflow_id: str
    complete_by: int


def deadline_shard(workflow_id: str, shards: int) -> str:
    """Return the deadline-index partition (two digits) of a workflow.

    A stable hash spreads the in-flight workflows over ``shards`` partitions so no partition is hot (DESIGN Rule 3).
    """
    return f"{zlib.crc32(workflow_id.encode()) % shards:02d}"


def index_key_for(previous: int | None, deadline: int | None, now: int, grace: int) -> int | None:
    """The deadline-index key a write stores: the earliest complete-by, or a lower bound of it already stored.

    DESIGN Rule 3 keys a workflow *no later than* its earliest complete-by. Moving the key costs two index writes
    (a delete and a put), and a chain moves it at every dispatch although its steps finish long before any
    complete-by. So a key already stored is kept while it is still a lower bound (``previous <= deadline``) and not
    yet overdue (``now <= previous + grace``); otherwise the key is the earliest complete-by. A kept key that later
    falls overdue brings the supervisor early: it finds nothing overdue and stores the true key (`Snapshot.stored_key`
    is then refreshed by ``TransitionBase.handle_overdue``), one read and one write per such window, where moving the
    key at each dispatch costs two index writes every time.

    Parameters
    ----------
    previous:
        The key stored now (None: not in the index).
    deadline:
        The earliest complete-by of what the write leaves in flight (``Snapshot.deadline``; None: leaves the index).
    now, grace:
        The write's time and the deadline grace (epoch seconds, seconds).
    """
    if deadline is None:
        return None
    if previous is not None and previous <= deadline and now <= previous + grace:
        return previous
    return deadline


def check_deadlines(snapshot: Snapshot) -> None:
    """Raise unless every complete-by of ``snapshot`` (its steps' and its index key) is an int of epoch seconds.

    DESIGN Rule 3: complete-by is an integer of epoch seconds, a DynamoDB Number. DynamoDB rejects another type for
    an index key attribute (moto does not), and milliseconds would put an entry far in the future, so both stores
    check before they write.

    Raises
    ------
    TypeError
        When a complete-by is not an int (a bool is not one).
    ValueError
        When a complete-by looks like milliseconds (over 10,000,000,000), or the index key is later than the
        earliest complete-by.
    """
    values = [(f"complete_by of {r.step}", r.complete_by) for r in snapshot.steps.values() if r.complete_by is not None]
    deadline = snapshot.stored_key
    if deadline is not None:
        values.append(("complete_by", deadline))
        if snapshot.deadline is not None and deadline > snapshot.deadline:
            # A key later than the earliest complete-by would let the supervisor miss an overdue step (Rule 3).
            raise ValueError(f"index key {deadline} is later than the earliest complete-by {snapshot.deadline}")
    for what, value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{what} must be int epoch seconds, got {type(value).__name__}")
        if value > 10_000_000_000:
            raise ValueError(f"{what} looks like milliseconds; it must be epoch seconds")


def check_snapshot_transition(before: Snapshot, after: Snapshot) -> None:
    """Raise ``ValueError`` unless ``before → after`` follows the step and workflow transition tables.

    Enforced at the store boundary, so no writer can store a move the state machine does not allow: a terminal
    workflow never changes again, a step record is never removed, and each changed step moves along
    ``STEP_TRANSITIONS`` (from PENDING when it had no record). One write may carry several transitions of a step
    (a failed reply that starts the compensation at once), so the target must be reachable, not adjacent. The history
    only grows; a write that carries an operator's event (an audited action) may make the operator's moves too.
    """
    old, new = before.workflow, after.workflow
    if old.workflow_id != new.workflow_id:
        raise ValueError("a snapshot cannot change its workflow id")
    if after.history[: len(before.history)] != before.history:
        raise ValueError(f"workflow {old.workflow_id}: history is append-only")
    codes = {line.split(" ", 2)[1:2][0] for line in after.history[len(before.history) :] if " " in line}
    audited = "P" in codes
    # A completed child of a map step compensates when its parent unwinds: the write carries that event (X).
    by_parent = "X" in codes and old.parent is not None and old.status is WorkflowStatus.COMPLETED
    # An ended map step's child takes its retention from its parent's end (or loses it when an operator takes the
    # parent out of its end): only its TTL changes (SchedulerService._retain_children).
    retention_only = (
        old.parent is not None
        and new == old.evolve(expires_at=new.expires_at)
        and after.steps == before.steps
        and after.history == before.history
    )
    if (
        old.status in TERMINAL_WORKFLOW
        and not (audited and old.status in OPERATOR_WORKFLOW_TRANSITIONS)
        and not by_parent
        and not retention_only
    ):
        raise ValueError(f"workflow {old.workflow_id} is {old.status.value}: terminal states never change")
    if by_parent:
        check_workflow_move(WorkflowStatus.RUNNING, new.status)  # as if it had unwound before completing
    elif old.status is not new.status:
        check_workflow_move(old.status, new.status, audited=audited)
    removed = set(before.steps) - set(after.steps)
    if removed:
        raise ValueError(f"step records cannot be removed: {sorted(removed)}")
    for name, record in after.steps.items():
        previous = before.steps.get(name)
        if previous == record:
            continue
        check_step_move(previous.status if previous else StepStatus.PENDING, record.status, audited=audited)
        if record.in_flight != (record.complete_by is not None):
            raise ValueError(f"step {name} is {record.status.value} but complete_by is {record.complete_by}")
