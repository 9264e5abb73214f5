"""The message bus on SQS: batched sends (SendMessageBatch, 10 entries per request)."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from ..ports import Outgoing

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient

logger = logging.getLogger("sasflow.sqs")
_BATCH = 10
#: SendMessageBatch: at most 10 entries and 262,144 bytes in all (the sum of the bodies), per the SQS quotas
#: (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html).
_BATCH_BYTES = 262_144


def batches(sizes: Sequence[int]) -> list[list[int]]:
    """Group message indexes into SendMessageBatch requests: 10 entries and 262,144 bytes at most each.

    ``sizes`` are the UTF-8 body sizes in bytes (each already at most 262,144); order is kept.
    """
    result: list[list[int]] = []
    current: list[int] = []
    total = 0
    for index, size in enumerate(sizes):
        if current and (len(current) == _BATCH or total + size > _BATCH_BYTES):
            result.append(current)
            current, total = [], 0
        current.append(index)
        total += size
    if current:
        result.append(current)
    return result


def sqs_client() -> SQSClient:
    """Create an SQS client (at the edge, after the endpoint or moto is set up)."""
    return boto3.client("sqs")


class SqsMessageBus:
    """``MessageBus`` over SQS.

    Parameters
    ----------
    client:
        A boto3 SQS client, injected.
    """

    def __init__(self, client: SQSClient) -> None:
        self.client = client

    def send(self, messages: Sequence[Outgoing]) -> list[int]:
        """Send ``messages`` grouped by queue in SendMessageBatch requests; return the indexes that failed.

        A request that raises (throttling, ServiceUnavailable after botocore's own retries) fails all its entries;
        the state that expects them is already durable, so the supervisor resends them later (DESIGN Rule 1).
        """
        by_queue: dict[str, list[int]] = defaultdict(list)
        for index, message in enumerate(messages):
            by_queue[message.queue_url].append(index)
        failed: list[int] = []
        for queue_url, indexes in by_queue.items():
            sizes = [len(messages[i].body.encode("utf-8")) for i in indexes]
            for group in batches(sizes):
                chunk = [indexes[i] for i in group]
                entries = [
                    {"Id": str(i), "MessageBody": messages[i].body, "DelaySeconds": messages[i].delay_seconds}
                    for i in chunk
                ]
                try:
                    response = self.client.send_message_batch(QueueUrl=queue_url, Entries=entries)  # type: ignore[arg-type]
                except (ClientError, BotoCoreError) as exc:
                    logger.warning("send failed", extra={"queue_url": queue_url, "error": str(exc)})
                    failed.extend(chunk)
                    continue
                failed.extend(int(f["Id"]) for f in response.get("Failed", []))
        return sorted(failed)
