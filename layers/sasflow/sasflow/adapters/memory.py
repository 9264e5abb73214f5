"""In-memory adapters for unit tests and simulations: same conditions as the AWS adapters, no I/O.

They keep snapshots (not items) but apply the same rules: one record per workflow written as a whole, conditional
on its version, moves checked against the transition tables, and a sparse deadline index holding exactly the
workflows that are not terminal, keyed by their earliest complete-by in flight.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from ..definition import WorkflowDefinition
from ..errors import ClaimCheckMissingError, ConditionFailedError, LeaseNotAcquiredError
from ..ports import Outgoing, Receipt, WorkflowSummary
from ..records import DeadlineEntry, Snapshot, check_deadlines, check_snapshot_transition, deadline_shard
from ..registry import DefinitionNameTakenError, NameRecord, VersionRecord
from ..tenancy import QueueEntry, Released, TenantSlots
from ..triggers import COUNTS, SlotTakenError, TriggerState, already_paused

if TYPE_CHECKING:
    from ..batches import Batch, BatchPage


class InMemoryStateStore:
    """A thread-safe ``StateStore`` in memory. ``writes`` counts successful writes by kind (for assertions).

    Parameters
    ----------
    shards:
        Partitions of the deadline index, as the template's ``DeadlineShards``.
    """

    def __init__(self, shards: int = 8) -> None:
        self._lock = threading.RLock()
        self.shards = shards
        self.workflows: dict[str, Snapshot] = {}
        self.definitions: dict[str, WorkflowDefinition] = {}
        self.leases: dict[str, tuple[str, int, int]] = {}
        self.writes: dict[str, int] = {}
        #: What an eventually consistent read of a workflow returns instead of its latest version (None: not found).
        self.stale_reads: dict[str, Snapshot | None] = {}
        #: Registered names and their versions (registry.py).
        self.names: dict[str, NameRecord] = {}
        self.versions: dict[tuple[str, int], VersionRecord] = {}

    def _count(self, kind: str) -> None:
        self.writes[kind] = self.writes.get(kind, 0) + 1

    def create(self, snapshot: Snapshot) -> Snapshot:
        """See ``StateStore.create``."""
        check_deadlines(snapshot)
        with self._lock:
            workflow_id = snapshot.workflow.workflow_id
            definition = snapshot.workflow.definition
            if definition.content_id not in self.definitions:
                self.definitions[definition.content_id] = definition
                self._count("put_definition")
            if workflow_id in self.workflows:
                raise ConditionFailedError(f"workflow {workflow_id} exists")
            stored = replace(snapshot, version=1)
            self.workflows[workflow_id] = stored
            self._count("create")
            return stored

    # -- definitions by name and version (see DynamoDBStateStore)
    def put_definition_version(
        self, name: str, version: int, definition: WorkflowDefinition, *, owner: str, now: int
    ) -> tuple[bool, VersionRecord]:
        """See ``DynamoDBStateStore.put_definition_version``."""
        with self._lock:
            known = self.names.get(name)
            if known is not None and known.owner != owner:
                raise DefinitionNameTakenError(name)
            self.definitions.setdefault(definition.content_id, definition)
            existing = self.versions.get((name, version))
            record = existing or VersionRecord(version, definition.content_id, owner, now)
            self.versions[(name, version)] = record
            latest = max(version, known.latest if known else 0)
            self.names[name] = NameRecord(name, owner, latest, known.created_at if known else now)
            return existing is None, record

    def definition_name(self, name: str) -> NameRecord | None:
        """See ``DynamoDBStateStore.definition_name``."""
        return self.names.get(name)

    def definition_names(self) -> list[NameRecord]:
        """See ``DynamoDBStateStore.definition_names``."""
        return list(self.names.values())

    def definition_versions(self, name: str) -> list[VersionRecord]:
        """See ``DynamoDBStateStore.definition_versions``."""
        return sorted((r for (n, _), r in self.versions.items() if n == name), key=lambda r: r.version)

    def definition_version(self, name: str, version: int) -> WorkflowDefinition | None:
        """See ``DynamoDBStateStore.definition_version``."""
        record = self.versions.get((name, version))
        return None if record is None else self.definitions[record.content_id]

    def load(self, workflow_id: str, *, consistent: bool = True) -> Snapshot | None:
        """See ``StateStore.load``; ``stale_reads`` makes eventually consistent reads return older versions."""
        with self._lock:
            if not consistent and workflow_id in self.stale_reads:
                return self.stale_reads[workflow_id]
            return self.workflows.get(workflow_id)

    def load_many(self, workflow_ids: Sequence[str]) -> dict[str, Snapshot]:
        """The workflows of ``workflow_ids`` that exist, by id (see ``StateStore``)."""
        found = {}
        for workflow_id in workflow_ids:
            snapshot = self.load(workflow_id)
            if snapshot is not None:
                found[workflow_id] = snapshot
        return found

    def save(self, snapshot: Snapshot, expect: Snapshot) -> Snapshot:
        """See ``StateStore.save``."""
        check_snapshot_transition(expect, snapshot)
        check_deadlines(snapshot)
        with self._lock:
            workflow_id = snapshot.workflow.workflow_id
            current = self.workflows.get(workflow_id)
            if current is None or current.version != expect.version:
                raise ConditionFailedError(f"workflow {workflow_id} changed since version {expect.version}")
            stored = replace(snapshot, version=expect.version + 1)
            self.workflows[workflow_id] = stored
            self._count("save")
            return stored

    def index_entries(self) -> list[DeadlineEntry]:
        """Every entry of the (sparse) deadline index, for invariant checks."""
        with self._lock:
            return [
                DeadlineEntry(workflow_id, deadline)
                for workflow_id, snapshot in self.workflows.items()
                if (deadline := snapshot.stored_key) is not None
            ]

    def overdue(self, shard: str, before: int, limit: int, start: Any | None) -> tuple[list[DeadlineEntry], Any | None]:
        """See ``StateStore.overdue``; pages are ordered by (complete_by, workflow_id)."""
        with self._lock:
            matching = [
                entry
                for entry in self.index_entries()
                if deadline_shard(entry.workflow_id, self.shards) == shard and entry.complete_by < before
            ]

        # Key-based paging like DynamoDB's LastEvaluatedKey: entries moved during a sweep are neither skipped nor
        # read twice.
        def key(e: DeadlineEntry) -> tuple[int, str]:
            return (e.complete_by, e.workflow_id)

        matching.sort(key=key)
        if start is not None:
            matching = [e for e in matching if key(e) > start]
        page = matching[:limit]
        following = key(page[-1]) if len(matching) > limit else None
        return page, following

    # -- the operators' queries (ports.WorkflowIndex), paged by key as DynamoDB pages
    @staticmethod
    def _summary(snapshot: Snapshot) -> WorkflowSummary:
        workflow = snapshot.workflow
        return WorkflowSummary(
            workflow_id=workflow.workflow_id,
            status=workflow.status.value,
            definition_name=workflow.definition.name,
            created_at=workflow.created_at,
            complete_by=snapshot.stored_key,
            trouble=snapshot.trouble,
            attention=workflow.attention,
            attention_since=workflow.attention_since,
            reason=workflow.reason,
            trigger=workflow.trigger.name if workflow.trigger is not None else None,
            owner=workflow.owner,
            definition_version=workflow.definition.version,
            error_codes=snapshot.error_codes,
            error_steps=snapshot.error_steps,
        )

    @staticmethod
    def _page(
        rows: list[tuple[list[Any], WorkflowSummary]], limit: int, start: Any | None
    ) -> tuple[list[WorkflowSummary], Any | None]:
        rows.sort(key=lambda row: row[0])
        if start is not None:
            rows = [row for row in rows if row[0] > list(start)]
        page = rows[:limit]
        return [summary for _, summary in page], (page[-1][0] if len(rows) > limit else None)

    def attention(self, kind: str, limit: int, start: Any | None) -> tuple[list[WorkflowSummary], Any | None]:
        """See ``ports.WorkflowIndex.attention``: the sparse attention index, newest first."""
        with self._lock:
            rows = [
                ([-(s.workflow.attention_since or 0), s.workflow.workflow_id], self._summary(s))
                for s in self.workflows.values()
                if s.workflow.attention == kind
            ]
        return self._page(rows, limit, start)

    def count_attention(self, kind: str) -> int:
        """See ``ports.WorkflowIndex.count_attention``."""
        with self._lock:
            return sum(1 for s in self.workflows.values() if s.workflow.attention == kind)

    def in_flight(
        self, shard: str, limit: int, start: Any | None, before: int | None
    ) -> tuple[list[WorkflowSummary], Any | None]:
        """See ``ports.WorkflowIndex.in_flight``: one shard of the sparse deadline index, in deadline order."""
        with self._lock:
            rows = [
                ([deadline, s.workflow.workflow_id], self._summary(s))
                for s in self.workflows.values()
                if (deadline := s.stored_key) is not None
                and deadline_shard(s.workflow.workflow_id, self.shards) == shard
                and (before is None or deadline < before)
            ]
        return self._page(rows, limit, start)

    def count_in_flight(self, shard: str) -> dict[str, int]:
        """See ``ports.WorkflowIndex.count_in_flight``."""
        counts: dict[str, int] = {}
        summaries, _ = self.in_flight(shard, len(self.workflows) + 1, None, None)
        for summary in summaries:
            counts[summary.status] = counts.get(summary.status, 0) + 1
        return counts

    def finished(self, status: str, limit: int, start: Any | None) -> tuple[list[WorkflowSummary], Any | None]:
        """See ``ports.WorkflowIndex.finished``: every workflow of a terminal ``status`` (or QUEUED), in id order."""
        with self._lock:
            rows = [
                ([s.workflow.workflow_id], self._summary(s))
                for s in self.workflows.values()
                if s.workflow.status.value == status
            ]
        return self._page(rows, limit, start)

    def by_trigger(self, trigger: str, limit: int, start: Any | None) -> tuple[list[WorkflowSummary], Any | None]:
        """See ``ports.WorkflowIndex.by_trigger``: the workflows ``trigger`` started, newest first."""
        with self._lock:
            rows = [
                ([-s.workflow.created_at, s.workflow.workflow_id], self._summary(s))
                for s in self.workflows.values()
                if s.workflow.trigger is not None and s.workflow.trigger.name == trigger
            ]
        return self._page(rows, limit, start)

    def current(self, workflow_ids: Sequence[str]) -> dict[str, WorkflowSummary]:
        """See ``ports.WorkflowIndex.current``: the summaries of the stored workflows (always current here)."""
        with self._lock:
            return {wid: self._summary(self.workflows[wid]) for wid in workflow_ids if wid in self.workflows}

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
    """A ``MessageBus`` that keeps sent messages per queue URL. ``fail_next`` makes the next N sends fail;
    ``made_visible`` keeps every receipt it was asked to make visible again."""

    queues: dict[str, list[Outgoing]] = field(default_factory=dict)
    fail_next: int = 0
    made_visible: list[Receipt] = field(default_factory=list)

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

    def make_visible(self, receipts: Sequence[Receipt]) -> int:
        """Record ``receipts`` (nothing here is hidden); none fails."""
        self.made_visible.extend(receipts)
        return 0

    def drain(self, queue_url: str) -> list[Outgoing]:
        """Remove and return every message of ``queue_url``."""
        return self.queues.pop(queue_url, [])


class InMemoryPayloadStore:
    """A ``PayloadStore`` in memory: ``objects`` maps each key to its bytes, ``tags`` to its retention tag, and
    ``requests`` counts the S3 requests it stands for (PUT, GET, LIST, COPY), for assertions and the bench."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.objects: dict[str, bytes] = {}
        self.tags: dict[str, str] = {}
        self.requests: dict[str, int] = {}

    def _count(self, kind: str) -> None:
        self.requests[kind] = self.requests.get(kind, 0) + 1

    def put(self, key: str, body: bytes, state: str) -> None:
        """Store ``body`` under ``key``, tagged ``state``."""
        with self._lock:
            self._count("PUT")
            self.objects[key] = bytes(body)
            self.tags[key] = state

    def get(self, key: str) -> bytes:
        """The bytes of ``key``; raises ``ClaimCheckMissingError`` when there is none."""
        with self._lock:
            self._count("GET")
            if key not in self.objects:
                raise ClaimCheckMissingError(key)
            return self.objects[key]

    def keys(self, prefix: str) -> list[str]:
        """The keys under ``prefix``, sorted."""
        with self._lock:
            self._count("LIST")
            return sorted(key for key in self.objects if key.startswith(prefix))

    def restamp(self, key: str, state: str) -> None:
        """Tag ``key`` ``state``; raises ``ClaimCheckMissingError`` when there is none."""
        with self._lock:
            self._count("COPY")
            if key not in self.objects:
                raise ClaimCheckMissingError(key)
            self.tags[key] = state

    def delete(self, key: str) -> None:
        """Remove ``key`` (what a lifecycle rule does; the engine never deletes)."""
        with self._lock:
            self.objects.pop(key, None)
            self.tags.pop(key, None)


