"""The state store on DynamoDB (single table; see template.yaml ``StateTable``).

Items
-----
- workflow: ``pk = "WF#<id>"``, ``sk = "#WF"``. One item holds the workflow and the state of all its steps (the
  ``steps`` map), with a ``version`` that grows by one with every write. While the workflow is not terminal it
  carries ``dl_shard`` and ``complete_by`` (the earliest complete-by among its steps in flight), so it sits in the
  sparse, sharded deadline index (DESIGN Rule 3); the index projects only its keys.
- definition: ``pk = "DEF#<content id>"``, ``sk = "#DEF"``: a definition, zlib-compressed JSON, written once and
  shared by every workflow that runs it. A workflow item names it by ``definition_id``.
- lease: ``pk = "LEASE#<name>"``, ``sk = "#LEASE"``.

Why one item per workflow: DynamoDB bills a write per 1 KB of item and every index key it moves. With one item, a
transition (apply a reply, dispatch the next step, move the deadline) is one write of a small item, where a step per
item needed the step's completion, the next step's dispatch and an index entry for each. A step input is not stored:
it is rendered again from the definition when it is needed (``Snapshot.input_of``).

Documents (input, output, error) are stored as JSON strings, which keeps floats and nesting exact. Every write is
conditional (Rule 2); ``ConditionalCheckFailedException`` becomes ``ConditionFailedError``.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import boto3
from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from ..cost import Tally, ledger, meter, write_units
from ..cost import item_size as _wire_size
from ..definition import WorkflowDefinition
from ..errors import ConditionFailedError, InvalidCursorError, LeaseNotAcquiredError, PayloadTooLargeError
from ..fanout import MapProgress, ParentRef
from ..ports import WorkflowSummary
from ..records import (
    DeadlineEntry,
    Snapshot,
    StepRecord,
    TriggerRef,
    WorkflowRecord,
    check_deadlines,
    check_snapshot_transition,
    deadline_shard,
)
from ..registry import DefinitionNameTakenError, NameRecord, VersionRecord
from ..states import StepStatus, WorkflowStatus
from . import batch_get, condition_failed

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

#: DynamoDB's maximum item size, 400 KB, counting attribute names and values
#: (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html).
DYNAMODB_MAX_ITEM_BYTES = 400 * 1024
DEADLINE_INDEX = "deadline-index"
ATTENTION_INDEX = "attention-index"
TRIGGER_INDEX = "trigger-index"
WORKFLOW_PREFIX = "WF#"
WORKFLOW_SORT_KEY = "#WF"
_DEF_PREFIX = "DEF#"
#: Registered definitions (registry.py): the names' partition, and each name's versions.
_DEFNAMES = "DEFNAMES"
_DEFNAME_PREFIX = "DEFNAME#"
_DEF_SK = "#DEF"

#: The attributes and types of a page's LastEvaluatedKey: the table's keys, plus the index's on an index query.
_TABLE_KEY = {"pk": "S", "sk": "S"}
_ATTENTION_KEY = {**_TABLE_KEY, "attn": "S", "attn_since": "N"}
_TRIGGER_KEY = {**_TABLE_KEY, "trg": "S", "created_at": "N"}
_DEADLINE_KEY = {**_TABLE_KEY, "dl_shard": "S", "complete_by": "N"}
#: Rounds of BatchGetItem for one chunk of keys before unprocessed keys are reported (DynamoDB returns keys it did
#: not read under throttling; the SDK guide advises asking again, with backoff, which botocore's retries give).
_BATCH_GET_ROUNDS = 5
#: What a summary (``ports.WorkflowSummary``) reads of a workflow's item.
_SUMMARY_ATTRIBUTES = (
    "pk, #status, dname, created_at, complete_by, trouble, attn, attn_since, reason, trg, #owner, dver, errs, esteps, "
    "cost"
)
#: ``status`` and ``owner`` are DynamoDB reserved words.
_SUMMARY_NAMES = {"#status": "status", "#owner": "owner"}

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def dynamodb_client() -> DynamoDBClient:
    """Create a DynamoDB client (at the edge, after the endpoint or moto is set up), its work counted on the ledger
    of the workflow it is for (`sasflow.cost.meter`)."""
    return meter(boto3.client("dynamodb"))  # type: ignore[no-any-return]


def workflow_key(workflow_id: str) -> dict[str, Any]:
    """The DynamoDB key (``{"pk": {"S": ...}, "sk": {"S": ...}}``) of a workflow's item."""
    return _ser({"pk": WORKFLOW_PREFIX + workflow_id, "sk": WORKFLOW_SORT_KEY})


