"""Adapters: the only modules that talk to AWS (boto3) or to remote services over HTTP."""

from __future__ import annotations

from typing import Any


def condition_failed(exc: Any) -> bool:
    """Whether a botocore ``ClientError`` is DynamoDB refusing a write's condition (``ConditionalCheckFailed``): the
    answer every conditional write of the adapters expects, as opposed to a failure."""
    return bool(exc.response.get("Error", {}).get("Code", "") == "ConditionalCheckFailedException")
