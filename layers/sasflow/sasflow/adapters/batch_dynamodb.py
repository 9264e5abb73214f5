"""Batches' items on DynamoDB, in the state table beside the workflows (``batches.py``).

- The batch: ``pk = "BATCH#<id>"``, ``sk = "#BATCH"``; the batch as a JSON document (``doc``) and its ``version``,
  which every write is conditional on. It carries ``attn = "BATCH"`` and ``attn_since`` (its creation) so that the
  attention index lists batches newest first: that partition holds only batches, and no query for workflows reads it.
- Its pages: ``sk = "PAGE#<number, 6 digits>"``, the page's workflow ids and their outcomes (``doc``); a page item is
  created once (conditional on its absence) in the transaction that moves the batch's cursor past it.

No attribute is named ``status``: a scan for finished workflows filters on it, and a batch is not a workflow.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from ..batches import Batch, BatchFilter, BatchPage, Counts
from ..errors import ConditionFailedError
from . import batch_get, condition_failed

if TYPE_CHECKING:
    from mypy_boto3_dynamodb.client import DynamoDBClient

BATCH_PREFIX = "BATCH#"
BATCH_SORT_KEY = "#BATCH"
PAGE_PREFIX = "PAGE#"
#: The attention-index partition of the batches.
BATCH_ATTENTION = "BATCH"
#: BatchGetItem calls per 100 keys while DynamoDB leaves keys unprocessed; the rest are read alone.
_BATCH_GET_ROUNDS = 5


def batch_key(batch_id: str) -> dict[str, Any]:
    """The key of a batch's item."""
    return {"pk": {"S": BATCH_PREFIX + batch_id}, "sk": {"S": BATCH_SORT_KEY}}


def page_key(batch_id: str, number: int) -> dict[str, Any]:
    """The key of a batch's page item."""
    return {"pk": {"S": BATCH_PREFIX + batch_id}, "sk": {"S": f"{PAGE_PREFIX}{number:06d}"}}


def _document(batch: Batch) -> str:
    values = asdict(batch)
    values.pop("version")
    return json.dumps(values, separators=(",", ":"), sort_keys=True)


def _batch(item: dict[str, Any]) -> Batch:
    values = json.loads(item["doc"]["S"])
    values["where"] = BatchFilter.of(values["where"])
    values["counts"] = Counts(**values["counts"])
    return Batch(**values, version=int(item["version"]["N"]))


def _page(item: dict[str, Any]) -> BatchPage:
    values = json.loads(item["doc"]["S"])
    number = int(item["sk"]["S"][len(PAGE_PREFIX) :])
    batch_id = item["pk"]["S"][len(BATCH_PREFIX) :]
    return BatchPage(batch_id, number, tuple(values["workflow_ids"]), values.get("outcomes") or {})


def _page_item(page: BatchPage) -> dict[str, Any]:
    doc = {"workflow_ids": list(page.workflow_ids), "outcomes": dict(page.outcomes)}
    return {**page_key(page.batch_id, page.number), "doc": {"S": json.dumps(doc, separators=(",", ":"))}}


class DynamoDBBatchStore:
    """``ports.BatchStore`` over DynamoDB.

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

    def _item(self, batch: Batch, version: int) -> dict[str, Any]:
        return {
            **batch_key(batch.batch_id),
            "doc": {"S": _document(batch)},
            "version": {"N": str(version)},
            "attn": {"S": BATCH_ATTENTION},
            "attn_since": {"N": str(batch.created_at)},
        }

    def create(self, batch: Batch) -> Batch:
        """See ``ports.BatchStore.create``."""
        try:
            self.client.put_item(
                TableName=self.table, Item=self._item(batch, 1), ConditionExpression="attribute_not_exists(pk)"
            )
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            raise ConditionFailedError(f"batch {batch.batch_id} exists") from None
        return replace(batch, version=1)

    def get(self, batch_id: str, *, consistent: bool = False) -> Batch | None:
        """See ``ports.BatchStore.get``."""
        item = self.client.get_item(TableName=self.table, Key=batch_key(batch_id), ConsistentRead=consistent).get(
            "Item"
        )
        return _batch(item) if item else None

    def _put(self, batch: Batch, expect: int) -> dict[str, Any]:
        return {
            "TableName": self.table,
            "Item": self._item(batch, expect + 1),
            "ConditionExpression": "version = :expect",
            "ExpressionAttributeValues": {":expect": {"N": str(expect)}},
        }

    def put(self, batch: Batch, *, expect: int) -> Batch:
        """See ``ports.BatchStore.put``."""
        try:
            self.client.put_item(**self._put(batch, expect))
        except ClientError as exc:
            if not condition_failed(exc):
                raise
            raise ConditionFailedError(f"batch {batch.batch_id} moved on from version {expect}") from None
        return replace(batch, version=expect + 1)

    def claim(self, batch: Batch, page: BatchPage) -> Batch:
        """See ``ports.BatchStore.claim``: one TransactWriteItems (the page's Put if absent, the batch's Put)."""
        try:
            items: Any = [
                {
                    "Put": {
                        "TableName": self.table,
                        "Item": _page_item(page),
                        "ConditionExpression": "attribute_not_exists(pk)",
                    }
                },
                {"Put": self._put(batch, batch.version)},
            ]
            self.client.transact_write_items(TransactItems=items)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "TransactionCanceledException":
                raise
            raise ConditionFailedError(f"page {page.number} of batch {page.batch_id} was claimed already") from None
        return replace(batch, version=batch.version + 1)

    def settle(self, batch: Batch, page: BatchPage) -> Batch:
        """See ``ports.BatchStore.settle``: the page's outcomes (the same again from a repeated run: written over),
        then the batch, conditional on its version."""
        self.client.put_item(TableName=self.table, Item=_page_item(page))
        return self.put(batch, expect=batch.version)

    def page(self, batch_id: str, number: int) -> BatchPage | None:
        """See ``ports.BatchStore.page``."""
        item = self.client.get_item(TableName=self.table, Key=page_key(batch_id, number), ConsistentRead=True).get(
            "Item"
        )
        return _page(item) if item else None

    def pages(self, batch_id: str) -> Iterator[BatchPage]:
        """See ``ports.BatchStore.pages``: a Query of the batch's partition, page items only."""
        start: Any = None
        while True:
            request: dict[str, Any] = {
                "TableName": self.table,
                "KeyConditionExpression": "pk = :pk AND begins_with(sk, :page)",
                "ExpressionAttributeValues": {":pk": {"S": BATCH_PREFIX + batch_id}, ":page": {"S": PAGE_PREFIX}},
            }
            if start is not None:
                request["ExclusiveStartKey"] = start
            response = self.client.query(**request)
            for item in response.get("Items", []):
                yield _page(item)
            start = response.get("LastEvaluatedKey")
            if start is None:
                return

    def list(self, limit: int, start: Any | None) -> tuple[list[Batch], Any | None]:
        """See ``ports.BatchStore.list``: the attention index's batch partition, newest first, each batch read from
        its item (the index holds keys and creation times)."""
        request: dict[str, Any] = {
            "TableName": self.table,
            "IndexName": "attention-index",
            "KeyConditionExpression": "attn = :batch",
            "ExpressionAttributeValues": {":batch": {"S": BATCH_ATTENTION}},
            "ScanIndexForward": False,
            "Limit": limit,
        }
        if start is not None:
            request["ExclusiveStartKey"] = start
        response = self.client.query(**request)
        keys = [batch_key(item["pk"]["S"][len(BATCH_PREFIX) :]) for item in response.get("Items", [])]
        items, left = batch_get(self.client, self.table, keys, rounds=_BATCH_GET_ROUNDS)
        for key in left:  # still unprocessed: read alone
            item = self.client.get_item(TableName=self.table, Key=key).get("Item")
            if item is not None:
                items.append(item)
        by_key = {item["pk"]["S"]: _batch(item) for item in items}
        found = [by_key[key["pk"]["S"]] for key in keys if key["pk"]["S"] in by_key]  # newest first, as listed
        return found, response.get("LastEvaluatedKey")