def _start_key(start: Any, shape: dict[str, str], partition: dict[str, str]) -> dict[str, Any]:
    """``start`` as the ExclusiveStartKey of a listing whose pages end with keys of ``shape`` (attribute -> DynamoDB
    type) in the index partition ``partition`` (attribute -> value), or the refusal of a cursor the listing never
    produced. DynamoDB answers a start key of another shape, type or partition with a ValidationException, which
    would reach the caller as a 500 (issue 19).

    Raises
    ------
    InvalidCursorError
        When ``start`` is not such a key.
    """
    refused = InvalidCursorError("the cursor is not one this API gave")
    if not isinstance(start, dict) or set(start) != set(shape):
        raise refused
    for name, kind in shape.items():
        value = start[name]
        if not isinstance(value, dict) or list(value) != [kind] or not isinstance(value[kind], str):
            raise refused
        if kind == "N":
            try:
                Decimal(value[kind])
            except ArithmeticError:
                raise refused from None
    if any(start[name][shape[name]] != expected for name, expected in partition.items()):
        raise refused
    if not start["pk"]["S"].startswith(WORKFLOW_PREFIX) or start["sk"]["S"] != WORKFLOW_SORT_KEY:
        raise refused
    return start


def _ser(item: dict[str, Any]) -> dict[str, Any]:
    return {k: _serializer.serialize(v) for k, v in item.items() if v is not None}


def _de(item: dict[str, Any]) -> dict[str, Any]:
    return {k: _plain(_deserializer.deserialize(v)) for k, v in item.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value)
    if isinstance(value, Binary):
        return bytes(value)  # type: ignore[call-overload]  # Binary defines __bytes__; its stub does not
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def pack_definition(definition: WorkflowDefinition) -> bytes:
    """A definition as stored: its JSON, zlib-compressed (a Binary attribute)."""
    return zlib.compress(definition.model_dump_json(exclude_none=True).encode(), 9)


@functools.lru_cache(maxsize=256)
def unpack_definition(packed: bytes) -> WorkflowDefinition:
    """Parse a stored definition once per Lambda sandbox (definitions are immutable; many workflows share one).

    Raises
    ------
    zlib.error, pydantic.ValidationError
        When the stored bytes are not a compressed, valid definition.
    """
    return WorkflowDefinition.model_validate_json(zlib.decompress(packed))


def _doc(value: Any) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _undoc(value: str | None) -> Any:
    return None if value is None else json.loads(value)


def item_size(item: dict[str, Any]) -> int:
    """Approximate size of a plain (not yet serialised) item in bytes, by DynamoDB's rules.

    Strings count their UTF-8 length, numbers about one byte per two digits plus one, booleans and nulls one byte;
    every attribute name counts its UTF-8 length; a map is 3 bytes plus 1 per element plus its names and values.
    """
    total = 0
    for name, value in item.items():
        if value is None:
            continue
        total += len(name.encode()) + _value_size(value)
    return total


def _value_size(value: Any) -> int:
    if isinstance(value, bool):
        return 1
    if isinstance(value, (int, float, Decimal)):
        return len(str(value).lstrip("-").replace(".", "")) // 2 + 2
    if isinstance(value, str):
        return len(value.encode("utf-8"))
    if isinstance(value, bytes | bytearray):
        return len(value)
    if isinstance(value, dict):
        return 3 + sum(len(str(k).encode()) + _value_size(v) + 1 for k, v in value.items() if v is not None)
    if isinstance(value, (list, tuple)):
        return 3 + sum(_value_size(v) + 1 for v in value)
    return len(str(value).encode())


def _check_size(item: dict[str, Any], what: str) -> None:
    size = item_size(item)
    if size > DYNAMODB_MAX_ITEM_BYTES:
        raise PayloadTooLargeError(what, size, DYNAMODB_MAX_ITEM_BYTES)


#: The state table's global secondary indexes (template.yaml StateTable): their keys and projected attributes.
_INDEXES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    DEADLINE_INDEX: (("dl_shard", "complete_by"), ("status", "dname", "created_at", "trouble")),
    ATTENTION_INDEX: (("attn", "attn_since"), ("status", "dname", "created_at", "trouble", "reason")),
    TRIGGER_INDEX: (("trg", "created_at"), ()),
}


def _index_units(old: dict[str, Any] | None, new: dict[str, Any]) -> int:
    """WRU a write that turns ``old`` into ``new`` (DynamoDB JSON) spends on the indexes: an entry put or removed
    costs 1 WRU per KB of its projection, a moved key both, a changed projection under the same key an update."""
    units = 0
    for keys, projected in _INDEXES.values():
        names = ("pk", "sk", *keys, *projected)
        entries = [
            None if image is None or not all(k in image for k in keys) else {n: image[n] for n in names if n in image}
            for image in (old, new)
        ]
        before, after = entries
        if before is not None and after is not None and all(before[k] == after[k] for k in keys):
            if before != after:
                units += write_units(max(_wire_size(before), _wire_size(after)))
            continue
        units += sum(write_units(_wire_size(entry)) for entry in entries if entry is not None)
    return units


