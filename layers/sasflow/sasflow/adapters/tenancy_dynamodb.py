"""The tenants' items on DynamoDB, in the state table beside the workflows (``pk = "TENANCY#<definition>#<tenant>"``,
``sk = "#TENANCY"``): one attribute per workflow holding a slot (``h#<workflow id>``: since when), their count
(``n``) and when the holders were last looked at (``pruned_at``).

A slot is taken and given back by conditional writes on the holder's own attribute and the count, so two starts
never take the last slot both, and a give-back repeated changes nothing. A failed take gets the item back in the
same request (``ReturnValuesOnConditionCheckFailure``): a start that holds its slot already (a repeat) is told so
without a read. The engine's functions may touch these items only (template.yaml ``TenantSlotsPolicy``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ..tenancy import TenantSlots
from . import condition_failed

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

TENANCY_PREFIX = "TENANCY#"
TENANCY_SORT_KEY = "#TENANCY"
HOLDER_PREFIX = "h#"


def tenancy_key(definition: str, tenant: str) -> dict[str, Any]:
    """The key of a tenant's item for one definition name."""
    return {"pk": {"S": f"{TENANCY_PREFIX}{definition}#{tenant}"}, "sk": {"S": TENANCY_SORT_KEY}}


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
        return TenantSlots(holders=holders, pruned_at=int(item.get("pruned_at", {}).get("N", "0")))

    def release(self, definition: str, tenant: str, workflow_id: str) -> bool:
        """See ``TenantSlotStore.release``."""
        try:
            self.client.update_item(
                TableName=self.table,
                Key=tenancy_key(definition, tenant),
                UpdateExpression="REMOVE #h ADD n :minus",
                ConditionExpression="attribute_exists(#h)",
                ExpressionAttributeNames={"#h": f"{HOLDER_PREFIX}{workflow_id}"},
                ExpressionAttributeValues={":minus": {"N": "-1"}},
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            return False
        return True

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
