"""Ports: what the services need from the outside world (cosmicpython's "ports and adapters").

The DynamoDB and SQS adapters implement these for AWS; ``adapters.memory`` implements them in memory for unit tests.
Every write method is a conditional write that raises ``ConditionFailedError`` when the expected state is not there
(DESIGN Rule 2): a lost race is a normal outcome.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .records import DeadlineEntry, Snapshot, StepRecord, WorkflowRecord
from .states import WorkflowStatus


class StateStore(Protocol):
    """The durable state of workflows and steps, with the sparse deadline index and the supervisor lease."""

    def create_workflow(self, workflow: WorkflowRecord, steps: Sequence[StepRecord], stall_at: int, shard: str) -> None:
        """Write a new workflow and its first in-flight steps atomically.

        ``stall_at`` (epoch seconds) puts the workflow itself in the deadline index as a safety net.

        Raises
        ------
        ConditionFailedError
            When a workflow with this id already exists (nothing is written).
        """
        ...

    def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        """Read one workflow item (strongly consistent), or None."""
        ...

    def load(self, workflow_id: str) -> Snapshot | None:
        """Read a workflow and all its steps with one strongly consistent query, or None."""
        ...

    def put_step(self, record: StepRecord, expect: StepRecord | None) -> None:
        """Replace a step item, if its stored status, attempts and complete-by equal ``expect``'s.

        ``expect=None`` means the step must not exist yet (first dispatch, or sealing as SKIPPED).

        Raises
        ------
        ConditionFailedError
            When the stored step differs from ``expect``.
        PayloadTooLargeError
            When the item would exceed DynamoDB's 400 KB item limit.
        """
        ...

    def set_workflow_status(
        self,
        workflow_id: str,
        expect: WorkflowStatus,
        status: WorkflowStatus,
        *,
        now: int,
        reason: str | None = None,
        expires_at: int | None = None,
        stall_at: int | None = None,
    ) -> None:
        """Move a workflow from ``expect`` to ``status``.

        Terminal statuses set ``expires_at`` (TTL, epoch seconds) and leave the deadline index. ``stall_at``
        re-arms the workflow's safety-net deadline.

        Raises
        ------
        ConditionFailedError
            When the stored status is not ``expect``.
        """
        ...

    def push_stall_deadline(self, workflow_id: str, expect_stall_at: int, stall_at: int) -> None:
        """Move a running workflow's safety-net deadline from ``expect_stall_at`` to ``stall_at`` (epoch seconds).

        Raises
        ------
        ConditionFailedError
            When the stored deadline is not ``expect_stall_at``.
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
class Outgoing:
    """One message to send: its queue URL, its body, and an SQS delay in seconds (0..900)."""

    queue_url: str
    body: str
    delay_seconds: int = 0


class MessageBus(Protocol):
    """Sends messages to SQS queues."""

    def send(self, messages: Sequence[Outgoing]) -> list[int]:
        """Send ``messages`` (batched per queue, 10 at most per request).

        Returns
        -------
        list[int]
            Indexes into ``messages`` of those that could not be sent.
        """
        ...


class Counter(Protocol):
    """Counts events for metrics (powertools Metrics in Lambda, a dict in tests)."""

    def __call__(self, name: str, value: int = 1) -> None:
        """Add ``value`` to the metric ``name`` (unit: count)."""
        ...


def no_metrics(name: str, value: int = 1) -> None:
    """A ``Counter`` that drops everything."""