def _step_doc(record: StepRecord) -> dict[str, Any]:
    """A step's entry in the ``steps`` map; attributes at their default are left out (they cost bytes)."""
    doc: dict[str, Any] = {"status": record.status.value, "attempt": record.attempt}
    if record.comp_attempt:
        doc["comp_attempt"] = record.comp_attempt
    if record.complete_by is not None:
        doc["complete_by"] = record.complete_by
    if record.may_have_happened:
        doc["may_have_happened"] = True
    if record.resends:
        doc["resends"] = record.resends
    if record.deferrals:
        doc["deferrals"] = record.deferrals
    if record.comp_deferrals:
        doc["comp_deferrals"] = record.comp_deferrals
    if record.limit_deferrals:
        doc["limit_deferrals"] = record.limit_deferrals
    for name in ("attempt_base", "comp_attempt_base", "comp_since", "generation"):
        if getattr(record, name):
            doc[name] = getattr(record, name)
    doc["input_override"] = _doc(record.input_override)
    doc["output"] = _doc(record.output)
    doc["error"] = _doc(record.error)
    doc["comp_output"] = _doc(record.comp_output)
    doc["comp_error"] = _doc(record.comp_error)
    doc["callback_nonce"] = record.callback_nonce
    doc["answer"] = _doc(record.answer)
    doc["timer_at"] = record.timer_at
    doc["map"] = record.map.doc() if record.map is not None else None
    doc["comp_map"] = record.comp_map.doc() if record.comp_map is not None else None
    return {k: v for k, v in doc.items() if v is not None}


def _step_record(name: str, doc: dict[str, Any]) -> StepRecord:
    return StepRecord(
        step=name,
        status=StepStatus(doc["status"]),
        attempt=doc.get("attempt", 0),
        comp_attempt=doc.get("comp_attempt", 0),
        complete_by=doc.get("complete_by"),
        output=_undoc(doc.get("output")),
        error=_undoc(doc.get("error")),
        may_have_happened=bool(doc.get("may_have_happened", False)),
        resends=doc.get("resends", 0),
        deferrals=doc.get("deferrals", 0),
        comp_deferrals=doc.get("comp_deferrals", 0),
        limit_deferrals=doc.get("limit_deferrals", 0),
        comp_output=_undoc(doc.get("comp_output")),
        comp_error=_undoc(doc.get("comp_error")),
        attempt_base=doc.get("attempt_base", 0),
        comp_attempt_base=doc.get("comp_attempt_base", 0),
        comp_since=doc.get("comp_since"),
        generation=doc.get("generation", 0),
        input_override=_undoc(doc.get("input_override")),
        callback_nonce=doc.get("callback_nonce"),
        answer=_undoc(doc.get("answer")),
        timer_at=doc.get("timer_at"),
        map=MapProgress.from_doc(_plain(doc.get("map"))),
        comp_map=MapProgress.from_doc(_plain(doc.get("comp_map"))),
    )


def workflow_item(snapshot: Snapshot, *, version: int, shards: int) -> dict[str, Any]:
    """Convert a snapshot to its plain item (before DynamoDB serialisation), stored at ``version``.

    ``dl_shard`` and ``complete_by`` (the deadline index's keys) are present exactly while the workflow is not
    terminal; ``expires_at`` (the table's TTL attribute) once it is.

    Raises
    ------
    TypeError, ValueError
        When a complete-by is not an int of epoch seconds (`check_deadlines`).
    """
    check_deadlines(snapshot)
    workflow = snapshot.workflow
    item: dict[str, Any] = {
        "pk": WORKFLOW_PREFIX + workflow.workflow_id,
        "sk": WORKFLOW_SORT_KEY,
        "version": version,
        "status": workflow.status.value,
        "definition_id": workflow.definition.content_id,
        "input": _doc(workflow.input),
        # 32 bytes, not 64 hex characters: every write of the item is billed by the KB (items written before
        # 2026-12-07 hold the hex; snapshot_from_item reads both)
        "request_hash": _hash_bytes(workflow.request_hash),
        "created_at": workflow.created_at,
        "updated_at": workflow.updated_at,
        "idempotency_key": workflow.idempotency_key,
        "owner": workflow.owner,
        "reason": workflow.reason,
        "paused": True if workflow.paused else None,
        "hold_until": workflow.hold_until,
        "cc": True if workflow.claim_checked else None,
        # Projected into the deadline index, so /ops lists and counts workflows in flight from it.
        "dname": workflow.definition.name,
        # Read by the operators' listings from the item (current), never projected: found by version, error code and
        # step (items written before 2026-12-08 have no esteps until their next write).
        "dver": workflow.definition.version,
        "errs": list(snapshot.error_codes) or None,
        "esteps": list(snapshot.error_steps) or None,
        "trouble": snapshot.trouble or None,
        # The sparse attention index: present only while the workflow waits for a person.
        "attn": workflow.attention,
        "attn_since": workflow.attention_since,
        "expires_at": workflow.expires_at,
        "parent": workflow.parent.doc() if workflow.parent is not None else None,
        "trigger": workflow.trigger.doc() if workflow.trigger is not None else None,
        # The sparse trigger index's key: only a workflow a trigger started carries it (sasflow list --trigger).
        "trg": workflow.trigger.name if workflow.trigger is not None else None,
        # The tenant whose slot it holds (sasflow.tenancy), given back when it ends.
        "tenant": workflow.tenant,
        # Its ticket in its tenant's queue, when it was started QUEUED (sasflow.tenancy).
        "ticket": workflow.queue_ticket,
        # The priority it was started with, when not the default (sasflow.tenancy.DEFAULT_PRIORITY)
        "prio": workflow.priority,
        "steps": {name: _step_doc(record) for name, record in snapshot.steps.items()},
        # The history, one event a line (history.py): written by the same conditional write as the state.
        "h": "\n".join(snapshot.history) or None,
        # What the workflow's work has cost (sasflow.cost): 45 bytes whatever the values
        "cost": snapshot.cost.pack(),
    }
    deadline = snapshot.stored_key
    if deadline is not None:
        item["complete_by"] = deadline
        item["dl_shard"] = deadline_shard(workflow.workflow_id, shards)
    return {k: v for k, v in item.items() if v is not None}


