"""The message bus on SQS: batched sends (SendMessageBatch, 10 entries per request), and received messages made
visible again at once (ChangeMessageVisibilityBatch with a visibility timeout of 0, 10 entries per request)."""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from ..cost import COST_ATTRIBUTE, Tally, ledger, sqs_requests
from ..ports import Outgoing, Receipt

if TYPE_CHECKING:
    from mypy_boto3_sqs.client import SQSClient

logger = logging.getLogger("sasflow.sqs")
_BATCH = 10
#: SendMessageBatch: at most 10 entries and 262,144 bytes in all (the sum of the bodies), per the SQS quotas
#: (https://docs.aws.amazon.com/AWSSimpleQueueService/latest/SQSDeveloperGuide/quotas-messages.html).
_BATCH_BYTES = 262_144
#: The most a ``sasflow-cost`` attribute takes of a message's 262,144 bytes (its name, type and ten numbers).
_ATTRIBUTE_ROOM = 128


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


def queue_url(queue_arn: str) -> str:
    """The URL of the queue ``queue_arn`` (``arn:aws:sqs:<region>:<account>:<name>``), in the form SQS documents,
    ``https://sqs.<region>.amazonaws.com/<account>/<name>`` (SQS developer guide, "Amazon SQS queue and message
    identifiers"). A request is sent to the client's endpoint whatever the URL's host; SQS, moto and the local stack
    find the queue by the URL's account and name.

    Raises
    ------
    ValueError
        When ``queue_arn`` is not an SQS queue's ARN.
    """
    parts = queue_arn.split(":")
    if len(parts) != 6 or parts[:3] != ["arn", parts[1], "sqs"] or not all(parts[3:]):
        raise ValueError(f"not an SQS queue ARN: {queue_arn!r}")
    _, _, _, region, account, name = parts
    return f"https://sqs.{region}.amazonaws.com/{account}/{name}"


def _carry(messages: Sequence[Outgoing], sizes: Sequence[int]) -> list[Tally]:
    """What each message of one SendMessageBatch request carries: its share of the request (its 64 KB chunks), and
    what its workflow owes (`sasflow.cost.Ledger.take`). A message for no workflow carries nothing."""
    book = ledger()
    share = sqs_requests(sum(sizes)) / len(messages)
    # a request at SQS's size limit has no room for the attributes: its workflows' work stays owed (the ledger gives
    # it to their next write or message)
    room = sum(sizes) + _ATTRIBUTE_ROOM * len(messages) <= _BATCH_BYTES
    carried = []
    for message in messages:
        if message.workflow_id is None:
            carried.append(Tally())
            continue
        book.charge(message.workflow_id, Tally(sqs=share))
        carried.append(book.take(message.workflow_id) if room else Tally())
    return carried


def _cost_attribute(tally: Tally) -> dict[str, Any]:
    """The ``MessageAttributes`` entry that carries ``tally`` (none when there is nothing to carry)."""
    if not tally:
        return {}
    return {"MessageAttributes": {COST_ATTRIBUTE: {"DataType": "String", "StringValue": tally.attribute()}}}


def _give_back(messages: Sequence[Outgoing], carried: Sequence[Tally]) -> None:
    """A message that was not sent carries nothing: what it took is owed again (its resend will carry it)."""
    for message, tally in zip(messages, carried, strict=True):
        if message.workflow_id is not None:
            ledger().give_back(message.workflow_id, tally)


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
                carried = _carry([messages[i] for i in chunk], [sizes[i] for i in group])
                entries = [
                    {
                        "Id": str(i),
                        "MessageBody": messages[i].body,
                        "DelaySeconds": messages[i].delay_seconds,
                        **({"MessageGroupId": messages[i].group} if messages[i].group else {}),
                        **_cost_attribute(tally),
                    }
                    for i, tally in zip(chunk, carried, strict=True)
                ]
                try:
                    response = self.client.send_message_batch(QueueUrl=queue_url, Entries=entries)  # type: ignore[arg-type]
                except (ClientError, BotoCoreError) as exc:
                    logger.warning("send failed", extra={"queue_url": queue_url, "error": str(exc)})
                    failed.extend(chunk)
                    _give_back([messages[i] for i in chunk], carried)
                    continue
                lost = {int(f["Id"]) for f in response.get("Failed", [])}
                failed.extend(sorted(lost))
                _give_back(
                    [messages[i] for i in chunk if i in lost],
                    [c for i, c in zip(chunk, carried, strict=True) if i in lost],
                )
        return sorted(failed)

    def make_visible(self, receipts: Sequence[Receipt]) -> int:
        """Set the visibility timeout of ``receipts`` to 0, 10 per ChangeMessageVisibilityBatch request; return how
        many failed (logged; those come back after their visibility timeout instead)."""
        by_queue: dict[str, list[str]] = defaultdict(list)
        for receipt in receipts:
            by_queue[receipt.queue_arn].append(receipt.receipt_handle)
        failed = 0
        for queue_arn, handles in by_queue.items():
            for start in range(0, len(handles), _BATCH):
                chunk = handles[start : start + _BATCH]
                entries = [{"Id": str(i), "ReceiptHandle": h, "VisibilityTimeout": 0} for i, h in enumerate(chunk)]
                try:
                    response = self.client.change_message_visibility_batch(
                        QueueUrl=queue_url(queue_arn),
                        Entries=entries,  # type: ignore[arg-type]
                    )
                except (ClientError, BotoCoreError, ValueError) as exc:
                    logger.warning("make visible failed", extra={"queue_arn": queue_arn, "error": str(exc)})
                    failed += len(chunk)
                    continue
                errors = response.get("Failed", [])
                if errors:
                    reasons = "; ".join(f"{e['Code']}: {e.get('Message', '')}" for e in errors)
                    logger.warning("make visible failed", extra={"queue_arn": queue_arn, "error": reasons})
                failed += len(errors)
        return failed
