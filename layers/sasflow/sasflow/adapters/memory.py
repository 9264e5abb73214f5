"""In-memory adapters for unit tests and simulations: same conditions as the AWS adapters, no I/O.

They keep records (not items) but apply the same rules: conditional writes on status, attempts and complete-by,
a sparse deadline index holding exactly the in-flight steps and the non-terminal workflows, and a lease.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..errors import ConditionFailedError, LeaseNotAcquiredError
from ..ports import Outgoing
from ..records import DeadlineEntry, Snapshot, StepRecord, WorkflowRecord
from ..states import TERMINAL_WORKFLOW, StepStatus, WorkflowStatus, check_step_transition, check_workflow_transition


class InMemoryStateStore:
    """A thread-safe ``StateStore`` in memory. ``writes`` counts successful writes by kind (for assertions)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.workflows: dict[str, WorkflowRecord] = {}
        self.shards: dict[str, str] = {}
        self.steps: dict[tuple[str, str], StepRecord] = {}
        self.leases: dict[str, tuple[str, int, int]] = {}
        self.writes: dict[str, int] = {}

    def _count(self, kind: str) -> None:
        self.writes[kind] = self.writes.get(kind, 0) + 1

    def create_workflow(self, workflow: WorkflowRecord, steps: Sequence[StepRecord], stall_at: int, shard: str) -> None:
        """See ``StateStore.create_workflow``."""
        with self._lock:
            if workflow.workflow_id in self.workflows:
                raise ConditionFailedError(workflow.workflow_id)
            self.workflows[workflow.workflow_id] = replace(workflow, stall_at=stall_at)
            self.shards[workflow.workflow_id] = shard
            for record in steps:
                self.steps[(record.workflow_id, record.step)] = record
            self._count("create_workflow")

    def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        """See ``StateStore.get_workflow``."""
        with self._lock:
            return self.workflows.get(workflow_id)

    def load(self, workflow_id: str) -> Snapshot | None:
        """See ``StateStore.load``."""
        with self._lock:
            workflow = self.workflows.get(workflow_id)
            if workflow is None:
                return None
            steps = {name: r for (wid, name), r in self.steps.items() if wid == workflow_id}
            return Snapshot(workflow, steps)

    def put_step(self, record: StepRecord, expect: StepRecord | None) -> None:
        """See ``StateStore.put_step``."""
        check_step_transition(expect.status if expect else StepStatus.PENDING, record.status)
        if record.in_flight and (not isinstance(record.complete_by, int) or not isinstance(record.dl_shard, str)):
            raise TypeError("an in-flight step needs int complete_by and str dl_shard")
        if not record.in_flight:
            record = replace(record, complete_by=None, dl_shard=None)
        with self._lock:
            key = (record.workflow_id, record.step)
            current = self.steps.get(key)
            if expect is None:
                if current is not None:
                    raise ConditionFailedError(f"step {record.step} exists")
            elif current is None or (
                current.status,
                current.attempt,
                current.comp_attempt,
                current.complete_by,
            ) != (expect.status, expect.attempt, expect.comp_attempt, expect.complete_by):
                raise ConditionFailedError(f"step {record.step} changed")
            self.steps[key] = record
            self._count("put_step")

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
        """See ``StateStore.set_workflow_status``."""
        check_workflow_transition(expect, status)
        with self._lock:
            current = self.workflows.get(workflow_id)
            if current is None or current.status is not expect:
                raise ConditionFailedError(f"workflow {workflow_id} is not {expect.value}")
            changes: dict[str, Any] = {"status": status, "updated_at": now}
            if reason is not None:
                changes["reason"] = reason
            if status in TERMINAL_WORKFLOW:
                changes["stall_at"] = None
            elif stall_at is not None:
                changes["stall_at"] = stall_at
            self.workflows[workflow_id] = replace(current, **changes)
            self._count("set_workflow_status")

    def push_stall_deadline(self, workflow_id: str, expect_stall_at: int, stall_at: int) -> None:
        """See ``StateStore.push_stall_deadline``."""
        with self._lock:
            current = self.workflows.get(workflow_id)
            if current is None or current.stall_at != expect_stall_at:
                raise ConditionFailedError(workflow_id)
            self.workflows[workflow_id] = replace(current, stall_at=stall_at)
            self._count("push_stall_deadline")

    def index_entries(self) -> list[DeadlineEntry]:
        """Every entry of the (sparse) deadline index, for invariant checks."""
        with self._lock:
            entries = [
                DeadlineEntry(r.workflow_id, r.step, r.attempt, r.status.value, r.complete_by)
                for r in self.steps.values()
                if r.complete_by is not None
            ]
            entries += [
                DeadlineEntry(w.workflow_id, None, 0, w.status.value, w.stall_at)
                for w in self.workflows.values()
                if w.stall_at is not None
            ]
            return entries

    def overdue(self, shard: str, before: int, limit: int, start: Any | None) -> tuple[list[DeadlineEntry], Any | None]:
        """See ``StateStore.overdue``; pages are ordered by (complete_by, workflow_id, step)."""
        with self._lock:
            matching = []
            for entry in self.index_entries():
                entry_shard = (
                    self.steps[(entry.workflow_id, entry.step)].dl_shard
                    if entry.step is not None
                    else self.shards.get(entry.workflow_id)
                )
                if entry_shard == shard and entry.complete_by < before:
                    matching.append(entry)

        # Key-based paging like DynamoDB's LastEvaluatedKey: entries moved during a sweep are neither skipped nor
        # read twice.
        def key(e: DeadlineEntry) -> tuple[int, str, str]:
            return (e.complete_by, e.workflow_id, e.step or "")

        matching.sort(key=key)
        if start is not None:
            matching = [e for e in matching if key(e) > start]
        page = matching[:limit]
        following = key(page[-1]) if len(matching) > limit else None
        return page, following

    def acquire_lease(self, name: str, owner: str, now: int, ttl_seconds: int) -> int:
        """See ``StateStore.acquire_lease``."""
        with self._lock:
            held = self.leases.get(name)
            if held is not None and held[1] >= now and held[0] != owner:
                raise LeaseNotAcquiredError(name)
            fencing = (held[2] if held else 0) + 1
            self.leases[name] = (owner, now + ttl_seconds, fencing)
            return fencing

    def release_lease(self, name: str, owner: str, now: int) -> None:
        """See ``StateStore.release_lease``."""
        with self._lock:
            held = self.leases.get(name)
            if held is not None and held[0] == owner:
                self.leases[name] = (owner, now - 1, held[2])


@dataclass
class InMemoryBus:
    """A ``MessageBus`` that keeps sent messages per queue URL. ``fail_next`` makes the next N sends fail."""

    queues: dict[str, list[Outgoing]] = field(default_factory=dict)
    fail_next: int = 0

    def send(self, messages: Sequence[Outgoing]) -> list[int]:
        """Append each message to its queue; return the indexes that failed (``fail_next``)."""
        failed = []
        for index, message in enumerate(messages):
            if self.fail_next > 0:
                self.fail_next -= 1
                failed.append(index)
                continue
            self.queues.setdefault(message.queue_url, []).append(message)
        return failed

    def drain(self, queue_url: str) -> list[Outgoing]:
        """Remove and return every message of ``queue_url``."""
        return self.queues.pop(queue_url, [])