def _hash_bytes(request_hash: str) -> bytes | str:
    """A request hash as stored: its bytes when it is hex (every hash the engine makes), else as it is."""
    try:
        return bytes.fromhex(request_hash)
    except ValueError:
        return request_hash


def _hash_hex(stored: bytes | str) -> str:
    """A stored request hash as the engine compares it (hex)."""
    return stored.hex() if isinstance(stored, bytes | bytearray) else stored


def snapshot_from_item(item: dict[str, Any], definition: WorkflowDefinition) -> Snapshot:
    """Convert a plain workflow item (and its definition) back to a snapshot."""
    workflow = WorkflowRecord(
        workflow_id=item["pk"][len(WORKFLOW_PREFIX) :],
        status=WorkflowStatus(item["status"]),
        definition=definition,
        input=_undoc(item.get("input")) or {},
        request_hash=_hash_hex(item["request_hash"]),
        created_at=item["created_at"],
        updated_at=item["updated_at"],
        idempotency_key=item.get("idempotency_key"),
        owner=item.get("owner"),
        reason=item.get("reason"),
        paused=bool(item.get("paused", False)),
        hold_until=item.get("hold_until"),
        claim_checked=bool(item.get("cc", False)),
        attention=item.get("attn"),
        attention_since=item.get("attn_since"),
        expires_at=item.get("expires_at"),
        parent=ParentRef.from_doc(_plain(item.get("parent"))),
        trigger=TriggerRef.from_doc(_plain(item.get("trigger"))),
        tenant=item.get("tenant"),
        queue_ticket=item.get("ticket"),
        priority=item.get("prio"),
    )
    steps = {name: _step_record(name, doc) for name, doc in (item.get("steps") or {}).items()}
    history = tuple(item["h"].split("\n")) if item.get("h") else ()
    snapshot = Snapshot(workflow, steps, version=item["version"], history=history, cost=Tally.unpack(item.get("cost")))
    key = item.get("complete_by")
    return snapshot.with_index_key(int(key)) if key is not None and snapshot.deadline is not None else snapshot


def _summary(item: dict[str, Any]) -> WorkflowSummary:
    """A workflow summary from an index entry or a projected item (plain values)."""
    return WorkflowSummary(
        workflow_id=item["pk"][len(WORKFLOW_PREFIX) :],
        status=item.get("status", ""),
        definition_name=item.get("dname", ""),
        created_at=item.get("created_at", 0),
        complete_by=item.get("complete_by"),
        trouble=item.get("trouble", 0),
        attention=item.get("attn"),
        attention_since=item.get("attn_since"),
        reason=item.get("reason"),
        trigger=item.get("trg"),
        owner=item.get("owner"),
        definition_version=item.get("dver"),
        error_codes=tuple(item.get("errs") or ()),
        error_steps=tuple(item.get("esteps") or ()),
        cost=Tally.unpack(item["cost"]).dollars() if item.get("cost") else None,
    )


def _version_record(item: dict[str, Any]) -> VersionRecord:
    return VersionRecord(
        version=int(item["sk"].removeprefix("V#")),
        content_id=item["content_id"],
        owner=item["owner"],
        created_at=int(item["created_at"]),
    )


def _name_record(item: dict[str, Any]) -> NameRecord:
    return NameRecord(
        name=item["sk"], owner=item["owner"], latest=int(item["latest"]), created_at=int(item["created_at"])
    )


#: Definitions one store instance remembers as stored (by content id); they never change.
_MAX_KNOWN_DEFINITIONS = 256


