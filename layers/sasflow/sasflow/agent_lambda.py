"""The Lambda handler of an agent, HTTP (functions/agent) or Python (``python_agent.AgentApp.handler``).

One place for the powertools wiring both kinds share: Logger with the lean keys, Tracer, Metrics, batch
processing with partial failures, ``register_lambda_context`` for idempotency, and the outbox that sends replies.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.logging.utils import copy_config_to_registered_loggers
from aws_lambda_powertools.metrics import MetricUnit
from aws_lambda_powertools.utilities.typing import LambdaContext

from .lean_imports import defer_package_init

# Before the first import of powertools' batch utility: it needs the SQS record class, not the 40 other event
# classes the data classes' __init__ imports (sasflow.lean_imports).
defer_package_init("aws_lambda_powertools.utilities.data_classes")

from aws_lambda_powertools.utilities.batch import process_partial_response  # noqa: E402
from aws_lambda_powertools.utilities.data_classes.sqs_event import SQSRecord  # noqa: E402

from .batch import OutboxBatchProcessor, fair_order, one_at_a_time  # noqa: E402
from .bootstrap import AgentServices, Lazy, build_agent  # noqa: E402
from .cost import body_workflow, ledger, metered, sqs_records  # noqa: E402
from .messages import DEFAULT_PRIORITY  # noqa: E402
from .ports import Outgoing  # noqa: E402
from .tracing import build_tracer, lean_log_keys  # noqa: E402

if TYPE_CHECKING:  # the runtime (tenacity, the breaker) is imported by build_agent, on the first invocation
    from .agent import RemoteClient


def agent_handler(services: Callable[[], AgentServices]) -> Callable[[dict[str, Any], LambdaContext], dict[str, Any]]:
    """Build an agent's handler over ``services`` (called at each invocation: a ``Lazy`` builds them once per
    sandbox, on the first one; tests and the simulation swap it for their own).
    """
    logger = Logger()
    tracer = build_tracer()  # powertools' Tracer; without the X-Ray SDK when tracing is off
    metrics = Metrics()
    copy_config_to_registered_loggers(source_logger=logger, include={"sasflow"})
    # a batch's records run at once (AGENT_CONCURRENCY): one wait for the batch's calls, not one per record
    processor = OutboxBatchProcessor(
        lambda: services().bus, runner=lambda: services().records or one_at_a_time, order=service_order
    )

    def handle_request(record: SQSRecord, lambda_context: LambdaContext) -> list[Outgoing]:
        """Do one step request and return its reply; a failure fails this record only. Its time and log lines are
        its workflow's (the reply carries them, `sasflow.cost`)."""
        with ledger().working_on(body_workflow(record.raw_event)):
            return services().runtime.process(
                record.body,
                lambda: lambda_context.get_remaining_time_in_millis() / 1000.0,
                message_id=record.message_id,
            )

    @metered(logger=logger, metrics=metrics, records=sqs_records(body_workflow))
    @logger.inject_lambda_context
    @lean_log_keys(logger)
    @tracer.capture_lambda_handler
    @metrics.log_metrics
    def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
        """Process a batch of step requests and report partial failures."""
        built = services()
        built.idempotency_config.register_lambda_context(context)
        if built.runtime.limiter is not None:  # its call limits: the units to ask for are this batch's records
            built.runtime.limiter.expect(len(event.get("Records", [])))
        return dict(
            process_partial_response(event=event, record_handler=handle_request, processor=processor, context=context)
        )

    handler.metrics = metrics  # type: ignore[attr-defined] # the count function of `agent_services`
    return handler


def agent_services(handler: Any, remote: RemoteClient | None = None) -> Lazy[AgentServices]:
    """The services of ``handler``'s agent, built from the environment on first use; ``remote`` is a Python agent's
    app (None: the HTTP client of ``REMOTE_BASE_URL``), whose actions are checked against ``AGENT_ACTIONS``."""
    count = metric_counter(handler)

    def build() -> AgentServices:
        built = build_agent(metrics=count, remote=remote)
        check = getattr(remote, "check", None)
        if check is not None:
            check(built.config.actions)  # every action agents.yaml allows has its function
        return built

    return Lazy(build)


def metric_counter(handler: Any) -> Callable[..., None]:
    """The count function an agent's services report to (``build_agent(metrics=...)``): a Count metric of
    ``handler``'s Metrics, flushed as one EMF line when the invocation ends."""
    metrics = handler.metrics
    lock = threading.Lock()  # a batch's records count from their own threads (sasflow.batch.AtOnce)

    def count(name: str, value: int = 1) -> None:
        with lock:
            metrics.add_metric(name=name, unit=MetricUnit.Count, value=value)

    return count


def service_order(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A batch's step requests in the order its service is called for them (its records start in this order, and
    so wait for the agent's call limits in it): higher priority first, then round-robin between tenants (the
    requests' ``priority`` and ``tenant``; a body that is not JSON counts as the default, and fails later)."""
    return fair_order(records, _priority_and_group)


def _priority_and_group(record: dict[str, Any]) -> tuple[int, str]:
    try:
        body = json.loads(record.get("body") or "{}")
    except ValueError:
        return DEFAULT_PRIORITY, ""
    if not isinstance(body, dict):
        return DEFAULT_PRIORITY, ""
    priority, group = body.get("priority"), body.get("tenant")
    return (
        priority if isinstance(priority, int) and not isinstance(priority, bool) else DEFAULT_PRIORITY,
        group if isinstance(group, str) else "",
    )
