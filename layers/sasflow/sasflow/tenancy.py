"""Tenants: at most ``max_running`` workflows of a definition per tenant at once (issue 39, first slice).

A definition's ``tenancy`` (`definition.TenancyPolicy`) names the tenant of each workflow: the principal that starts
it, or what ``tenant_key`` (JMESPath) gives on its input. Each definition name and tenant has one item in the state
table, ``TENANCY#<definition>#<tenant>``, which lists the workflows holding its slots (since when) and counts them.

- **Take.** A start takes a slot for its workflow with one conditional write (the count below ``max_running``, the
  workflow not a holder yet) before the write that creates the workflow. A start that finds every slot taken looks
  at the holders (at most once per `PRUNE_SECONDS` per tenant, so a burst of refused starts reads nothing more),
  gives back the slots of those that have ended, or that never came (a start that crashed between its take and its
  create, after `HOLDER_GRACE_SECONDS`), and tries once more; then it is refused with 429 and Retry-After
  (`errors.TenantLimitError`), having written nothing of its workflow.
- **Give back.** The call whose write ends the workflow (``states.ENDED_RUN``: COMPLETED, COMPENSATED or CANCELLED)
  gives its slot back, and so does any later call on it (the first give-back may have crashed), by a conditional
  write that does nothing when it holds none. HELD and COMPENSATION_FAILED keep the slot: they wait for a person and
  may run again.

So the workflows of a tenant that are running never outnumber ``max_running`` (the simulation checks it), and a slot
whose give-back was lost is found by the next start that needs it: none leaks.

**The queue** (``over_limit: queue``). A start that finds every slot taken, or others queued before it, takes the
next ticket of its tenant's queue and writes an entry for it (``Q#<ticket>`` in the tenant's partition) before it
writes its workflow ``QUEUED`` (nothing dispatched, in no deadline); it answers 201 with its position. A give-back
that frees a slot starts the queue's head (`promote`): it takes the slot for it, moves it ``QUEUED → RUNNING`` with
its first dispatches by one conditional write, then deletes its entry, and goes on while slots are free. Each of
those is safe to repeat, so a promoter that crashed midway is finished by the next one: the head is started
exactly once, and in ticket order (a later entry is looked at only once the head's is gone). While its queue is not
empty, the tenant's item is in the deadline index (its own shard, `QUEUE_SHARD`, keyed by when the queue is next
looked at): the supervisor promotes what a lost give-back left queued, and frees the slots of holders that ended
without giving theirs back. A start that finds others queued queues behind them, even when a slot is free.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from .definition import TenancyPolicy, WorkflowDefinition
from .errors import TenantKeyError, TenantLimitError
from .expressions import RenderBudget, evaluate
from .states import ENDED_RUN

logger = logging.getLogger("sasflow.tenancy")

#: How long a holder may be missing (its workflow not written yet) before a start that needs its slot gives it back
#: (seconds): a start writes its workflow milliseconds after it takes its slot; one that crashed in between never does.
HOLDER_GRACE_SECONDS = 60
#: How often, at most, a full tenant's holders are looked at (seconds): a burst of starts over the limit costs one
#: conditional write each, not a read of every holder each.
PRUNE_SECONDS = 30
#: The Retry-After of a start over its tenant's limit (seconds).
RETRY_AFTER_SECONDS = 10
#: The longest tenant name (characters): it is part of a DynamoDB key.
MAX_TENANT_CHARS = 256
#: How often the supervisor looks at a tenant's queue while it is not empty (seconds): the queue's heads start when
#: slots are given back; this look finds what a lost give-back, or a holder that ended without one, left waiting.
QUEUE_CHECK_SECONDS = 60
#: The deadline index's shard of the tenants' queues (the workflows' shards are ``00``, ``01``, ...).
QUEUE_SHARD = "TQ"
#: Most queued workflows one call starts (a give-back frees one slot; the supervisor's look may find several).
MAX_PROMOTIONS = 25
#: What SQS takes as a MessageGroupId: 1 to 128 letters, digits and punctuation.
_MESSAGE_GROUP = re.compile(r"^[A-Za-z0-9!-/:-@\[-`{-~]{1,128}$")


def fair_group(tenant: str | None, owner: str | None) -> str:
    """The group a workflow's step requests are shared fairly by (SQS fair queues' ``MessageGroupId``, and the
    round-robin of an agent's batch): its tenant, else the principal that started it; a name SQS would refuse (too
    long, or other characters) is replaced by a digest of it."""
    name = tenant or f"principal#{owner or ''}"
    if _MESSAGE_GROUP.match(name):
        return name
    return "sha256#" + hashlib.sha256(name.encode("utf-8")).hexdigest()[:40]


@dataclass(frozen=True)
class TenantSlots:
    """A tenant's item: the workflows holding its slots (workflow id -> since, epoch seconds) and when its holders
    were last looked at (``pruned_at``)."""

    holders: Mapping[str, int] = field(default_factory=dict)
    pruned_at: int = 0
    #: Tickets the tenant's queue has given (the last one's number); 0 when none.
    next_ticket: int = 0
    #: When the supervisor looks at the queue next (epoch seconds); None when the queue was seen empty.
    queue_due: int | None = None


@dataclass(frozen=True)
class Released:
    """What a give-back found: whether the workflow held a slot (the object is true when it did), and whether its
    tenant's queue may have workflows waiting (the tenant's item is in the deadline index: ``queue_due`` set)."""

    released: bool
    queue_waiting: bool = False

    def __bool__(self) -> bool:
        return self.released


@dataclass(frozen=True)
class QueueEntry:
    """One workflow waiting in its tenant's queue: its ticket, its id and since when (epoch seconds)."""

    ticket: int
    workflow_id: str
    since: int


