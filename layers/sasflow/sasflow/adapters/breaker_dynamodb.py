"""Circuit-breaker state on DynamoDB, one item per agent in the idempotency table (``id = "circuit-breaker#<agent>"``).

The agents already read and write that table for powertools idempotency, so the breaker needs no extra table or
permission. Transitions are conditional writes (compare-and-set), so concurrent agent instances agree on one state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ..breaker import BreakerRecord, BreakerState
from . import condition_failed

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient


def _key(agent: str) -> dict[str, Any]:
    return {"id": {"S": f"circuit-breaker#{agent}"}}


def _num(value: float) -> dict[str, str]:
    return {"N": repr(float(value))}


class DynamoDBBreakerStore:
    """``BreakerStore`` over DynamoDB.

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

    def get(self, agent: str) -> BreakerRecord:
        """Read the breaker (eventually consistent: a breaker may lag by a moment, and costs half a read unit)."""
        item = self.client.get_item(TableName=self.table, Key=_key(agent)).get("Item")
        if not item:
            return BreakerRecord()
        return BreakerRecord(
            state=BreakerState(item.get("breaker_state", {}).get("S", "closed")),
            failures=int(item.get("failures", {}).get("N", "0")),
            open_until=float(item.get("open_until", {}).get("N", "0")),
            probe_until=float(item.get("probe_until", {}).get("N", "0")),
        )

    def record_failure(self, agent: str) -> int:
        """Atomically increment the failure count (ADD) and return it."""
        response = self.client.update_item(
            TableName=self.table,
            Key=_key(agent),
            UpdateExpression="ADD failures :one",
            ExpressionAttributeValues={":one": {"N": "1"}},
            ReturnValues="UPDATED_NEW",
        )
        return int(response["Attributes"]["failures"]["N"])

    def transition(self, agent: str, expect: BreakerRecord, new: BreakerRecord) -> bool:
        """Compare-and-set the breaker; True when this instance won."""
        values: dict[str, Any] = {
            ":state": {"S": new.state.value},
            ":open": _num(new.open_until),
            ":probe": _num(new.probe_until),
            ":es": {"S": expect.state.value},
            ":eo": _num(expect.open_until),
            ":ep": _num(expect.probe_until),
        }
        # unchanged_since_read: nobody else moved the breaker between our read and this write.
        condition = "(breaker_state = :es AND open_until = :eo AND probe_until = :ep)"
        if expect.state is BreakerState.CLOSED:
            condition += " OR attribute_not_exists(breaker_state)"
        try:
            self.client.update_item(
                TableName=self.table,
                Key=_key(agent),
                UpdateExpression="SET breaker_state = :state, open_until = :open, probe_until = :probe",
                ConditionExpression=condition,
                ExpressionAttributeValues=values,
            )
        except ClientError as exc:
            if condition_failed(exc):
                return False
            raise
        return True

    def reset(self, agent: str) -> None:
        """Close the breaker and zero its failures."""
        self.client.put_item(
            TableName=self.table,
            Item={
                **_key(agent),
                "breaker_state": {"S": "closed"},
                "failures": {"N": "0"},
                "open_until": _num(0),
                "probe_until": _num(0),
            },
        )
