"""The tenants' items on DynamoDB, in the state table beside the workflows (``pk = "TENANCY#<definition>#<tenant>"``,
``sk = "#TENANCY"``): one attribute per workflow holding a slot (``h#<workflow id>``: since when), their count
(``n``) and when the holders were last looked at (``pruned_at``).

A slot is taken and given back by conditional writes on the holder's own attribute and the count, so two starts
never take the last slot both, and a give-back repeated changes nothing. A failed take gets the item back in the
same request (``ReturnValuesOnConditionCheckFailure``): a start that holds its slot already (a repeat) is told so
without a read. The engine's functions may touch these items only (template.yaml ``TenantSlotsPolicy``).

A tenant's queue (``over_limit: queue``) lives in the same partition: one item per queued workflow,
``sk = "Q#<ticket, 12 digits>"`` (``wid``, ``since``), so a Query of one item reads its head. The tenant's item
counts the tickets (``next_ticket``) and, while the queue is not empty, carries ``dl_shard = "TQ"`` and
``complete_by`` (when the supervisor looks at it next) and ``dname`` (the definition's name, projected by the
deadline index): the supervisor reads the due queues from that shard of the index.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ..tenancy import QUEUE_SHARD, QueueEntry, Released, TenantSlots
from . import condition_failed

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

TENANCY_PREFIX = "TENANCY#"
TENANCY_SORT_KEY = "#TENANCY"
HOLDER_PREFIX = "h#"
QUEUE_PREFIX = "Q#"
DEADLINE_INDEX = "deadline-index"


def tenancy_key(definition: str, tenant: str) -> dict[str, Any]:
    """The key of a tenant's item for one definition name."""
    return {"pk": {"S": f"{TENANCY_PREFIX}{definition}#{tenant}"}, "sk": {"S": TENANCY_SORT_KEY}}


def queue_key(definition: str, tenant: str, ticket: int) -> dict[str, Any]:
    """The key of a queued workflow's entry in its tenant's queue."""
    return {"pk": {"S": f"{TENANCY_PREFIX}{definition}#{tenant}"}, "sk": {"S": f"{QUEUE_PREFIX}{ticket:012d}"}}


