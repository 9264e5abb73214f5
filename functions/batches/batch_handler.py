"""Batch Lambda: runs batches of operator actions (sasflow.batches), one message a run.

Each message of its queue is one run of one batch: the run acts on the batch's next pages (at most its rate times
30 seconds of workflows, stopping early when the invocation's time runs short), then sends the next run's message,
delayed to keep the batch under its rate, and hands the batch over to it. A record that fails is delivered again by
SQS (its token still holds the batch: the run continues where it stopped) and after five receives waits in
BatchDeadLetterQueue (``sasflow dlq redrive BatchDeadLetterQueue`` continues it).
"""

from __future__ import annotations

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
from sasflow.bootstrap import Lazy, build_batches  # noqa: E402
from sasflow.cost import metered  # noqa: E402
from sasflow.tracing import build_tracer, lean_log_keys  # noqa: E402

logger = Logger()
tracer = build_tracer()
metrics = Metrics()
copy_config_to_registered_loggers(source_logger=logger, include={"sasflow"})

#: A run stops claiming pages when the invocation has less than this left (a page of 25 actions takes about a second
#: on Lambda; the rest is the settle and the next message).
RESERVE_MS = 10_000


def _count(name: str, value: int = 1) -> None:
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


batches = Lazy(lambda: build_batches(metrics=_count, correlate=logger.set_correlation_id))
processor = BatchProcessor(event_type=EventType.SQS)


@metered(logger=logger, metrics=metrics, carry=False)
@logger.inject_lambda_context
@lean_log_keys(logger)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Run the batch of each record; report the records that failed (``ReportBatchItemFailures``)."""

    def should_stop() -> bool:
        return bool(context.get_remaining_time_in_millis() < RESERVE_MS)

    def run(record: SQSRecord) -> dict[str, Any]:
        result = batches().on_message(record.body, should_stop=should_stop)
        batch = result.batch
        logger.info(
            "batch run",
            extra={
                "batch_id": batch.batch_id if batch else None,
                "batch_status": batch.status if batch else None,
                "acted": result.acted,
                "next_delay": result.delay,
                "counts": batch.counts.__dict__ if batch else None,
            },
        )
        return {"acted": result.acted}

    return dict(process_partial_response(event=event, record_handler=run, processor=processor, context=context))