class DynamoDBStateStore:
    """``StateStore`` over one DynamoDB table.

    Parameters
    ----------
    table_name:
        The state table (template.yaml ``StateTable``).
    client:
        A boto3 DynamoDB client; injected so tests and the local stack choose the endpoint.
    shards:
        Partitions of the deadline index (template parameter ``DeadlineShards``).
    """

    def __init__(self, table_name: str, client: DynamoDBClient, *, shards: int = 8) -> None:
        self.table = table_name
        self.client = client
        self.shards = shards
        self._stored: dict[str, WorkflowDefinition] = {}

    # -- definitions
    def _ensure_definition(self, definition: WorkflowDefinition) -> None:
        """Store ``definition`` under its content id unless it is known to be stored.

        An eventually consistent GetItem of the key first (half a read unit) costs a tenth of a conditional write
        that fails (a failed condition is billed as a write), and most starts run a definition that is stored.
        Once stored or seen, a definition is not looked up again by this store (it never changes).
        """
        content_id = definition.content_id
        if content_id in self._stored:
            return
        key = _ser({"pk": _DEF_PREFIX + content_id, "sk": _DEF_SK})
        found = self.client.get_item(TableName=self.table, Key=key, ProjectionExpression="pk").get("Item")
        if not found:
            item = {
                "pk": _DEF_PREFIX + content_id,
                "sk": _DEF_SK,
                "name": definition.name,
                "definition_version": definition.version,
                "definition_z": pack_definition(definition),
            }
            _check_size(item, "definition item")
            # Equal content, equal id: when two writers race, whoever writes first wins and both wrote the same.
            self._put_new(item)
        self._know(definition)

    def _put_new(self, item: dict[str, Any]) -> bool:
        """PutItem only if no item has this key (``item_is_new``); return False when one exists (nothing written)."""
        try:
            self.client.put_item(TableName=self.table, Item=_ser(item), ConditionExpression="attribute_not_exists(pk)")
        except ClientError as exc:
            if condition_failed(exc):
                return False
            raise
        return True

    # -- definitions by name and version (registry.py)
    def put_definition_version(
        self, name: str, version: int, definition: WorkflowDefinition, *, owner: str, now: int
    ) -> tuple[bool, VersionRecord]:
        """Register ``name`` version ``version``; return (created, the version as stored).

        The name's item is claimed for ``owner`` first (conditional: a name published by another principal is
        refused), then the version's item is written only if it does not exist: an existing one is returned as it
        is, and the caller compares its content. The name's latest version then moves up, never down.

        Raises
        ------
        DefinitionNameTakenError
            When the name belongs to another principal.
        """
        name_key = _ser({"pk": _DEFNAMES, "sk": name})
        try:
            self.client.update_item(
                TableName=self.table,
                Key=name_key,
                UpdateExpression=(
                    "SET #owner = if_not_exists(#owner, :owner), created_at = if_not_exists(created_at, :now)"
                ),
                ConditionExpression="attribute_not_exists(pk) OR #owner = :owner",
                ExpressionAttributeNames={"#owner": "owner"},
                ExpressionAttributeValues=_ser({":owner": owner, ":now": now}),
            )
        except ClientError as exc:
            if condition_failed(exc):
                raise DefinitionNameTakenError(name) from None
            raise
        self._ensure_definition(definition)
        item = {
            "pk": _DEFNAME_PREFIX + name,
            "sk": f"V#{version:010d}",
            "content_id": definition.content_id,
            "owner": owner,
            "created_at": now,
        }
        created = self._put_new(item)
        if not created:
            found = self.client.get_item(
                TableName=self.table, Key=_ser({"pk": item["pk"], "sk": item["sk"]}), ConsistentRead=True
            )["Item"]
            item = _de(found)
        try:
            self.client.update_item(
                TableName=self.table,
                Key=name_key,
                UpdateExpression="SET latest = :v",
                ConditionExpression="attribute_not_exists(latest) OR latest < :v",
                ExpressionAttributeValues=_ser({":v": version}),
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise  # a later version is the latest already: nothing to move
        return created, _version_record(item)

    def definition_name(self, name: str) -> NameRecord | None:
        """The registered name ``name``, or None."""
        found = self.client.get_item(
            TableName=self.table, Key=_ser({"pk": _DEFNAMES, "sk": name}), ConsistentRead=True
        ).get("Item")
        if found is None or "latest" not in found:
            return None
        return _name_record(_de(found))

    def definition_names(self) -> list[NameRecord]:
        """Every registered name (every page of their one partition)."""
        names = []
        for page in self.client.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues=_ser({":pk": _DEFNAMES}),
        ):
            names += [_name_record(_de(item)) for item in page["Items"] if "latest" in item]
        return names

    def definition_versions(self, name: str) -> list[VersionRecord]:
        """The versions of ``name``, oldest first (every page)."""
        versions = []
        for page in self.client.get_paginator("query").paginate(
            TableName=self.table,
            KeyConditionExpression="pk = :pk",
            ExpressionAttributeValues=_ser({":pk": _DEFNAME_PREFIX + name}),
        ):
            versions += [_version_record(_de(item)) for item in page["Items"]]
        return versions

    def definition_version(self, name: str, version: int) -> WorkflowDefinition | None:
        """The definition registered as ``name`` version ``version``, or None."""
        found = self.client.get_item(
            TableName=self.table, Key=_ser({"pk": _DEFNAME_PREFIX + name, "sk": f"V#{version:010d}"})
        ).get("Item")
        return None if found is None else self._definition(_de(found)["content_id"])

    def _know(self, definition: WorkflowDefinition) -> None:
        if len(self._stored) >= _MAX_KNOWN_DEFINITIONS:
            self._stored.pop(next(iter(self._stored)))
        self._stored[definition.content_id] = definition

    def _definition(self, content_id: str) -> WorkflowDefinition:
        known = self._stored.get(content_id)
        if known is not None:
            return known
        response = self.client.get_item(
            TableName=self.table, Key=_ser({"pk": _DEF_PREFIX + content_id, "sk": _DEF_SK}), ConsistentRead=True
        )
        item = response.get("Item")
        if item is None:
            raise LookupError(f"definition {content_id} is not stored")
        definition = unpack_definition(_de(item)["definition_z"])
        self._know(definition)
        return definition

    def from_item(self, raw: dict[str, Any]) -> Snapshot:
        """Convert a raw workflow item (DynamoDB JSON, from GetItem or Scan) to a snapshot.

        Raises
        ------
        LookupError
            When the definition the item names is not stored.
        """
        item = _de(raw)
        return snapshot_from_item(item, self._definition(item["definition_id"]))

    # -- workflows
    def create(self, snapshot: Snapshot) -> Snapshot:
        """Write the definition if it is new, then the workflow with one conditional PutItem (see ``StateStore``).

        The item's ``cost`` is what the workflow's work owes so far (`sasflow.cost.Ledger.take`) and this write."""
        item = workflow_item(snapshot, version=1, shards=self.shards)
        _check_size(item, "workflow item")
        self._ensure_definition(snapshot.workflow.definition)
        workflow_id = snapshot.workflow.workflow_id
        owed, item = self._with_cost(workflow_id, snapshot.cost, None, item)
        # A repeated start with the same Idempotency-Key (the same workflow id) fails here and writes nothing.
        with ledger().precounted():
            created = self._put_new(item)
        if not created:
            ledger().give_back(workflow_id, owed)
            raise ConditionFailedError(f"workflow {workflow_id} exists")
        return replace(snapshot, version=1, cost=snapshot.cost + owed)

    def _with_cost(
        self, workflow_id: str, stored: Tally, before: dict[str, Any] | None, item: dict[str, Any]
    ) -> tuple[Tally, dict[str, Any]]:
        """What this write of ``workflow_id``'s item owes (its pending work and the write itself, billed as DynamoDB
        bills it: the larger of ``before`` and the new item, plus the index entries it moves), and the item with its
        ``cost`` so far plus that."""
        old = _ser(before) if before is not None else None
        new = _ser(item)  # its cost is 45 bytes whatever the values: the size does not depend on what is added
        units = write_units(max(_wire_size(old) if old else 0, _wire_size(new))) + _index_units(old, new)
        owed = ledger().take(workflow_id) + Tally(wru=units)
        return owed, {**item, "cost": (stored + owed).pack()}

    def load(self, workflow_id: str, *, consistent: bool = True) -> Snapshot | None:
        """Read the workflow's item with one GetItem, strongly consistent unless asked (see ``StateStore``)."""
        response = self.client.get_item(TableName=self.table, Key=workflow_key(workflow_id), ConsistentRead=consistent)
        item = response.get("Item")
        return self.from_item(item) if item else None

    def load_many(self, workflow_ids: Sequence[str]) -> dict[str, Snapshot]:
        """Read many workflows with BatchGetItem, 100 keys a call, eventually consistent (see ``StateStore``).

        Keys DynamoDB leaves unprocessed (throttling) are asked again with a backoff (1, 2, 4 ... 64 ms).
        """
        items, _ = self._batch_get(workflow_ids, rounds=8)
        snapshots = (self.from_item(item) for item in items)
        return {snapshot.workflow.workflow_id: snapshot for snapshot in snapshots}

    def _batch_get(
        self, workflow_ids: Sequence[str], *, rounds: int, **options: Any
    ) -> tuple[list[dict[str, Any]], bool]:
        """The workflow items of ``workflow_ids`` (each id once), by BatchGetItem of 100 keys a call (its limit), with
        ``options`` (``ConsistentRead``, a projection) on every call.

        Keys DynamoDB leaves unprocessed (throttling) are asked again with a backoff (1, 2, 4 ... ms; BatchGetItem's
        documented advice), at most ``rounds`` calls per 100 keys. Returns the raw items, and whether keys were
        still unprocessed after every round.
        """
        keys = [workflow_key(workflow_id) for workflow_id in dict.fromkeys(workflow_ids)]
        items, left = batch_get(self.client, self.table, keys, rounds=rounds, **options)
        return items, bool(left)

    def save(self, snapshot: Snapshot, expect: Snapshot) -> Snapshot:
        """Replace the workflow's item if it is still at ``expect.version`` (see ``StateStore``)."""
        check_snapshot_transition(expect, snapshot)
        version = expect.version + 1
        item = workflow_item(snapshot, version=version, shards=self.shards)
        _check_size(item, "workflow item")
        workflow_id = snapshot.workflow.workflow_id
        before = workflow_item(expect, version=expect.version, shards=self.shards)
        owed, item = self._with_cost(workflow_id, expect.cost, before, item)
        try:
            with ledger().precounted():
                self.client.put_item(
                    TableName=self.table,
                    Item=_ser(item),
                    # version_matches: the timeline this protects is
                    #   read(v) ... [another writer (a reply, the supervisor, a cancel) stores v+1] ... our write of
                    #   v+1
                    # so whoever read an older state loses and decides again from the new one.
                    ConditionExpression="version = :expect",
                    ExpressionAttributeValues=_ser({":expect": expect.version}),
                )
        except ClientError as exc:
            # a failed condition is billed too: the next write of this workflow carries it
            ledger().give_back(workflow_id, owed)
            if condition_failed(exc):
                raise ConditionFailedError(f"workflow {workflow_id} changed since version {expect.version}") from exc
            raise
        return replace(snapshot, version=version, cost=expect.cost + owed)

    def workflows(self) -> Iterator[Snapshot]:
        """Every stored workflow, by a strongly consistent Scan of the whole table (every page).

        For operators' tools, reports and tests; the engine never scans. Definitions are read once each.
        """
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "ConsistentRead": True,
            "FilterExpression": "sk = :wf",
            "ExpressionAttributeValues": _ser({":wf": WORKFLOW_SORT_KEY}),
        }
        for page in self.client.get_paginator("scan").paginate(**kwargs):
            for raw in page.get("Items", []):
                yield self.from_item(raw)

    # -- deadline index
    def overdue(self, shard: str, before: int, limit: int, start: Any | None) -> tuple[list[DeadlineEntry], Any | None]:
        """Query one page of the sparse deadline index for entries with ``complete_by < before``."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": DEADLINE_INDEX,
            "KeyConditionExpression": "dl_shard = :shard AND complete_by < :before",
            "ExpressionAttributeValues": _ser({":shard": shard, ":before": before}),
            "Limit": limit,
        }
        if start is not None:
            kwargs["ExclusiveStartKey"] = start
        response = self.client.query(**kwargs)
        entries = []
        for raw in response.get("Items", []):
            item = _de(raw)
            if item["pk"].startswith(WORKFLOW_PREFIX):
                entries.append(DeadlineEntry(item["pk"][len(WORKFLOW_PREFIX) :], item["complete_by"]))
        return entries, response.get("LastEvaluatedKey")

    # -- the operators' queries (finding.WorkflowFinder)
    def attention(self, kind: str, limit: int, start: Any | None) -> tuple[list[WorkflowSummary], Any | None]:
        """Query the sparse attention index for ``kind`` (see ``ports.WorkflowIndex``)."""
        return self._newest_first(ATTENTION_INDEX, "attn", kind, _ATTENTION_KEY, limit, start)

    def _newest_first(
        self, index: str, attribute: str, value: str, shape: dict[str, str], limit: int, start: Any | None
    ) -> tuple[list[WorkflowSummary], Any | None]:
        """One page of a sparse index's partition ``attribute = value``, its sort key descending; ``shape`` is its
        page keys' (a cursor of another shape or partition is refused, `_start_key`)."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": index,
            "KeyConditionExpression": f"{attribute} = :value",
            "ExpressionAttributeValues": _ser({":value": value}),
            "ScanIndexForward": False,
            "Limit": limit,
        }
        if start is not None:
            kwargs["ExclusiveStartKey"] = _start_key(start, shape, {attribute: value})
        response = self.client.query(**kwargs)
        return [_summary(_de(raw)) for raw in response.get("Items", [])], response.get("LastEvaluatedKey")

    def count_attention(self, kind: str) -> int:
        """Count the attention index's entries for ``kind`` (every page)."""
        total = 0
        paginator = self.client.get_paginator("query")
        for page in paginator.paginate(
            TableName=self.table,
            IndexName=ATTENTION_INDEX,
            KeyConditionExpression="attn = :kind",
            ExpressionAttributeValues=_ser({":kind": kind}),
            Select="COUNT",
        ):
            total += int(page.get("Count", 0))
        return total

    def in_flight(
        self, shard: str, limit: int, start: Any | None, before: int | None
    ) -> tuple[list[WorkflowSummary], Any | None]:
        """Query one deadline-index shard, optionally only ``complete_by < before`` (see ``ports.WorkflowIndex``)."""
        condition = "dl_shard = :shard" + (" AND complete_by < :before" if before is not None else "")
        values: dict[str, Any] = {":shard": shard}
        if before is not None:
            values[":before"] = before
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": DEADLINE_INDEX,
            "KeyConditionExpression": condition,
            "ExpressionAttributeValues": _ser(values),
            "Limit": limit,
        }
        if start is not None:
            kwargs["ExclusiveStartKey"] = _start_key(start, _DEADLINE_KEY, {"dl_shard": shard})
        response = self.client.query(**kwargs)
        return [_summary(_de(raw)) for raw in response.get("Items", [])], response.get("LastEvaluatedKey")

    def count_in_flight(self, shard: str) -> dict[str, int]:
        """Count one deadline-index shard's entries by status (every page; only the status is read)."""
        counts: dict[str, int] = {}
        paginator = self.client.get_paginator("query")
        for page in paginator.paginate(
            TableName=self.table,
            IndexName=DEADLINE_INDEX,
            KeyConditionExpression="dl_shard = :shard",
            ExpressionAttributeValues=_ser({":shard": shard}),
            ProjectionExpression="#status",
            ExpressionAttributeNames={"#status": "status"},
        ):
            for raw in page.get("Items", []):
                status = raw["status"]["S"]
                counts[status] = counts.get(status, 0) + 1
        return counts

    def finished(self, status: str, limit: int, start: Any | None) -> tuple[list[WorkflowSummary], Any | None]:
        """Scan the table for workflows of a finished ``status`` (see ``ports.WorkflowIndex``)."""
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "FilterExpression": "sk = :wf AND #status = :status",
            "ExpressionAttributeNames": _SUMMARY_NAMES,
            "ExpressionAttributeValues": _ser({":wf": WORKFLOW_SORT_KEY, ":status": status}),
            "ProjectionExpression": _SUMMARY_ATTRIBUTES,
            "Limit": max(limit, 100),
        }
        if start is not None:
            kwargs["ExclusiveStartKey"] = _start_key(start, _TABLE_KEY, {})
        response = self.client.scan(**kwargs)
        found = response.get("Items", [])
        resume = response.get("LastEvaluatedKey")
        if len(found) > limit:
            # the scan reads at least 100 items to find a few matches: answer ``limit`` of them, and resume after the
            # last one answered (an item's key is a start key of the scan's order)
            found = found[:limit]
            resume = {"pk": found[-1]["pk"], "sk": {"S": WORKFLOW_SORT_KEY}}
        return [_summary(_de(raw)) for raw in found], resume

    def by_trigger(self, trigger: str, limit: int, start: Any | None) -> tuple[list[WorkflowSummary], Any | None]:
        """Query the sparse trigger index: the workflows ``trigger`` started, newest first (see
        ``ports.WorkflowIndex``). It holds keys only (a start writes it once, nothing after): the caller re-reads the
        page (`current`)."""
        return self._newest_first(TRIGGER_INDEX, "trg", trigger, _TRIGGER_KEY, limit, start)

    def current(self, workflow_ids: Sequence[str]) -> dict[str, WorkflowSummary]:
        """Re-read the summaries of ``workflow_ids`` from their items (see ``ports.WorkflowIndex.current``).

        BatchGetItem with ``ConsistentRead`` and the summary's attributes only, 100 keys a request (its limit);
        unprocessed keys are asked again with a backoff, at most `_BATCH_GET_ROUNDS` rounds (`_batch_get`).

        Raises
        ------
        ClientError
            DynamoDB refused the read, or keys were still unprocessed after every round (``ProvisionedThroughput``
            is not an issue on an on-demand table; a throttle that lasts is reported rather than hidden).
        """
        items, left = self._batch_get(
            workflow_ids,
            rounds=_BATCH_GET_ROUNDS,
            ConsistentRead=True,
            ProjectionExpression=_SUMMARY_ATTRIBUTES,
            ExpressionAttributeNames=_SUMMARY_NAMES,
        )
        if left:
            raise ClientError(
                {"Error": {"Code": "UnprocessedKeys", "Message": "BatchGetItem left keys unprocessed"}},
                "BatchGetItem",
            )
        summaries = (_summary(_de(raw)) for raw in items)
        return {summary.workflow_id: summary for summary in summaries}

    # -- lease
    def acquire_lease(self, name: str, owner: str, now: int, ttl_seconds: int) -> int:
        """Take the lease with a conditional update; return the fencing token (see ``StateStore``)."""
        try:
            response = self.client.update_item(
                TableName=self.table,
                Key=_ser({"pk": f"LEASE#{name}", "sk": "#LEASE"}),
                UpdateExpression="SET #owner = :owner, lease_until = :until ADD fencing :one",
                # lease_is_free: nobody holds it, it expired, or we hold it already.
                ConditionExpression="attribute_not_exists(pk) OR lease_until < :now OR #owner = :owner",
                ExpressionAttributeNames={"#owner": "owner"},
                ExpressionAttributeValues=_ser({":owner": owner, ":until": now + ttl_seconds, ":now": now, ":one": 1}),
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if condition_failed(exc):
                raise LeaseNotAcquiredError(name) from exc
            raise
        return int(_de(response["Attributes"])["fencing"])

    def release_lease(self, name: str, owner: str, now: int) -> None:
        """Expire the lease now if ``owner`` still holds it."""
        try:
            self.client.update_item(
                TableName=self.table,
                Key=_ser({"pk": f"LEASE#{name}", "sk": "#LEASE"}),
                UpdateExpression="SET lease_until = :now",
                ConditionExpression="#owner = :owner",
                ExpressionAttributeNames={"#owner": "owner"},
                ExpressionAttributeValues=_ser({":owner": owner, ":now": now - 1}),
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise
