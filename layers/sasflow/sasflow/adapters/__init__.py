"""Adapters: the only modules that talk to AWS (boto3) or to remote services over HTTP."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def condition_failed(exc: Any) -> bool:
    """Whether a botocore ``ClientError`` is DynamoDB refusing a write's condition (``ConditionalCheckFailed``): the
    answer every conditional write of the adapters expects, as opposed to a failure."""
    return bool(exc.response.get("Error", {}).get("Code", "") == "ConditionalCheckFailedException")


def batch_get(
    client: Any, table: str, keys: Sequence[dict[str, Any]], *, rounds: int, **options: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The items of ``keys`` in ``table``, by BatchGetItem of 100 keys a call (its limit), with ``options``
    (``ConsistentRead``, a projection) on every call.

    Keys DynamoDB leaves unprocessed (throttling) are asked again with a backoff (1, 2, 4 ... ms; BatchGetItem's
    documented advice), at most ``rounds`` calls per 100 keys. Returns the raw items found, and the keys still
    unprocessed after every round (the caller reads them alone, or reports them).
    """
    items: list[dict[str, Any]] = []
    left: list[dict[str, Any]] = []
    for start in range(0, len(keys), 100):
        chunk = list(keys[start : start + 100])
        for wait in range(rounds):
            response = client.batch_get_item(RequestItems={table: {"Keys": chunk, **options}})
            items += response.get("Responses", {}).get(table, [])
            unprocessed: dict[str, Any] = response.get("UnprocessedKeys") or {}
            chunk = list((unprocessed.get(table) or {}).get("Keys") or [])
            if not chunk:
                break
            time.sleep(0.001 * 2**wait)
        left += chunk
    return items, left
