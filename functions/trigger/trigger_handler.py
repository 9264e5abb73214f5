"""Trigger Lambda: starts one workflow per occurrence that reaches the trigger's queue (sasflow.triggers).

One function (and role) per trigger of triggers.yaml; its ``TRIGGER`` variable says which. Every occurrence is an
SQS message (a schedule's tick, an event, a message sent to an sqs trigger's queue, an S3 notification). A refused
occurrence goes to the trigger's dead-letter queue with its reason and is acknowledged; any other failure is a
batch-item failure, so SQS delivers it again and, after five receives, moves it to that dead-letter queue as it is.
"""

from __future__ import annotations

import json
import os
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from sasflow.lean_imports import defer_package_init

# As the scheduler's handler: the batch utility needs the SQS record class only (sasflow.lean_imports).
defer_package_init("aws_lambda_powertools.utilities.data_classes")

from aws_lambda_powertools.utilities.batch import BatchProcessor, EventType, process_partial_response  # noqa: E402
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord  # noqa: E402

import sasflow.scheduler  # noqa: F401, E402  (its first invocation needs the engine)
from sasflow.bootstrap import Lazy, build_trigger  # noqa: E402
from sasflow.cost import Tally, ledger, metered, sqs_records  # noqa: E402
from sasflow.ports import Outgoing  # noqa: E402
from sasflow.tracing import build_tracer, lean_log_keys  # noqa: E402
from sasflow.triggers import Message, TriggerRefusedError  # noqa: E402

logger = Logger()
tracer = build_tracer()
metrics = Metrics()
copy_config_to_registered_loggers(source_logger=logger, include={"sasflow"})


def _count(name: str, value: int = 1) -> None:
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


service = Lazy(lambda: build_trigger(metrics=_count, correlate=logger.set_correlation_id))
processor = BatchProcessor(event_type=EventType.SQS)


def handle_record(record: SQSRecord, outbox: list[Outgoing] | None = None) -> dict[str, Any]:
    """Start the workflow of each occurrence of a message (one, but an s3 notification's uploads; none for S3's test
    event); a refused one goes to the dead-letter queue with its reason. ``outbox`` collects the first requests of
    the workflows started (sent by the caller with its batch's); without one, they are sent at once."""
    trigger = service()
    message = _message(record)
    try:
        occurrences = trigger.read(record.body, message)
    except TriggerRefusedError as error:
        return _refuse(trigger, record.body, error, message)
    if not occurrences:
        logger.info("S3 test event: nothing uploaded, nothing started", extra={"trigger": trigger.config.name})
        return {"test_event": True}
    handled = []
    for occurrence in occurrences:
        try:
            outcome = trigger.handle(occurrence, outbox)
        except TriggerRefusedError as error:  # this upload only; the others of the message go on
            handled.append(_refuse(trigger, occurrence.raw or record.body, error, occurrence.message or message))
            continue
        # A workflow started is in the table, its history naming the occurrence: the line is for what started nothing
        # (skipped, missed, held, kept waiting) or found the workflow an earlier delivery started.
        (logger.debug if outcome.created else logger.info)(
            "occurrence handled",
            extra={
                "trigger": trigger.config.name,
                "occurrence": occurrence.identity,
                "workflow_id": outcome.workflow_id,
                # not "created": a LogRecord attribute, which logging refuses to overwrite (KeyError)
                "workflow_created": outcome.created,
                "skipped": outcome.skipped,  # why it started nothing: paused, missed, a run holds the slot, waiting
            },
        )
        handled.append({"workflow_id": outcome.workflow_id, "created": outcome.created})
    return handled[0] if len(handled) == 1 else {"occurrences": handled}


def _refuse(trigger: Any, body: str, error: TriggerRefusedError, message: Message) -> dict[str, Any]:
    """Send a refused occurrence to the trigger's dead-letter queue with its reason (and log it)."""
    logger.warning(
        "occurrence refused",
        extra={"trigger": trigger.config.name, "code": error.code, "reason": str(error), "id": message.message_id},
    )
    trigger.refuse(body, error, message.message_id, message)
    return {"refused": error.code}


def _message(record: SQSRecord) -> Message:
    """The message itself: an sqs trigger's occurrence is its id, and its input may read its attributes."""
    attributes = {
        name: str(value.get("stringValue") if value.get("stringValue") is not None else value.get("binaryValue"))
        for name, value in (record.get("messageAttributes") or {}).items()
    }
    sent = (record.get("attributes") or {}).get("SentTimestamp")
    return Message(record.message_id, int(sent) if sent and str(sent).isdigit() else 0, attributes)


#: What each record brings (its share of the invocation and of the mapping's requests, the send that delivered it, an
#: event's PutEvents or a schedule's Scheduler invocation), charged when it starts: the workflow it starts takes it
#: (sasflow.cost).
_shares = sqs_records(
    lambda record: record.get("messageId"),
    delivered=True,
    published=json.loads(os.environ.get("TRIGGER") or "{}").get("kind") in ("event", "schedule"),
)


@metered(logger=logger, metrics=metrics, records_charged_by_handler=True)
@logger.inject_lambda_context
@lean_log_keys(logger)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Handle a batch of occurrences and report the ones that failed (``ReportBatchItemFailures``); then send the
    first requests of the workflows they started, together (lost, the supervisor resends them)."""
    outbox: list[Outgoing] = []  # this invocation's: the first requests of the workflows its batch started
    shares = dict(_shares(event))

    def handle(record: SQSRecord) -> dict[str, Any]:
        ledger().charge(None, shares.get(record.message_id) or Tally())
        return handle_record(record, outbox)

    try:
        with service().batch():
            return dict(
                process_partial_response(event=event, record_handler=handle, processor=processor, context=context)
            )
    finally:
        service().send_outbox(outbox)
