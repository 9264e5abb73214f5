"""Agent Lambda: performs step requests on one remote service (AGENT_NAME) and replies to the scheduler."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.batch import process_partial_response
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord
from aws_lambda_powertools.utilities.typing import LambdaContext

from sasflow.batch import OutboxBatchProcessor
from sasflow.bootstrap import Lazy, build_agent
from sasflow.ports import Outgoing
from sasflow.tracing import build_tracer, lean_log_keys

logger = Logger()
tracer = build_tracer()  # powertools' Tracer; without the X-Ray SDK when tracing is off
metrics = Metrics()
copy_config_to_registered_loggers(source_logger=logger, include={"sasflow"})


def _count(name: str, value: int = 1) -> None:
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


agent = Lazy(lambda: build_agent(metrics=_count))
processor = OutboxBatchProcessor(lambda: agent().bus)


def handle_request(record: SQSRecord, lambda_context: LambdaContext) -> list[Outgoing]:
    """Do one step request and return its reply; a failure fails this record only."""
    return agent().runtime.process(
        record.body, lambda: lambda_context.get_remaining_time_in_millis() / 1000.0, message_id=record.message_id
    )


@logger.inject_lambda_context
@lean_log_keys(logger)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Process a batch of step requests and report partial failures."""
    services = agent()
    services.idempotency_config.register_lambda_context(context)
    return dict(
        process_partial_response(event=event, record_handler=handle_request, processor=processor, context=context)
    )