class InMemoryTriggerStore:
    """A ``ports.TriggerStore`` in memory (``adapters.trigger_dynamodb`` on DynamoDB)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: dict[str, TriggerState] = {}

    def state(self, name: str, *, consistent: bool = False) -> TriggerState:
        """See ``ports.TriggerStore.state`` (always the latest)."""
        with self._lock:
            return self.items.get(name) or TriggerState(name)

    def states(self, names: Sequence[str]) -> list[TriggerState]:
        """See ``ports.TriggerStore.states``."""
        return [self.state(name) for name in names]

    def pause(self, name: str, principal: str, reason: str, now: int) -> TriggerState:
        """See ``ports.TriggerStore.pause`` (raises TriggerAlreadyPausedError under another pause)."""
        with self._lock:
            state = self.items.get(name) or TriggerState(name)
            if state.paused:
                if (state.paused_by, state.pause_reason) != (principal, reason):
                    raise already_paused(state)
                return state
            self.items[name] = replace(state, paused_by=principal, paused_at=now, pause_reason=reason)
            return self.items[name]

    def resume(self, name: str) -> TriggerState:
        """See ``ports.TriggerStore.resume``."""
        with self._lock:
            state = self.items.get(name) or TriggerState(name)
            self.items[name] = replace(state, paused_by=None, paused_at=None, pause_reason=None)
            return self.items[name]

    def count(self, name: str, what: str) -> None:
        """See ``ports.TriggerStore.count`` (raises ValueError for a count a trigger does not keep)."""
        if what not in COUNTS:
            raise ValueError(f"unknown trigger count {what!r}; one of {COUNTS}")
        with self._lock:
            state = self.items.get(name) or TriggerState(name)
            self.items[name] = replace(state, **{what: getattr(state, what) + 1})

    def claim(self, name: str, workflow_id: str, now: int, *, expect: str | None, buffered: str | None) -> None:
        """See ``ports.TriggerStore.claim`` (raises SlotTakenError when the holder or the waiting tick changed)."""
        with self._lock:
            state = self.items.get(name) or TriggerState(name)
            if state.running != expect or (buffered is not None and state.waiting != buffered):
                raise SlotTakenError(f"trigger {name}: its slot changed since it was read")
            state = replace(state, running=workflow_id, running_since=now)
            if buffered is not None:
                state = replace(state, waiting=None, waiting_queue=None)
            self.items[name] = state

    def buffer(self, name: str, body: str, queue_url: str) -> bool:
        """See ``ports.TriggerStore.buffer``."""
        with self._lock:
            state = self.items.get(name) or TriggerState(name)
            if state.waiting is not None:
                return False
            self.items[name] = replace(state, waiting=body, waiting_queue=queue_url, buffered=state.buffered + 1)
            return True

    def release(self, name: str, workflow_id: str) -> Outgoing | None:
        """See ``ports.TriggerStore.release``."""
        with self._lock:
            state = self.items.get(name)
            if state is None or state.running not in (None, workflow_id):
                return None
            self.items[name] = replace(state, running=None, running_since=None)
            return None if state.waiting is None else Outgoing(state.waiting_queue or "", state.waiting)


class InMemoryTenantSlotStore:
    """A ``tenancy.TenantSlotStore`` in memory (``adapters.tenancy_dynamodb`` on DynamoDB): ``items`` maps
    (definition, tenant) to its holders (workflow id -> since), ``pruned`` to when they were last looked at, and
    ``queues`` to its queue (ticket -> workflow id, since), ``tickets`` to the last ticket given and ``due`` to when the
    supervisor looks at the queue next."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.items: dict[tuple[str, str], dict[str, int]] = {}
        self.pruned: dict[tuple[str, str], int] = {}
        self.queues: dict[tuple[str, str], dict[int, tuple[str, int]]] = {}
        self.tickets: dict[tuple[str, str], int] = {}
        self.due: dict[tuple[str, str], int] = {}

    def take(self, definition: str, tenant: str, workflow_id: str, max_running: int, now: int) -> bool:
        """See ``TenantSlotStore.take``."""
        with self._lock:
            holders = self.items.setdefault((definition, tenant), {})
            if workflow_id in holders:
                return True
            if len(holders) >= max_running:
                return False
            holders[workflow_id] = now
            return True

    def slots(self, definition: str, tenant: str) -> TenantSlots:
        """See ``TenantSlotStore.slots``."""
        with self._lock:
            return TenantSlots(
                holders=dict(self.items.get((definition, tenant), {})),
                pruned_at=self.pruned.get((definition, tenant), 0),
                next_ticket=self.tickets.get((definition, tenant), 0),
                queue_due=self.due.get((definition, tenant)),
            )

    def release(self, definition: str, tenant: str, workflow_id: str) -> Released:
        """See ``TenantSlotStore.release``."""
        with self._lock:
            held = self.items.get((definition, tenant), {}).pop(workflow_id, None) is not None
            return Released(held, queue_waiting=held and (definition, tenant) in self.due)

    def claim_pruning(self, definition: str, tenant: str, now: int, every: int) -> bool:
        """See ``TenantSlotStore.claim_pruning``."""
        with self._lock:
            if self.pruned.get((definition, tenant), 0) > now - every:
                return False
            self.pruned[(definition, tenant)] = now
            return True

    def enqueue(self, definition: str, tenant: str, workflow_id: str, now: int, due: int) -> int:
        """See ``TenantSlotStore.enqueue``."""
        key = (definition, tenant)
        with self._lock:
            ticket = self.tickets.get(key, 0) + 1
            self.tickets[key] = ticket
            self.due.setdefault(key, due)
            self.queues.setdefault(key, {})[ticket] = (workflow_id, now)
            return ticket

    def head(self, definition: str, tenant: str) -> QueueEntry | None:
        """See ``TenantSlotStore.head``."""
        with self._lock:
            queue = self.queues.get((definition, tenant), {})
            if not queue:
                return None
            ticket = min(queue)
            workflow_id, since = queue[ticket]
            return QueueEntry(ticket, workflow_id, since)

    def dequeue(self, definition: str, tenant: str, ticket: int) -> None:
        """See ``TenantSlotStore.dequeue``."""
        with self._lock:
            self.queues.get((definition, tenant), {}).pop(ticket, None)

    def queue_checked(self, definition: str, tenant: str, due: int | None, seen_ticket: int) -> None:
        """See ``TenantSlotStore.queue_checked``."""
        key = (definition, tenant)
        with self._lock:
            if due is not None:
                self.due[key] = due
            elif self.tickets.get(key, 0) == seen_ticket:
                self.due.pop(key, None)

    def due_queues(self, before: int, limit: int) -> list[tuple[str, str]]:
        """See ``TenantSlotStore.due_queues``."""
        with self._lock:
            return sorted((key for key, due in self.due.items() if due < before), key=lambda k: self.due[k])[:limit]


