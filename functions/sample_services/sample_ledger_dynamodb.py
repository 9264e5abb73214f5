"""The sample services' ``Ledger`` over DynamoDB (table ``SampleLedgerTable`` in template.yaml).

Item shape (store item, not an API model): ``pk`` (S, the ledger key, the table's hash key), ``kind`` (S, for
reading the table by eye) and ``record`` (S, the ``LedgerRecord`` as JSON, so no float becomes a ``Decimal``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from botocore.exceptions import BotoCoreError, ClientError

from travel_services import LedgerRecord, LedgerUnavailableError

if TYPE_CHECKING:
    from mypy_boto3_dynamodb import DynamoDBClient

# Put-if-absent: the write lands only if no item holds this key yet.
#   first writer:  PutItem succeeds                      -> None (our record is the outcome)
#   later writer:  ConditionalCheckFailedException       -> the item that won (returned with ALL_OLD)
KEY_IS_FREE = "attribute_not_exists(pk)"
CONDITION_FAILED = "ConditionalCheckFailedException"


class DynamoDBLedger:
    """A ``Ledger`` whose put-if-absent is a conditional ``PutItem`` (strongly consistent reads).

    Parameters
    ----------
    table_name : str
        Name of a table with hash key ``pk`` (S), like ``SampleLedgerTable``.
    client : DynamoDBClient, optional
        A boto3 DynamoDB client; by default ``boto3.client("dynamodb")`` is created on first use.
    """

    def __init__(self, table_name: str, client: DynamoDBClient | None = None) -> None:
        self.table_name = table_name
        self._client = client

    @property
    def client(self) -> DynamoDBClient:
        """The injected client, or a default one created at first use (the edge)."""
        if self._client is None:
            import boto3

            self._client = boto3.client("dynamodb")
        return self._client

    def put_if_absent(self, key: str, record: LedgerRecord) -> LedgerRecord | None:
        """Store ``record`` under ``key`` unless the key exists.

        Returns
        -------
        LedgerRecord or None
            None when stored; else the record that already holds ``key``.

        Raises
        ------
        LedgerUnavailableError
            Any other DynamoDB or network error (throttling, 5xx, timeouts): retryable, outcome unknown to the
            caller but safe to retry, since the write is conditional.
        """
        try:
            self.client.put_item(
                TableName=self.table_name,
                Item={"pk": {"S": key}, "kind": {"S": record.kind}, "record": {"S": record.model_dump_json()}},
                ConditionExpression=KEY_IS_FREE,
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") != CONDITION_FAILED:
                raise LedgerUnavailableError(f"ledger write failed: {error}") from error
            old = cast("dict[str, Any] | None", error.response.get("Item"))
            existing = _decode(old) if old else self.get(key)
            if existing is None:  # the winner cannot vanish: items are never deleted
                raise LedgerUnavailableError(f"ledger key {key} lost a race but holds no item") from error
            return existing
        except BotoCoreError as error:
            raise LedgerUnavailableError(f"ledger write failed: {error}") from error
        return None

    def get(self, key: str) -> LedgerRecord | None:
        """Return the record under ``key`` (consistent read), or None.

        Raises
        ------
        LedgerUnavailableError
            DynamoDB or the network failed.
        """
        try:
            response = self.client.get_item(TableName=self.table_name, Key={"pk": {"S": key}}, ConsistentRead=True)
        except (ClientError, BotoCoreError) as error:
            raise LedgerUnavailableError(f"ledger read failed: {error}") from error
        item = response.get("Item")
        return _decode(item) if item else None

    def records(self) -> list[tuple[str, LedgerRecord]]:
        """Return every ``(key, record)`` pair (a full, paginated, consistent scan: for demos and tests).

        Raises
        ------
        LedgerUnavailableError
            DynamoDB or the network failed.
        """
        found: list[tuple[str, LedgerRecord]] = []
        try:
            for page in self.client.get_paginator("scan").paginate(TableName=self.table_name, ConsistentRead=True):
                for item in page.get("Items", []):
                    found.append((item["pk"]["S"], _decode(item)))
        except (ClientError, BotoCoreError) as error:
            raise LedgerUnavailableError(f"ledger scan failed: {error}") from error
        return found


def _decode(item: Any) -> LedgerRecord:
    return LedgerRecord.model_validate_json(item["record"]["S"])
