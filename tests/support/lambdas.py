"""Run the real handlers in-process the way Lambda would, against resources built from template.yaml.

Each ``FunctionUnderTest`` loads its handler module as a fresh module (one sandbox per function, so the three
agents that share ``agent_handler.py`` keep separate cold-start state), applies the function's environment from
the template while it runs, and injects a test clock into the cold-start wiring. Given its ``principal`` (its role as
template.yaml deploys it, `devstack.iam.roles`), every AWS call it makes is checked against that role
(`devstack.iam.guard`): a call the role does not allow raises AccessDenied inside the handler, as on AWS.
``SqsDriver`` plays the event source mapping: receive from moto, build the Lambda SQS event, invoke, delete what
succeeded.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3

from devstack.event_sources import build_sqs_record
from devstack.iam.guard import acting_as
from devstack.iam.guard import install as install_iam_check
from devstack.iam.roles import Principal
from devstack.inprocess import FakeLambdaContext, environment, function_environment, load_function_module
from devstack.template import FunctionSpec, SqsEventSpec
from sasflow.bootstrap import Lazy, build_agent, build_batches, build_engine, build_ops, build_trigger
from sasflow.clock import Clock
from sasflow.python_agent import AgentApp

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"


def load_event(name: str) -> dict[str, Any]:
    """Read a sample event from ``events/``."""
    return json.loads((EVENTS / name).read_text())  # type: ignore[no-any-return]


class FakeContext(FakeLambdaContext):
    """A Lambda context whose remaining time is fixed (milliseconds) unless a test changes it."""


#: Held by each in-process invocation (re-entrant: a handler may invoke another's code in its thread).
_INVOKING = threading.RLock()


@dataclass
class FunctionUnderTest:
    """One function of the template, loaded as its own sandbox."""

    spec: FunctionSpec
    module: ModuleType
    clock: Clock
    principal: Principal | None = None

    @classmethod
    def load(cls, spec: FunctionSpec, clock: Clock, principal: Principal | None = None) -> FunctionUnderTest:
        """Load the function; with ``principal``, its AWS calls are checked against that role."""
        if principal is not None:
            install_iam_check()
        module = load_function_module(spec)
        # Inject the test clock into the cold-start wiring (the handler code itself is unchanged).
        # As the handlers wire it: the scheduler names each workflow it works on as the log's correlation id.
        correlate = module.logger.set_correlation_id if hasattr(module, "logger") else None
        if hasattr(module, "engine"):
            module.engine = Lazy(lambda: build_engine(clock=clock, correlate=correlate))
        if hasattr(module, "ops"):
            module.ops = Lazy(lambda: build_ops(clock=clock, correlate=correlate))
        if hasattr(module, "agent"):
            module.agent = Lazy(lambda: build_agent(clock=clock))
        if hasattr(module, "service"):  # a trigger's
            module.service = Lazy(lambda: build_trigger(clock=clock, correlate=correlate))
        if hasattr(module, "batches") and not hasattr(module, "ops"):  # the batch function's (the ops one's: ops')
            module.batches = Lazy(lambda: build_batches(clock=clock, correlate=correlate))
        app = getattr(module, "app", None)
        if isinstance(app, AgentApp):  # a Python agent: its own functions are the remote
            app.services = Lazy(lambda: build_agent(clock=clock, remote=app))
        return cls(spec, module, clock, principal)

    def invoke(self, event: Any, *, remaining_ms: int | None = None, context: Any = None) -> Any:
        """Call the handler with the function's environment applied, like one Lambda invocation."""
        if context is None:
            context = FakeContext(self.spec.logical_id, self.spec.timeout_seconds, self.spec.memory_mb)
        if remaining_ms is not None:
            context.remaining_ms = remaining_ms
        # One invocation at a time, as a Lambda instance runs them: the environment is the process's, and a handler's
        # resolver keeps the request in flight (found when two console clicks at once made the ops handler fail).
        with _INVOKING, environment(function_environment(self.spec)), acting_as(self.principal):
            return self.module.handler(event, context)


def sqs_event(messages: list[dict[str, Any]], queue_arn: str) -> dict[str, Any]:
    """Build the Lambda SQS event for messages returned by ReceiveMessage, as the local stack's event sources do
    (message attributes in Lambda's shape: the ``sasflow-cost`` a message carries reaches its consumer)."""
    return {"Records": [build_sqs_record(m, queue_arn=queue_arn, region="us-east-1") for m in messages]}


class SqsDriver:
    """Plays Lambda's SQS event source mapping for one queue → function, on demand."""

    def __init__(self, function: FunctionUnderTest, event: SqsEventSpec) -> None:
        self.function = function
        self.event = event
        self.sqs = boto3.client("sqs")

    def receive(self) -> list[dict[str, Any]]:
        response = self.sqs.receive_message(
            QueueUrl=self.event.queue_url,
            MaxNumberOfMessages=min(self.event.batch_size, 10),
            AttributeNames=["All"],
            MessageAttributeNames=["All"],  # as Lambda's event source mapping receives
            WaitTimeSeconds=0,
        )
        return list(response.get("Messages", []))

    def deliver(self, messages: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
        """Invoke the function with one batch and delete the records that did not fail; None if the queue is empty."""
        messages = self.receive() if messages is None else messages
        if not messages:
            return None
        result = self.function.invoke(sqs_event(messages, self.event.queue_arn))
        failed = {f["itemIdentifier"] for f in result.get("batchItemFailures", [])}
        done = [m for m in messages if m["MessageId"] not in failed]
        if done:
            self.sqs.delete_message_batch(
                QueueUrl=self.event.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(done)],
            )
        return dict(result)
