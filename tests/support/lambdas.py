"""Run the real handlers in-process the way Lambda would, against resources built from template.yaml.

Each ``FunctionUnderTest`` loads its handler module as a fresh module (one sandbox per function, so the three
agents that share ``agent_handler.py`` keep separate cold-start state), applies the function's environment from
the template while it runs, and injects a test clock into the cold-start wiring. ``SqsDriver`` plays the event
source mapping: receive from moto, build the Lambda SQS event, invoke, delete what succeeded.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import boto3

from devstack.template import FunctionSpec, SqsEventSpec
from sasflow.bootstrap import Lazy, build_agent, build_engine
from sasflow.clock import Clock

ROOT = Path(__file__).resolve().parents[2]
EVENTS = ROOT / "events"
_counter = itertools.count()


def load_event(name: str) -> dict[str, Any]:
    """Read a sample event from ``events/``."""
    return json.loads((EVENTS / name).read_text())  # type: ignore[no-any-return]


class FakeContext:
    """A Lambda context whose remaining time is fixed (milliseconds) unless a test changes it."""

    def __init__(self, function_name: str, timeout_seconds: int, memory_mb: int = 256) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"
        self.memory_limit_in_mb = memory_mb
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "2026/11/29/[$LATEST]test"
        self.remaining_ms = timeout_seconds * 1000

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


@contextmanager
def environment(variables: Mapping[str, str]) -> Iterator[None]:
    """Apply ``variables`` to os.environ for the duration, then restore it exactly."""
    saved = dict(os.environ)
    os.environ.update(variables)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclass
class FunctionUnderTest:
    """One function of the template, loaded as its own sandbox."""

    spec: FunctionSpec
    module: ModuleType
    clock: Clock

    @classmethod
    def load(cls, spec: FunctionSpec, clock: Clock) -> FunctionUnderTest:
        module_name, _ = spec.handler.rsplit(".", 1)
        path = spec.code_dir / f"{module_name}.py"
        unique = f"{module_name}__{spec.logical_id}__{next(_counter)}"
        env = {**spec.environment, "AWS_LAMBDA_FUNCTION_NAME": spec.logical_id, "POWERTOOLS_METRICS_DISABLED": "true"}
        with environment(env):
            loader_spec = importlib.util.spec_from_file_location(unique, path)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[unique] = module
            loader_spec.loader.exec_module(module)
        # Inject the test clock into the cold-start wiring (the handler code itself is unchanged).
        if hasattr(module, "engine"):
            module.engine = Lazy(lambda: build_engine(clock=clock))
        if hasattr(module, "agent"):
            module.agent = Lazy(lambda: build_agent(clock=clock))
        return cls(spec, module, clock)

    @property
    def env(self) -> dict[str, str]:
        return {
            **self.spec.environment,
            "AWS_LAMBDA_FUNCTION_NAME": self.spec.logical_id,
            "POWERTOOLS_METRICS_DISABLED": "true",
        }

    def invoke(self, event: Any, *, remaining_ms: int | None = None, context: Any = None) -> Any:
        """Call the handler with the function's environment applied, like one Lambda invocation."""
        if context is None:
            context = FakeContext(self.spec.logical_id, self.spec.timeout_seconds, self.spec.memory_mb)
        if remaining_ms is not None:
            context.remaining_ms = remaining_ms
        with environment(self.env):
            return self.module.handler(event, context)


def sqs_event(messages: list[dict[str, Any]], queue_arn: str) -> dict[str, Any]:
    """Build the Lambda SQS event for messages returned by ReceiveMessage."""
    return {
        "Records": [
            {
                "messageId": m["MessageId"],
                "receiptHandle": m["ReceiptHandle"],
                "body": m["Body"],
                "attributes": m.get("Attributes", {}),
                "messageAttributes": {},
                "md5OfBody": m.get("MD5OfBody", ""),
                "eventSource": "aws:sqs",
                "eventSourceARN": queue_arn,
                "awsRegion": "us-east-1",
            }
            for m in messages
        ]
    }


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
