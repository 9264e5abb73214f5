"""The state store on DynamoDB (single table; see template.yaml ``StateTable``).

Items
-----
- workflow: ``pk = "WF#<id>"``, ``sk = "#WF"``; while not terminal it carries ``dl_shard`` and ``complete_by`` (its
  safety-net stall deadline), so it sits in the deadline index too.
- step: ``pk = "WF#<id>"``, ``sk = "STEP#<name>"``; ``dl_shard`` and ``complete_by`` exist exactly while the step
  is in flight (sparse deadline index, DESIGN Rule 3).
- lease: ``pk = "LEASE#<name>"``, ``sk = "#LEASE"``.

Documents (definition, input, output, error) are stored as JSON strings, which keeps floats and nesting exact.
Every write is conditional (Rule 2); ``ConditionalCheckFailedException`` becomes ``ConditionFailedError``.
"""

from __future__ import annotations

import functools
import json
import zlib
from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import boto3
from boto3.dynamodb.types import Binary, TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError

from ..definition import WorkflowDefinition
from ..errors import ConditionFailedError, LeaseNotAcquiredError, PayloadTooLargeError
from ..records import DeadlineEntry, Snapshot, StepRecord, WorkflowRecord
from ..states import TERMINAL_WORKFLOW, StepStatus, WorkflowStatus, check_step_transition, check_workflow_transition

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

#: DynamoDB's maximum item size, 400 KB, counting attribute names and values
#: (https://docs.aws.amazon.com/amazondynamodb/latest/developerguide/ServiceQuotas.html).
DYNAMODB_MAX_ITEM_BYTES = 400 * 1024
DEADLINE_INDEX = "deadline-index"
_WF_SK = "#WF"
_STEP_PREFIX = "STEP#"

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()


def dynamodb_client() -> DynamoDBClient:
    """Create a DynamoDB client (at the edge, after the endpoint or moto is set up)."""
    return boto3.client("dynamodb")


def _pk(workflow_id: str) -> str:
    return f"WF#{workflow_id}"


def _ser(item: dict[str, Any]) -> dict[str, Any]:
    return {k: _serializer.serialize(v) for k, v in item.items() if v is not None}


def _de(item: dict[str, Any]) -> dict[str, Any]:
    out = {k: _deserializer.deserialize(v) for k, v in item.items()}
    return {k: _plain(v) for k, v in out.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value)
    if isinstance(value, Binary):
        return bytes(value)  # type: ignore[call-overload]  # Binary defines __bytes__; its stub does not
    return value


