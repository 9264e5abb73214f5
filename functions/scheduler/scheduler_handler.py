"""Scheduler Lambda: applies agents' replies from the response queue and dispatches what comes next."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from sasflow.lean_imports import defer_package_init

# Before the first import of powertools' batch utility: it needs the SQS record class, not the 40 other event
# classes the data classes' __init__ imports (sasflow.lean_imports).
defer_package_init("aws_lambda_powertools.utilities.data_classes")

from aws_lambda_powertools.utilities.batch import process_partial_response  # noqa: E402

# The engine's services, which build_engine imports only when called (so that agents never load them): this
# function needs them on its first invocation, so they load at init, with the rest of its cold start.
import sasflow.supervisor  # noqa: F401, E402  (imports sasflow.scheduler)
from sasflow.batch import OutboxBatchProcessor, ReplyGroups  # noqa: E402
from sasflow.bootstrap import Lazy, build_engine  # noqa: E402
from sasflow.cost import body_workflow, metered, sqs_records  # noqa: E402
from sasflow.tracing import build_tracer, lean_log_keys  # noqa: E402

logger = Logger()
tracer = build_tracer()  # powertools' Tracer; without the X-Ray SDK when tracing is off
metrics = Metrics()
copy_config_to_registered_loggers(source_logger=logger, include={"sasflow"})


def _count(name: str, value: int = 1) -> None:
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


engine = Lazy(lambda: build_engine(metrics=_count, correlate=logger.set_correlation_id))
# Stop starting replies with 5 s left: the rest come back at once as batch-item failures, not after a timeout.
processor = OutboxBatchProcessor(lambda: engine().bus, reserve_seconds=5)


@metered(logger=logger, metrics=metrics, records=sqs_records(body_workflow))
@logger.inject_lambda_context
@lean_log_keys(logger)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Process a batch of replies (those of one workflow together) and report partial failures."""
    replies = ReplyGroups(engine().scheduler.on_replies, event.get("Records") or [])
    return dict(
        process_partial_response(event=event, record_handler=replies.handle, processor=processor, context=context)
    )
