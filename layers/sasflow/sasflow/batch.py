"""SQS batch processing with an outbox, for powertools ``process_partial_response``.

``OutboxBatchProcessor`` is a powertools ``BatchProcessor`` (SQS, ReportBatchItemFailures) whose record handler
returns the messages that record produces. A record that raises becomes a batch-item failure and its neighbours
still succeed (DESIGN Rule 9). When the batch ends, every produced message is sent, 10 per SendMessageBatch request,
and a record whose messages could not be sent is turned into a batch-item failure too, so SQS delivers it again.
``process_partial_response`` refuses an event without ``Records``: that is an error, never an empty success.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType
from aws_lambda_powertools.utilities.batch.base import SuccessResponse
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord

from .ports import MessageBus, Outgoing


class OutboxBatchProcessor(BatchProcessor):
    """A ``BatchProcessor`` for SQS whose record handler returns ``Sequence[Outgoing]`` to send after the batch.

    Parameters
    ----------
    bus:
        Returns the message bus; called when the batch ends (so the bus can be built lazily at cold start).
    """

    def __init__(self, bus: Callable[[], MessageBus]) -> None:
        super().__init__(event_type=EventType.SQS, raise_on_entire_batch_failure=False)
        self._bus = bus
        self._outbox: list[tuple[dict[str, Any], Outgoing]] = []

    def _prepare(self) -> None:
        super()._prepare()
        self._outbox = []

    def success_handler(self, record: Any, result: Any) -> SuccessResponse:
        """Collect what the record produced (``result``), then count it as a success."""
        for message in result or ():
            self._outbox.append((record, message))
        return super().success_handler(record, result)

    def _clean(self) -> None:
        if self._outbox:
            failed = self._bus().send([message for _, message in self._outbox])
            self._fail({_message_id(self._outbox[index][0]) for index in failed})
        super()._clean()

    def _fail(self, message_ids: set[str | None]) -> None:
        for record in list(self.success_messages):
            # powertools keeps the raw record dicts here and reports failures from data classes
            if _message_id(record) in message_ids:
                self.success_messages.remove(record)
                self.fail_messages.append(SQSRecord(record) if isinstance(record, dict) else record)


def _message_id(record: Any) -> str | None:
    if isinstance(record, dict):
        return record.get("messageId")
    return getattr(record, "message_id", None)


#: What a record handler returns: the messages to send once the batch has been handled.
RecordResult = Sequence[Outgoing]
