"""The payload store on S3: the claim-checked payloads of the workflows (``claim_check.py``).

One object per payload under ``<workflow_id>/``, written with ``PutObject`` tagged ``claim-check=live`` or
``claim-check=pending``. The bucket (template ``PayloadBucket``) encrypts them (SSE-S3), blocks public access,
refuses requests without TLS, expires objects tagged ``claim-check=terminal`` after ``TerminalRetentionDays`` and
those tagged ``claim-check=pending`` after a day; ``restamp`` copies an object onto itself
with the new tag, which restarts the age its lifecycle rule counts (S3 User Guide, "Lifecycle configuration
elements": days are counted from the object's creation).
"""

from __future__ import annotations

from typing import Any

import boto3
from botocore.exceptions import ClientError

from ..errors import ClaimCheckMissingError

#: The tag whose value (live, terminal, pending) the bucket's lifecycle rules select on.
TAG = "claim-check"
_MISSING = {"NoSuchKey", "404", "NotFound"}


def s3_client() -> Any:
    """Create an S3 client (at the edge, after the endpoint or moto is set up); typed Any: the project pins no
    mypy-boto3-s3 stubs. Its requests and the bytes it writes are counted on the ledger (`sasflow.cost.meter`)."""
    from ..cost import meter

    return meter(boto3.client("s3"))


class S3PayloadStore:
    """``PayloadStore`` over one S3 bucket.

    Parameters
    ----------
    bucket:
        The bucket's name (``PAYLOAD_BUCKET``).
    client:
        A boto3 S3 client, injected; None creates one on first use, so a function that never meets a payload above
        the threshold never builds an S3 client (nor pays for it at cold start).
    """

    def __init__(self, bucket: str, client: Any = None) -> None:
        self.bucket = bucket
        self._client = client

    @property
    def client(self) -> Any:
        """The S3 client (created on first use)."""
        if self._client is None:
            self._client = s3_client()
        return self._client

    def put(self, key: str, body: bytes, state: str) -> None:
        """``PutObject`` tagged ``state`` (one request, up to 5 GB: no multipart for payloads of 10 MB)."""
        self.client.put_object(
            Bucket=self.bucket, Key=key, Body=body, ContentType="application/json", Tagging=f"{TAG}={state}"
        )

    def get(self, key: str) -> bytes:
        """``GetObject``; raises ``ClaimCheckMissingError`` for a missing key."""
        try:
            response = self.client.get_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                raise ClaimCheckMissingError(key) from exc
            raise
        body: bytes = response["Body"].read()
        return body

    def keys(self, prefix: str) -> list[str]:
        """``ListObjectsV2`` under ``prefix`` (one request per 1,000 keys)."""
        paginator = self.client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=prefix)
        return [item["Key"] for page in pages for item in page.get("Contents", [])]

    def restamp(self, key: str, state: str) -> None:
        """``CopyObject`` onto itself with the tag ``claim-check=<state>`` (a new object: its age starts now)."""
        try:
            self.client.copy_object(
                Bucket=self.bucket,
                Key=key,
                CopySource={"Bucket": self.bucket, "Key": key},
                MetadataDirective="REPLACE",
                ContentType="application/json",
                Metadata={TAG: state},
                TaggingDirective="REPLACE",
                Tagging=f"{TAG}={state}",
            )
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                raise ClaimCheckMissingError(key) from exc
            raise