class DynamoDBTenantSlotStore:
    """``tenancy.TenantSlotStore`` over DynamoDB.

    Parameters
    ----------
    table_name:
        The state table (template.yaml ``StateTable``).
    client:
        A boto3 DynamoDB client, injected.
    """

    def __init__(self, table_name: str, client: DynamoDBClient | Any) -> None:
        self.table = table_name
        self.client = client

    def take(self, definition: str, tenant: str, workflow_id: str, max_running: int, now: int) -> bool:
        """See ``TenantSlotStore.take``."""
        try:
            self.client.update_item(
                TableName=self.table,
                Key=tenancy_key(definition, tenant),
                UpdateExpression="SET #h = :now ADD n :one",
                ConditionExpression="attribute_not_exists(#h) AND (attribute_not_exists(n) OR n < :max)",
                ExpressionAttributeNames={"#h": f"{HOLDER_PREFIX}{workflow_id}"},
                ExpressionAttributeValues={
                    ":now": {"N": str(now)},
                    ":one": {"N": "1"},
                    ":max": {"N": str(max_running)},
                },
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            current: dict[str, Any] = dict(exc.response.get("Item") or {})  # type: ignore[call-overload]
            return f"{HOLDER_PREFIX}{workflow_id}" in current
        return True

    def slots(self, definition: str, tenant: str) -> TenantSlots:
        """See ``TenantSlotStore.slots``."""
        item = (
            self.client.get_item(TableName=self.table, Key=tenancy_key(definition, tenant), ConsistentRead=True).get(
                "Item"
            )
            or {}
        )
        holders = {
            name.removeprefix(HOLDER_PREFIX): int(value["N"])
            for name, value in item.items()
            if name.startswith(HOLDER_PREFIX)
        }
        due = item.get("complete_by")
        return TenantSlots(
            holders=holders,
            pruned_at=int(item.get("pruned_at", {}).get("N", "0")),
            next_ticket=int(item.get("next_ticket", {}).get("N", "0")),
            queue_due=None if due is None else int(due["N"]),
        )

    def release(self, definition: str, tenant: str, workflow_id: str) -> Released:
        """See ``TenantSlotStore.release``: the write returns the item (no extra read units), whose ``dl_shard``
        says whether its queue is in the deadline index."""
        try:
            response = self.client.update_item(
                TableName=self.table,
                Key=tenancy_key(definition, tenant),
                UpdateExpression="REMOVE #h ADD n :minus",
                ConditionExpression="attribute_exists(#h)",
                ExpressionAttributeNames={"#h": f"{HOLDER_PREFIX}{workflow_id}"},
                ExpressionAttributeValues={":minus": {"N": "-1"}},
                ReturnValues="ALL_NEW",
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            return Released(False)
        return Released(True, queue_waiting="dl_shard" in response.get("Attributes", {}))

    def claim_pruning(self, definition: str, tenant: str, now: int, every: int) -> bool:
        """See ``TenantSlotStore.claim_pruning``."""
        try:
            self.client.update_item(
                TableName=self.table,
                Key=tenancy_key(definition, tenant),
                UpdateExpression="SET pruned_at = :now",
                ConditionExpression="attribute_not_exists(pruned_at) OR pruned_at <= :before",
                ExpressionAttributeValues={":now": {"N": str(now)}, ":before": {"N": str(now - every)}},
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            return False
        return True

    def enqueue(self, definition: str, tenant: str, workflow_id: str, now: int, due: int) -> int:
        """See ``TenantSlotStore.enqueue``: the ticket first, then the entry (a start that crashed in between leaves
        a ticket unused; one that crashed after leaves an entry whose workflow never comes, dropped by `promote`)."""
        response = self.client.update_item(
            TableName=self.table,
            Key=tenancy_key(definition, tenant),
            UpdateExpression="SET dname = :name, dl_shard = :shard, complete_by = if_not_exists(complete_by, :due) "
            "ADD next_ticket :one",
            ExpressionAttributeValues={
                ":name": {"S": definition},
                ":shard": {"S": QUEUE_SHARD},
                ":due": {"N": str(due)},
                ":one": {"N": "1"},
            },
            ReturnValues="UPDATED_NEW",
        )
        ticket = int(response["Attributes"]["next_ticket"]["N"])
        self.client.put_item(
            TableName=self.table,
            Item={
                **queue_key(definition, tenant, ticket),
                "wid": {"S": workflow_id},
                "since": {"N": str(now)},
            },
        )
        return ticket

    def head(self, definition: str, tenant: str) -> QueueEntry | None:
        """See ``TenantSlotStore.head``."""
        response = self.client.query(
            TableName=self.table,
            KeyConditionExpression="pk = :pk AND begins_with(sk, :queue)",
            ExpressionAttributeValues={
                ":pk": tenancy_key(definition, tenant)["pk"],
                ":queue": {"S": QUEUE_PREFIX},
            },
            ConsistentRead=True,
            Limit=1,
        )
        items = response.get("Items", [])
        if not items:
            return None
        item = items[0]
        return QueueEntry(
            ticket=int(item["sk"]["S"].removeprefix(QUEUE_PREFIX)),
            workflow_id=item["wid"]["S"],
            since=int(item["since"]["N"]),
        )

    def dequeue(self, definition: str, tenant: str, ticket: int) -> None:
        """See ``TenantSlotStore.dequeue``."""
        self.client.delete_item(TableName=self.table, Key=queue_key(definition, tenant, ticket))

    def queue_checked(self, definition: str, tenant: str, due: int | None, seen_ticket: int) -> None:
        """See ``TenantSlotStore.queue_checked``."""
        if due is not None:
            self.client.update_item(
                TableName=self.table,
                Key=tenancy_key(definition, tenant),
                UpdateExpression="SET complete_by = :due, dl_shard = :shard, dname = :name",
                ExpressionAttributeValues={
                    ":due": {"N": str(due)},
                    ":shard": {"S": QUEUE_SHARD},
                    ":name": {"S": definition},
                },
            )
            return
        try:
            self.client.update_item(
                TableName=self.table,
                Key=tenancy_key(definition, tenant),
                UpdateExpression="REMOVE complete_by, dl_shard",
                ConditionExpression="attribute_not_exists(next_ticket) OR next_ticket = :seen",
                ExpressionAttributeValues={":seen": {"N": str(seen_ticket)}},
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise  # a start queued since: the queue stays in the index

    def due_queues(self, before: int, limit: int) -> list[tuple[str, str]]:
        """See ``TenantSlotStore.due_queues``."""
        response = self.client.query(
            TableName=self.table,
            IndexName=DEADLINE_INDEX,
            KeyConditionExpression="dl_shard = :shard AND complete_by < :before",
            ExpressionAttributeValues={":shard": {"S": QUEUE_SHARD}, ":before": {"N": str(before)}},
            Limit=limit,
        )
        due = []
        for item in response.get("Items", []):
            name = item.get("dname", {}).get("S")
            prefix = f"{TENANCY_PREFIX}{name}#"
            if name is not None and item["pk"]["S"].startswith(prefix):
                due.append((name, item["pk"]["S"].removeprefix(prefix)))
        return due
