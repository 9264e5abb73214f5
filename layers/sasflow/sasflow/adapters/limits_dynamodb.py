"""The shared item of an agent's call limits on DynamoDB, in the idempotency table (``id = "call-limits#<agent>"``).

Beside the circuit breaker's item: the agents already read and write that table, and their policy allows each agent
its own ``call-limits#`` key only. Every change is a conditional write on the item's version; a write that loses
gets the item as it is in the same request (``ReturnValuesOnConditionCheckFailure``), so it tries again without a
read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ..call_limits import Lease, LimitsRecord
from . import condition_failed

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient


def limits_key(agent: str) -> str:
    """The item's key: ``call-limits#<agent>`` (template.yaml's agent policies allow exactly this one)."""
    return f"call-limits#{agent}"


def _num(value: float) -> dict[str, str]:
    return {"N": repr(round(float(value), 3)) if isinstance(value, float) else str(value)}


def _record(item: dict[str, Any] | None) -> LimitsRecord:
    if not item:
        return LimitsRecord()
    leases = {
        holder: Lease(
            units=int(entry["M"]["n"]["N"]), want=int(entry["M"]["w"]["N"]), until=float(entry["M"]["u"]["N"])
        )
        for holder, entry in item.get("leases", {}).get("M", {}).items()
    }
    return LimitsRecord(
        leases=leases,
        version=int(item.get("version", {}).get("N", "0")),
        released_at=float(item.get("released_at", {}).get("N", "0")),
    )


class DynamoDBLimitsStore:
    """``LimitsStore`` over DynamoDB.

    Parameters
    ----------
    table_name:
        The idempotency table (template.yaml ``IdempotencyTable``).
    client:
        A boto3 DynamoDB client, injected.
    """

    def __init__(self, table_name: str, client: DynamoDBClient) -> None:
        self.table = table_name
        self.client = client

    def read(self, agent: str) -> LimitsRecord:
        """Read the item, strongly consistent (an instance's first write starts from it)."""
        key = {"id": {"S": limits_key(agent)}}
        return _record(self.client.get_item(TableName=self.table, Key=key, ConsistentRead=True).get("Item"))

    def write(self, agent: str, expect_version: int, record: LimitsRecord) -> LimitsRecord | None:
        """Replace the item if its version is ``expect_version``; None when written, else the item as it is."""
        leases = {
            holder: {"M": {"n": _num(lease.units), "w": _num(lease.want), "u": _num(lease.until)}}
            for holder, lease in record.leases.items()
        }
        values: dict[str, Any] = {
            ":leases": {"M": leases},
            ":version": _num(record.version),
            ":released": _num(record.released_at),
        }
        if expect_version:
            condition = "version = :expect"
            values[":expect"] = _num(expect_version)
        else:
            condition = "attribute_not_exists(version)"
        try:
            self.client.update_item(
                TableName=self.table,
                Key={"id": {"S": limits_key(agent)}},
                UpdateExpression="SET leases = :leases, version = :version, released_at = :released",
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            item: dict[str, Any] | None = exc.response.get("Item")  # type: ignore[assignment] # ALL_OLD returns it
            return _record(item) if item is not None else self.read(agent)
        return None