class TenantSlotStore(Protocol):
    """The tenants' items (``TENANCY#<definition>#<tenant>``), one per definition name and tenant."""

    def take(self, definition: str, tenant: str, workflow_id: str, max_running: int, now: int) -> bool:
        """Make ``workflow_id`` a holder since ``now`` if fewer than ``max_running`` hold a slot; True when it holds
        one (also when it already did), False when every slot is taken."""
        ...

    def slots(self, definition: str, tenant: str) -> TenantSlots:
        """The tenant's item, strongly consistent (no item: no holder)."""
        ...

    def release(self, definition: str, tenant: str, workflow_id: str) -> Released:
        """Give back ``workflow_id``'s slot (false when it held none: given back already), and say whether the
        tenant's queue may have workflows waiting, as the same write finds the tenant's item."""
        ...

    def claim_pruning(self, definition: str, tenant: str, now: int, every: int) -> bool:
        """Record that the holders are looked at ``now`` unless they were within ``every`` seconds; True when this
        caller may look (one caller per period)."""
        ...

    def enqueue(self, definition: str, tenant: str, workflow_id: str, now: int, due: int) -> int:
        """Give ``workflow_id`` the queue's next ticket and write its entry; the queue is looked at by ``due`` at the
        latest (the tenant's item enters the deadline index). Returns the ticket."""
        ...

    def head(self, definition: str, tenant: str) -> QueueEntry | None:
        """The entry of the lowest ticket (strongly consistent); None when the queue is empty."""
        ...

    def dequeue(self, definition: str, tenant: str, ticket: int) -> None:
        """Delete the entry of ``ticket`` (nothing when it is gone already)."""
        ...

    def queue_checked(self, definition: str, tenant: str, due: int | None, seen_ticket: int) -> None:
        """Look at the queue again by ``due``; with None, take the tenant's item out of the deadline index unless a
        ticket was given after ``seen_ticket`` (a start queued since the queue was seen empty)."""
        ...

    def due_queues(self, before: int, limit: int) -> list[tuple[str, str]]:
        """(definition, tenant) of the queues due to be looked at before ``before`` (the deadline index's
        `QUEUE_SHARD`), at most ``limit``."""
        ...


def tenant_of(policy: TenancyPolicy, owner: str, workflow_input: Mapping[str, Any]) -> str:
    """The tenant of a workflow: ``principal#<owner>``, or ``key#<value>`` of ``tenant_key`` on its input.

    Raises
    ------
    TenantKeyError
        When the key gives no text or integer (null, an object, a list, a boolean), or an empty or too long one.
    """
    if policy.tenant_key is None:
        return f"principal#{owner}"
    try:
        value = evaluate(policy.tenant_key, dict(workflow_input), RenderBudget())
    except Exception as exc:  # a JMESPath function given a wrong type, a budget passed
        raise TenantKeyError(f"tenancy.tenant_key {policy.tenant_key!r} could not be evaluated: {exc}") from None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise TenantKeyError(
            f"tenancy.tenant_key {policy.tenant_key!r} gives {_kind(value)} on this input; it must give the tenant's "
            "name (a text or an integer): add it to the input"
        )
    text = str(value)
    if not text or len(text) > MAX_TENANT_CHARS:
        raise TenantKeyError(
            f"tenancy.tenant_key {policy.tenant_key!r} gives a tenant of {len(text)} characters; 1 to "
            f"{MAX_TENANT_CHARS} are allowed"
        )
    return f"key#{text}"


def _kind(value: Any) -> str:
    if value is None:
        return "null (nothing)"
    return {dict: "an object", list: "a list", bool: "a boolean", float: "a number with a fraction"}.get(
        type(value), type(value).__name__
    )


class TenantGate:
    """Takes and gives back the tenants' slots for the scheduler (see the module docstring).

    Parameters
    ----------
    slots:
        The tenants' items.
    status_of:
        The status of a workflow by id, None when it does not exist: a strongly consistent read (a stale one could
        show a running holder as not written yet, and free its slot).
    """

    def __init__(self, slots: TenantSlotStore, status_of: Any) -> None:
        self.slots = slots
        self.status_of = status_of

    def take(self, definition: WorkflowDefinition, tenant: str, workflow_id: str, now: int) -> None:
        """Take a slot of ``tenant`` for ``workflow_id`` (see the module docstring).

        Raises
        ------
        TenantLimitError
            Every slot is held by a workflow that runs (or started less than `HOLDER_GRACE_SECONDS` ago).
        """
        policy = definition.tenancy
        if policy is None:
            return
        name = definition.name
        if self.slots.take(name, tenant, workflow_id, policy.max_running, now):
            return
        if self.slots.claim_pruning(name, tenant, now, PRUNE_SECONDS):
            ended = self._ended_holders(name, tenant, now)
            for holder in ended:
                if self.slots.release(name, tenant, holder):
                    logger.warning(
                        "tenant slot given back by a start: its holder had ended without giving it back",
                        extra={"tenant": tenant, "definition": name, "workflow_id": holder},
                    )
            if ended and self.slots.take(name, tenant, workflow_id, policy.max_running, now):
                return
        raise TenantLimitError(tenant, name, policy.max_running, RETRY_AFTER_SECONDS)

    def _ended_holders(self, definition: str, tenant: str, now: int) -> list[str]:
        ended = []
        for holder, since in self.slots.slots(definition, tenant).holders.items():
            status = self.status_of(holder)
            if (status is None and since <= now - HOLDER_GRACE_SECONDS) or (status is not None and status in ENDED_RUN):
                ended.append(holder)
        return ended
