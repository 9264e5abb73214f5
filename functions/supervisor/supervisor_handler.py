"""Supervisor Lambda: on its EventBridge schedule, sweeps the deadline index for overdue steps."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

# The engine's services, which build_engine imports only when called (so that agents never load them): this
# function needs them on its first invocation, so they load at init, with the rest of its cold start.
import sasflow.supervisor  # noqa: F401  (imports sasflow.scheduler)
from sasflow.bootstrap import Lazy, build_engine
from sasflow.cost import metered
from sasflow.tracing import build_tracer, lean_log_keys

logger = Logger()
tracer = build_tracer()  # powertools' Tracer; without the X-Ray SDK when tracing is off
metrics = Metrics()
copy_config_to_registered_loggers(source_logger=logger, include={"sasflow"})


def _count(name: str, value: int = 1) -> None:
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


engine = Lazy(lambda: build_engine(metrics=_count, correlate=logger.set_correlation_id))


@metered(logger=logger, metrics=metrics, carry=False)
@logger.inject_lambda_context
@lean_log_keys(logger)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Run one sweep; the lease keeps overlapping runs from sweeping twice."""
    report = engine().supervisor.sweep(
        owner=context.aws_request_id, time_left=lambda: context.get_remaining_time_in_millis() / 1000.0
    )
    summary = asdict(report)
    summary.pop("workflows")
    logger.info("sweep done", extra=summary)
    return summary