class InMemoryBatchStore:
    """A thread-safe ``BatchStore`` in memory, with the DynamoDB adapter's conditions (a batch's writes conditional
    on its version, a claim's page and batch written together or not at all)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.batches: dict[str, Batch] = {}
        self.page_items: dict[tuple[str, int], BatchPage] = {}

    def create(self, batch: Batch) -> Batch:
        """See ``BatchStore.create``."""
        with self._lock:
            if batch.batch_id in self.batches:
                raise ConditionFailedError(f"batch {batch.batch_id} exists")
            stored = replace(batch, version=1)
            self.batches[batch.batch_id] = stored
            return stored

    def get(self, batch_id: str, *, consistent: bool = False) -> Batch | None:
        """See ``BatchStore.get``."""
        with self._lock:
            return self.batches.get(batch_id)

    def _check(self, batch: Batch, expect: int) -> None:
        stored = self.batches.get(batch.batch_id)
        if stored is None or stored.version != expect:
            raise ConditionFailedError(f"batch {batch.batch_id} is not at version {expect}")

    def put(self, batch: Batch, *, expect: int) -> Batch:
        """See ``BatchStore.put``."""
        with self._lock:
            self._check(batch, expect)
            stored = replace(batch, version=expect + 1)
            self.batches[batch.batch_id] = stored
            return stored

    def claim(self, batch: Batch, page: BatchPage) -> Batch:
        """See ``BatchStore.claim``."""
        with self._lock:
            self._check(batch, batch.version)
            if (page.batch_id, page.number) in self.page_items:
                raise ConditionFailedError(f"page {page.number} of batch {page.batch_id} exists")
            self.page_items[(page.batch_id, page.number)] = page
            return self.put(batch, expect=batch.version)

    def settle(self, batch: Batch, page: BatchPage) -> Batch:
        """See ``BatchStore.settle``."""
        with self._lock:
            self._check(batch, batch.version)
            self.page_items[(page.batch_id, page.number)] = page
            return self.put(batch, expect=batch.version)

    def page(self, batch_id: str, number: int) -> BatchPage | None:
        """See ``BatchStore.page``."""
        with self._lock:
            return self.page_items.get((batch_id, number))

    def pages(self, batch_id: str) -> Iterator[BatchPage]:
        """See ``BatchStore.pages``."""
        with self._lock:
            found = sorted((n, p) for (b, n), p in self.page_items.items() if b == batch_id)
        for _, page in found:
            yield page

    def list(self, limit: int, start: Any | None) -> tuple[list[Batch], Any | None]:
        """See ``BatchStore.list`` (``start``: how many to skip)."""
        with self._lock:
            ordered = sorted(self.batches.values(), key=lambda b: (-b.created_at, b.batch_id))
        skip = int(start or 0)
        chunk = ordered[skip : skip + limit]
        return chunk, (skip + limit if skip + limit < len(ordered) else None)
