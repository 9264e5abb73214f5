"""Ports: what the services need from the outside world (cosmicpython's "ports and adapters").

The DynamoDB and SQS adapters implement these for AWS; ``adapters.memory`` implements them in memory for unit tests.
Every write method is a conditional write that raises ``ConditionFailedError`` when the expected state is not there
(DESIGN Rule 2): a lost race is a normal outcome.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    # Annotations only: an agent imports the ports for the bus, and must not load the workflow records and the
    # definitions' pydantic models with them (its cold start; tests/unit/test_lean_imports.py).
    from .batches import Batch, BatchPage
    from .records import DeadlineEntry, Snapshot
    from .triggers import TriggerState


class StateStore(Protocol):
    """The durable state of workflows (one record each), their definitions, the deadline index and the lease."""

    def create(self, snapshot: Snapshot) -> Snapshot:
        """Write a new workflow with its first in-flight steps; return it at version 1.

        The workflow record names its definition by content id (``definition.content_id``): definitions are
        immutable and shared by every workflow that runs them. So ``create`` first stores the definition, unless it
        is known to be stored, then the workflow (write-ahead: never a workflow whose definition is not durable).
        Every check comes before the first write, so a refused start writes nothing.

        Raises
        ------
        ConditionFailedError
            When a workflow with this id already exists (nothing is written).
        PayloadTooLargeError
            When the record would exceed DynamoDB's 400 KB item limit.
        """
        ...

    def load(self, workflow_id: str, *, consistent: bool = True) -> Snapshot | None:
        """Read a workflow and all its steps with one read, or None.

        ``consistent=False`` allows an eventually consistent read (DynamoDB bills half): it may miss the latest
        writes, so use it only where a stale view is harmless (before a write conditional on the version).
        """
        ...

    def load_many(self, workflow_ids: Sequence[str]) -> dict[str, Snapshot]:
        """Read many workflows (a map step's children) with as few reads as the store allows, eventually consistent.

        Returns the ones found, by id. DynamoDB: BatchGetItem, 100 keys a call (unprocessed keys are read again).
        """
        ...

    def save(self, snapshot: Snapshot, expect: Snapshot) -> Snapshot:
        """Replace the stored workflow by ``snapshot`` if it is still at ``expect.version``; return it as stored.

        The move ``expect → snapshot`` must follow the transition tables (``check_snapshot_transition``). The
        stored version becomes ``expect.version + 1``, so every other writer that read ``expect`` loses.

        Raises
        ------
        ConditionFailedError
            When the stored version is not ``expect.version`` (a concurrent write won).
        PayloadTooLargeError
            When the record would exceed DynamoDB's 400 KB item limit.
        ValueError
            When the move is not an allowed transition (a bug, never a race).
        """
        ...

    def overdue(self, shard: str, before: int, limit: int, start: Any | None) -> tuple[list[DeadlineEntry], Any | None]:
        """Read one page of deadline-index entries of ``shard`` with ``complete_by < before`` (epoch seconds).

        Returns the entries and the key to continue from (None on the last page).
        """
        ...

    def acquire_lease(self, name: str, owner: str, now: int, ttl_seconds: int) -> int:
        """Take the lease ``name`` for ``owner`` until ``now + ttl_seconds``; return its fencing token.

        Raises
        ------
        LeaseNotAcquiredError
            When another owner holds an unexpired lease.
        """
        ...

    def release_lease(self, name: str, owner: str, now: int) -> None:
        """Give the lease back early if ``owner`` still holds it; otherwise do nothing."""
        ...


@dataclass(frozen=True)
class WorkflowSummary:
    """What an index holds of a workflow (the operator routes list these).

    Attributes
    ----------
    workflow_id, status, definition_name:
        Identity, status and the definition's name.
    created_at:
        When it started (epoch seconds).
    complete_by:
        Its deadline-index key (the earliest complete-by in flight), when it has one.
    trouble:
        Resends and deferrals of its steps, in all.
    attention, attention_since:
        What a person is to act on (HELD, COMPENSATION_FAILED, PAUSED) and since when, for those that wait.
    reason:
        Why it unwinds or waits, when the index projects it.
    trigger:
        The trigger that started it (``triggers.py``), if one did.
    owner, definition_version, error_codes, error_steps, cost:
        The principal that started it, its definition's version, the codes of its steps' last errors, the steps that
        hold them, and what it has cost (dollars): read from the item (``current``, a finished listing's scan), never
        from an index, which does not project them.
    """

    workflow_id: str
    status: str
    definition_name: str = ""
    created_at: int = 0
    complete_by: int | None = None
    trouble: int = 0
    attention: str | None = None
    attention_since: int | None = None
    reason: str | None = None
    trigger: str | None = None
    owner: str | None = None
    definition_version: int | None = None
    error_codes: tuple[str, ...] = ()
    error_steps: tuple[str, ...] = ()
    #: What its work has cost so far, in dollars (`sasflow.cost`), read from the item; None when it has no tally.
    cost: float | None = None


class WorkflowIndex(Protocol):
    """The store's indexes, read by ``finding.WorkflowFinder``; ``start`` and the returned key continue a page."""

    def attention(self, kind: str, limit: int, start: Any | None) -> tuple[list[WorkflowSummary], Any | None]:
        """Workflows waiting for a person for ``kind``, the longest waiting last."""
        ...

    def count_attention(self, kind: str) -> int:
        """How many workflows wait for a person for ``kind``."""
        ...

    def in_flight(
        self, shard: str, limit: int, start: Any | None, before: int | None
    ) -> tuple[list[WorkflowSummary], Any | None]:
        """Workflows of deadline-index ``shard`` (with ``complete_by < before`` when given), in deadline order."""
        ...

    def count_in_flight(self, shard: str) -> dict[str, int]:
        """Workflows of deadline-index ``shard`` by status."""
        ...

    def finished(self, status: str, limit: int, start: Any | None) -> tuple[list[WorkflowSummary], Any | None]:
        """Workflows of a finished ``status`` (a scan: its cost grows with the table)."""
        ...

    def by_trigger(self, trigger: str, limit: int, start: Any | None) -> tuple[list[WorkflowSummary], Any | None]:
        """The workflows ``trigger`` started, newest first, in any status (the index holds their keys only)."""
        ...

    def current(self, workflow_ids: Sequence[str]) -> dict[str, WorkflowSummary]:
        """The summaries of ``workflow_ids`` read from their items, strongly consistent; a missing id is left out.

        The indexes are global secondary indexes, whose entries lag the item (eventually consistent): a listing
        re-reads its page here before it answers (``finding.WorkflowFinder``).
        """
        ...


class TriggerStore(Protocol):
    """The triggers' items (``triggers.py``): one per trigger, beside the workflows."""

    def state(self, name: str, *, consistent: bool = False) -> TriggerState:
        """The trigger's item (a trigger never paused has none: not paused, nothing skipped); ``consistent``: a
        strongly consistent read (the slot is decided on one)."""
        ...

    def states(self, names: Sequence[str]) -> list[TriggerState]:
        """The items of ``names``, in that order."""
        ...

    def pause(self, name: str, principal: str, reason: str, now: int) -> TriggerState:
        """Record that ``principal`` paused the trigger at ``now`` for ``reason``; the same pause again changes
        nothing, another one is refused (``errors.TriggerAlreadyPausedError``) until it is resumed."""
        ...

    def resume(self, name: str) -> TriggerState:
        """Remove the pause (resuming one that runs changes nothing)."""
        ...

    def count(self, name: str, what: str) -> None:
        """Count one tick ``skipped`` (paused, or a run holds the slot), ``missed`` (later than the catch-up window)
        or ``buffered``."""
        ...

    def claim(self, name: str, workflow_id: str, now: int, *, expect: str | None, buffered: str | None) -> None:
        """Make ``workflow_id`` the holder of the trigger's slot, since ``now``, if the holder is still ``expect``
        (None: no holder) and, for a buffered tick (``buffered``: its body), if it is still the one waiting, which
        it then no longer is.

        Raises
        ------
        triggers.SlotTakenError
            When the holder or the waiting tick changed since they were read.
        """
        ...

    def buffer(self, name: str, body: str, queue_url: str) -> bool:
        """Keep a tick waiting for the slot (its message body, and the queue it goes to when the slot is given
        back) if none waits yet, and count it ``buffered``; False when one does (this tick is then skipped)."""
        ...

    def release(self, name: str, workflow_id: str) -> Outgoing | None:
        """Give the slot back if ``workflow_id`` holds it; the message that starts the tick waiting for it, which stays
        kept until its own claim takes it (a send lost in between is sent again by the next tick)."""
        ...


@dataclass(frozen=True)
class Outgoing:
    """One message to send: its queue URL, its body, an SQS delay in seconds (0..900), the workflow it is for,
    whose pending cost it carries (`sasflow.cost`; None: no workflow's), and its tenant as SQS's ``MessageGroupId``
    (``group``: a step request to an agent's queue, so that SQS fair queues serve a quiet tenant before a noisy one's
    backlog; None: none)."""

    queue_url: str
    body: str
    delay_seconds: int = 0
    workflow_id: str | None = None
    group: str | None = None


@dataclass(frozen=True)
class Receipt:
    """A message received from SQS: the ARN of its queue and its receipt handle (an SQS record's ``eventSourceARN``
    and ``receiptHandle``)."""

    queue_arn: str
    receipt_handle: str


class MessageBus(Protocol):
    """Sends messages to SQS queues, and makes received ones visible again."""

    def send(self, messages: Sequence[Outgoing]) -> list[int]:
        """Send ``messages`` (batched per queue, 10 at most per request).

        Returns
        -------
        list[int]
            Indexes into ``messages`` of those that could not be sent.
        """
        ...

    def make_visible(self, receipts: Sequence[Receipt]) -> int:
        """Make the received messages ``receipts`` visible again at once (visibility timeout 0), so the next receive
        gets them instead of one a visibility timeout later.

        Returns
        -------
        int
            How many could not be made visible (they come back after their visibility timeout, as any failure does).
        """
        ...


class PayloadStore(Protocol):
    """Where claim-checked payloads live (an S3 bucket: ``adapters.s3_payloads``; ``adapters.memory`` in tests).

    Keys start with the workflow id (``<workflow_id>/<sha256>``, ``claim_check.object_key``), so a workflow's
    objects are found, and their retention set, by that prefix. An object is written once and never changed; only its
    retention tag moves (``restamp``).
    """

    def put(self, key: str, body: bytes, state: str) -> None:
        """Store ``body`` under ``key``, tagged ``state``: ``live`` (kept while its workflow runs) or ``pending``
        (its workflow's item may not exist yet: expires after a day unless re-stamped)."""
        ...

    def get(self, key: str) -> bytes:
        """Read the object ``key``.

        Raises
        ------
        ClaimCheckMissingError
            When there is no such object.
        """
        ...

    def keys(self, prefix: str) -> list[str]:
        """The keys of every object under ``prefix`` (a workflow's id and ``/``)."""
        ...

    def restamp(self, key: str, state: str) -> None:
        """Tag the object ``key`` ``state`` (``live``, ``terminal`` or ``pending``) and restart its age, which the
        bucket's lifecycle rules count from (an S3 copy onto itself).

        Raises
        ------
        ClaimCheckMissingError
            When there is no such object.
        """
        ...


class Counter(Protocol):
    """Counts events for metrics (powertools Metrics in Lambda, a dict in tests)."""

    def __call__(self, name: str, value: int = 1) -> None:
        """Add ``value`` to the metric ``name`` (unit: count)."""
        ...


def no_metrics(name: str, value: int = 1) -> None:
    """A ``Counter`` that drops everything."""


class BatchStore(Protocol):
    """Batches of operator actions (``batches.py``): one item per batch and one per page it claimed, beside the
    workflows. Every write of a batch is conditional on its ``version`` (``errors.ConditionFailedError`` when
    another write came first); each returns the batch as stored, its version one more."""

    def create(self, batch: Batch) -> Batch:
        """Store a new batch (refused with ``ConditionFailedError`` when its id is taken)."""
        ...

    def get(self, batch_id: str, *, consistent: bool = False) -> Batch | None:
        """The batch, or None."""
        ...

    def put(self, batch: Batch, *, expect: int) -> Batch:
        """Store the batch if its stored version is still ``expect``."""
        ...

    def claim(self, batch: Batch, page: BatchPage) -> Batch:
        """Store a new page and the batch that claims it (``batch.version`` still stored) in one transaction."""
        ...

    def settle(self, batch: Batch, page: BatchPage) -> Batch:
        """Store the page's outcomes and the batch that counts them (``batch.version`` still stored)."""
        ...

    def page(self, batch_id: str, number: int) -> BatchPage | None:
        """A page of the batch (numbered from 1), strongly consistent."""
        ...

    def pages(self, batch_id: str) -> Iterator[BatchPage]:
        """The batch's pages, in order."""
        ...

    def list(self, limit: int, start: Any | None) -> tuple[list[Batch], Any | None]:
        """Batches, newest first, a page at a time."""
        ...