def pack_definition(definition: WorkflowDefinition) -> bytes:
    """The definition as stored in the workflow item: its JSON, zlib-compressed (a Binary attribute).

    A definition is most of a workflow item and is never queried, so compressing it keeps the item under 1 KB for
    typical sagas: every write of the workflow item then costs 1 WRU instead of 2 or more (DynamoDB bills writes
    per 1 KB of item size).
    """
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
    every attribute name counts its UTF-8 length.
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
        return 3 + sum(len(str(k).encode()) + _value_size(v) + 1 for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return 3 + sum(_value_size(v) + 1 for v in value)
    return len(str(value).encode())


def _check_size(item: dict[str, Any], what: str) -> None:
    size = item_size(item)
    if size > DYNAMODB_MAX_ITEM_BYTES:
        raise PayloadTooLargeError(what, size, DYNAMODB_MAX_ITEM_BYTES)


def _deadline(complete_by: int | None, shard: str | None) -> dict[str, Any]:
    """Return the deadline-index key attributes, checked for the types the GSI declares.

    ``complete_by`` is the index's Number range key and ``dl_shard`` its String hash key; AWS rejects wrong types
    (moto does not), so they are checked here: an int of epoch seconds and a str, both or neither.
    """
    if complete_by is None and shard is None:
        return {}
    if isinstance(complete_by, bool) or not isinstance(complete_by, int):
        raise TypeError(f"complete_by must be int epoch seconds, got {type(complete_by).__name__}")
    if not isinstance(shard, str):
        raise TypeError(f"dl_shard must be str, got {type(shard).__name__}")
    if complete_by > 10_000_000_000:
        raise ValueError("complete_by looks like milliseconds; it must be epoch seconds")
    return {"complete_by": complete_by, "dl_shard": shard}


def workflow_item(workflow: WorkflowRecord, *, shard: str | None = None) -> dict[str, Any]:
    """Convert a workflow record to a plain item (before DynamoDB serialisation)."""
    item: dict[str, Any] = {
        "pk": _pk(workflow.workflow_id),
        "sk": _WF_SK,
        "entity": "workflow",
        "workflow_id": workflow.workflow_id,
        "status": workflow.status.value,
        "definition_z": pack_definition(workflow.definition),
        "input": _doc(workflow.input),
        "request_hash": workflow.request_hash,
        "created_at": workflow.created_at,
        "updated_at": workflow.updated_at,
        "idempotency_key": workflow.idempotency_key,
        "reason": workflow.reason,
    }
    if workflow.stall_at is not None and workflow.status not in TERMINAL_WORKFLOW:
        item.update(_deadline(workflow.stall_at, shard))
    return item


def workflow_record(item: dict[str, Any]) -> WorkflowRecord:
    """Convert a plain workflow item back to a record."""
    return WorkflowRecord(
        workflow_id=item["workflow_id"],
        status=WorkflowStatus(item["status"]),
        definition=(
            unpack_definition(item["definition_z"])
            if "definition_z" in item
            else WorkflowDefinition.model_validate_json(item["definition"])  # items written before compression
        ),
        input=_undoc(item.get("input")) or {},
        request_hash=item["request_hash"],
        created_at=item["created_at"],
        updated_at=item["updated_at"],
        idempotency_key=item.get("idempotency_key"),
        reason=item.get("reason"),
        stall_at=item.get("complete_by"),
    )


def step_item(record: StepRecord) -> dict[str, Any]:
    """Convert a step record to a plain item; deadline attributes only while in flight."""
    item: dict[str, Any] = {
        "pk": _pk(record.workflow_id),
        "sk": _STEP_PREFIX + record.step,
        "entity": "step",
        "workflow_id": record.workflow_id,
        "step": record.step,
        "agent": record.agent,
        "status": record.status.value,
        "attempt": record.attempt,
        "comp_attempt": record.comp_attempt,
        "input": _doc(record.input),
        "output": _doc(record.output),
        "error": _doc(record.error),
        "comp_output": _doc(record.comp_output),
        "may_have_happened": record.may_have_happened,
        "resends": record.resends,
        "deferrals": record.deferrals,
        "updated_at": record.updated_at,
    }
    if record.in_flight:
        item.update(_deadline(record.complete_by, record.dl_shard))
    elif record.complete_by is not None:
        raise ValueError(f"step {record.step} is {record.status.value} but still has a complete-by")
    return item


def step_record(item: dict[str, Any]) -> StepRecord:
    """Convert a plain step item back to a record."""
    return StepRecord(
        workflow_id=item["workflow_id"],
        step=item["step"],
        agent=item["agent"],
        status=StepStatus(item["status"]),
        attempt=item.get("attempt", 0),
        comp_attempt=item.get("comp_attempt", 0),
        complete_by=item.get("complete_by"),
        dl_shard=item.get("dl_shard"),
        input=_undoc(item.get("input")) or {},
        output=_undoc(item.get("output")),
        error=_undoc(item.get("error")),
        comp_output=_undoc(item.get("comp_output")),
        may_have_happened=bool(item.get("may_have_happened", False)),
        resends=item.get("resends", 0),
        deferrals=item.get("deferrals", 0),
        updated_at=item.get("updated_at", 0),
    )


def _is_condition_failure(exc: ClientError) -> bool:
    code = exc.response.get("Error", {}).get("Code", "")
    if code == "ConditionalCheckFailedException":
        return True
    if code == "TransactionCanceledException":
        reasons = exc.response.get("CancellationReasons") or []
        return any(r.get("Code") == "ConditionalCheckFailed" for r in reasons) or "ConditionalCheckFailed" in str(exc)
    return False


class DynamoDBStateStore:
    """``StateStore`` over one DynamoDB table.

    Parameters
    ----------
    table_name:
        The state table (template.yaml ``StateTable``).
    client:
        A boto3 DynamoDB client; injected so tests and the local stack choose the endpoint.
    """

    def __init__(self, table_name: str, client: DynamoDBClient) -> None:
        self.table = table_name
        self.client = client

    # -- workflows
    def create_workflow(self, workflow: WorkflowRecord, steps: Sequence[StepRecord], stall_at: int, shard: str) -> None:
        """Write the workflow and its first steps in one transaction (see ``StateStore``)."""
        item = workflow_item(replace(workflow, stall_at=stall_at), shard=shard)
        _check_size(item, "workflow item")
        items = [item]
        for record in steps:
            step = step_item(record)
            _check_size(step, f"step item {record.step}")
            items.append(step)
        # Nothing may exist yet: a repeated start with the same Idempotency-Key fails here and writes nothing.
        not_exists = "attribute_not_exists(pk)"
        try:
            self.client.transact_write_items(
                TransactItems=[
                    {"Put": {"TableName": self.table, "Item": _ser(i), "ConditionExpression": not_exists}}
                    for i in items
                ]
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise ConditionFailedError(f"workflow {workflow.workflow_id} exists") from exc
            raise

    def get_workflow(self, workflow_id: str) -> WorkflowRecord | None:
        """Read the workflow item with a strongly consistent GetItem."""
        response = self.client.get_item(
            TableName=self.table,
            Key=_ser({"pk": _pk(workflow_id), "sk": _WF_SK}),
            ConsistentRead=True,
        )
        item = response.get("Item")
        return workflow_record(_de(item)) if item else None

    def load(self, workflow_id: str) -> Snapshot | None:
        """Query the workflow's partition (strongly consistent, every page) into a snapshot."""
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {
            "TableName": self.table,
            "KeyConditionExpression": "pk = :pk",
            "ExpressionAttributeValues": _ser({":pk": _pk(workflow_id)}),
            "ConsistentRead": True,
        }
        while True:
            response = self.client.query(**kwargs)
            items.extend(_de(i) for i in response.get("Items", []))
            last = response.get("LastEvaluatedKey")
            if not last:
                break
            kwargs["ExclusiveStartKey"] = last
        workflow = next((i for i in items if i["sk"] == _WF_SK), None)
        if workflow is None:
            return None
        steps = {i["step"]: step_record(i) for i in items if i["sk"].startswith(_STEP_PREFIX)}
        return Snapshot(workflow_record(workflow), steps)

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
        """Conditionally move the workflow's status (see ``StateStore``)."""
        check_workflow_transition(expect, status)
        sets = ["#status = :status", "updated_at = :now"]
        values: dict[str, Any] = {":status": status.value, ":now": now, ":expect": expect.value}
        removes: list[str] = []
        if reason is not None:
            sets.append("reason = :reason")
            values[":reason"] = reason
        if status in TERMINAL_WORKFLOW:
            removes += ["complete_by", "dl_shard"]
            if expires_at is not None:
                sets.append("expires_at = :expires")
                values[":expires"] = expires_at
        elif stall_at is not None:
            sets.append("complete_by = :stall")
            values[":stall"] = _deadline(stall_at, "00")["complete_by"]
        expression = "SET " + ", ".join(sets) + (" REMOVE " + ", ".join(removes) if removes else "")
        try:
            self.client.update_item(
                TableName=self.table,
                Key=_ser({"pk": _pk(workflow_id), "sk": _WF_SK}),
                UpdateExpression=expression,
                # status_is_expected: the transition table allows this move only from `expect`.
                ConditionExpression="#status = :expect",
                ExpressionAttributeNames={"#status": "status"},
                ExpressionAttributeValues=_ser(values),
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise ConditionFailedError(f"workflow {workflow_id} is not {expect.value}") from exc
            raise

    def push_stall_deadline(self, workflow_id: str, expect_stall_at: int, stall_at: int) -> None:
        """Move a running workflow's safety-net deadline (see ``StateStore``)."""
        try:
            self.client.update_item(
                TableName=self.table,
                Key=_ser({"pk": _pk(workflow_id), "sk": _WF_SK}),
                UpdateExpression="SET complete_by = :new",
                ConditionExpression="complete_by = :old",
                ExpressionAttributeValues=_ser(
                    {":new": _deadline(stall_at, "00")["complete_by"], ":old": expect_stall_at}
                ),
            )
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise ConditionFailedError(f"workflow {workflow_id} stall deadline moved") from exc
            raise

    # -- steps
    def put_step(self, record: StepRecord, expect: StepRecord | None) -> None:
        """Replace a step item conditionally on its expected status, attempts and complete-by."""
        check_step_transition(expect.status if expect else StepStatus.PENDING, record.status)
        item = step_item(record)
        _check_size(item, f"step item {record.step}")
        names: dict[str, str] = {}
        values: dict[str, Any] = {}
        if expect is None:
            # step_is_new: first dispatch or seal; a second dispatcher or a seal that got there first wins.
            condition = "attribute_not_exists(pk)"
        else:
            # status_is + attempt_matches + deadline_matches: the timeline this protects is
            #   read(step@attempt n) ... [another writer moves it to n+1, or completes it] ... our write
            # so a duplicate reply, a stale reply, or a second supervisor loses instead of overwriting.
            names["#status"] = "status"
            values.update({":s": expect.status.value, ":a": expect.attempt, ":ca": expect.comp_attempt})
            parts = ["#status = :s", "attempt = :a", "comp_attempt = :ca"]
            if expect.complete_by is not None:
                parts.append("complete_by = :cb")
                values[":cb"] = expect.complete_by
            else:
                parts.append("attribute_not_exists(complete_by)")
            condition = " AND ".join(parts)
        kwargs: dict[str, Any] = {"TableName": self.table, "Item": _ser(item), "ConditionExpression": condition}
        if names:
            kwargs["ExpressionAttributeNames"] = names
        if values:
            kwargs["ExpressionAttributeValues"] = _ser(values)
        try:
            self.client.put_item(**kwargs)
        except ClientError as exc:
            if _is_condition_failure(exc):
                raise ConditionFailedError(f"step {record.step} changed") from exc
            raise

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
            entries.append(
                DeadlineEntry(
                    workflow_id=item["workflow_id"],
                    step=item.get("step"),
                    attempt=item.get("attempt", 0),
                    status=item["status"],
                    complete_by=item["complete_by"],
                )
            )
        return entries, response.get("LastEvaluatedKey")

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
            if _is_condition_failure(exc):
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
            if not _is_condition_failure(exc):
                raise
