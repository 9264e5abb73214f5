"""SQS batch processing with an outbox: records first, then one batched send, then the partial response.

Built on powertools ``BatchProcessor`` (ReportBatchItemFailures): a record whose handling raises becomes a
batch-item failure and its neighbours still succeed (DESIGN Rule 9). The messages records produce are sent after
every record was handled, 10 per request, and a record whose messages could not be sent is turned into a failure
too, so SQS delivers it again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor
from aws_lambda_powertools.utilities.batch.types import PartialItemFailureResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from .errors import MalformedMessageError
from .ports import MessageBus, Outgoing


def process_sqs_batch(
    event: Any,
    context: Any,
    handle_record: Callable[[SQSRecord], Sequence[Outgoing]],
    bus: MessageBus,
    processor: BatchProcessor,
) -> PartialItemFailureResponse:
    """Handle an SQS event record by record, send what they produced, and report partial failures.

    Parameters
    ----------
    event:
        The Lambda SQS event (``{"Records": [...]}``).
    context:
        The Lambda context.
    handle_record:
        Handles one record and returns the messages to send; raises to fail that record only.
    bus:
        Where the messages go.
    processor:
        A powertools ``BatchProcessor(EventType.SQS)`` built once per cold start.

    Returns
    -------
    dict
        ``{"batchItemFailures": [{"itemIdentifier": <messageId>}, ...]}``.

    Raises
    ------
    MalformedMessageError
        When the event has no ``Records`` list: that is an error, never an empty success.
    """
    records = event.get("Records") if isinstance(event, dict) else None
    if not isinstance(records, list) or not records:
        raise MalformedMessageError("the event has no Records: not an SQS event")
    produced: list[tuple[str, Outgoing]] = []

    def record_handler(record: SQSRecord) -> None:
        messages = handle_record(record)
        produced.extend((record.message_id, message) for message in messages)

    with processor(records, record_handler, context):
        processor.process()
        if produced:
            failed = bus.send([message for _, message in produced])
            _fail(processor, {produced[i][0] for i in failed})
    return processor.response()


def _fail(processor: BatchProcessor, message_ids: set[str]) -> None:
    if not message_ids:
        return
    for record in list(processor.success_messages):
        # powertools keeps the raw record dicts here (the handler got the data class)
        message_id = record.get("messageId") if isinstance(record, dict) else getattr(record, "message_id", None)
        if message_id in message_ids:
            processor.success_messages.remove(record)
            # ...and reports failures from data classes
            processor.fail_messages.append(SQSRecord(record) if isinstance(record, dict) else record)
