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
        """Send ``messages`` grouped by queue, 10 per SendMessageBatch; return the indexes that failed.

        A request that raises (throttling, ServiceUnavailable after botocore's own retries) fails all its entries;
        the state that expects them is already durable, so the supervisor resends them later (DESIGN Rule 1).
        """
        by_queue: dict[str, list[int]] = defaultdict(list)
        for index, message in enumerate(messages):
            by_queue[message.queue_url].append(index)
        failed: list[int] = []
        for queue_url, indexes in by_queue.items():
            for start in range(0, len(indexes), _BATCH):
                chunk = indexes[start : start + _BATCH]
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
