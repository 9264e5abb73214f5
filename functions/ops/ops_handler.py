"""Operators' Lambda: the /ops routes (find, read, act on any workflow; redrive dead letters)."""

from __future__ import annotations

from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from sasflow.lean_imports import defer_package_init

# Before the first import of powertools' event handler: this function needs its HTTP resolver and the HTTP API's
# event class, not the AppSync, Bedrock and other resolvers and the 40 event classes their __init__ import
# (sasflow.lean_imports).
defer_package_init("aws_lambda_powertools.event_handler")
defer_package_init("aws_lambda_powertools.utilities.data_classes")

# The engine's services, which build_engine imports only when called (so that agents never load them): this
# function needs them on its first invocation, so they load at init, with the rest of its cold start.
import sasflow.supervisor  # noqa: F401, E402  (imports sasflow.scheduler)
from sasflow.bootstrap import Lazy, build_batches, build_ops  # noqa: E402
from sasflow.cost import Tally, metered  # noqa: E402
from sasflow.ops_api import build_ops_app  # noqa: E402
from sasflow.tracing import build_tracer, lean_log_keys  # noqa: E402

logger = Logger()
tracer = build_tracer()  # powertools' Tracer; without the X-Ray SDK when tracing is off
metrics = Metrics()
copy_config_to_registered_loggers(source_logger=logger, include={"sasflow"})


def _count(name: str, value: int = 1) -> None:
    metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)


ops = Lazy(lambda: build_ops(metrics=_count, correlate=logger.set_correlation_id))
batches = Lazy(lambda: build_batches(engine=ops().engine))
app = build_ops_app(
    lambda: (ops().engine.scheduler, ops().engine.bus, ops().index, ops().dead_letters),
    lambda: ops().triggers,
    lambda: batches(),  # the module's, looked up at each request (tests and the simulation replace it)
)


@metered(logger=logger, metrics=metrics, carry=False, request=Tally(api=1))
@logger.inject_lambda_context(correlation_id_path="requestContext.requestId")
@lean_log_keys(logger)
@tracer.capture_lambda_handler
@metrics.log_metrics
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    """Resolve an API Gateway HTTP API (payload v2) event of an /ops route."""
    return app.resolve(event, context)
