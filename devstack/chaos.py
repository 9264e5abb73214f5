"""Fault injection inside an emulated Lambda worker: the agent crashes after its side effect, before its reply.

The local stack calls ``install()`` in each worker before the handler is imported (``DEVSTACK_WORKER_INIT``). It
reads ``DEVSTACK_CHAOS`` (JSON): ``{"lose_reply_rate": 0.05, "crash_first_reply": true, "seed": 7}``. With that
probability (and always on a worker's first reply when ``crash_first_reply`` is set) a send to the response queue
raises ``SimulatedCrash``, which escapes the handler like a crashed invocation: SQS keeps the request,
its reply never arrives, and the supervisor must resend the step after complete-by + grace. The remote effect has
already happened, so the resend must be answered from the agent's idempotency record, not by a second effect.
"""

from __future__ import annotations

import json
import os
import random
from typing import Any

import boto3


class SimulatedCrash(RuntimeError):
    """The worker 'died' between the remote call and the reply (not a botocore error, so nothing catches it)."""


def install() -> None:
    """Register the crash on SendMessage/SendMessageBatch to RESPONSE_QUEUE_URL for agent workers."""
    spec: dict[str, Any] = json.loads(os.environ.get("DEVSTACK_CHAOS") or "{}")
    rate = float(spec.get("lose_reply_rate", 0.0))
    first = bool(spec.get("crash_first_reply", False))
    if (rate <= 0 and not first) or not os.environ.get("AGENT_NAME"):
        return
    response_queue = os.environ.get("RESPONSE_QUEUE_URL", "")
    rng = random.Random(f"{spec.get('seed', 0)}:{os.environ.get('AWS_LAMBDA_FUNCTION_NAME', '')}")

    pending_first = [first]

    def before_send(params: dict[str, Any], **_: Any) -> None:
        if params.get("QueueUrl") != response_queue:
            return
        if pending_first[0] or rng.random() < rate:
            pending_first[0] = False
            raise SimulatedCrash("agent crashed after its side effect, before sending its reply")

    boto3.setup_default_session()
    session = boto3.DEFAULT_SESSION
    assert session is not None
    session.events.register("before-parameter-build.sqs.SendMessageBatch", before_send)
    session.events.register("before-parameter-build.sqs.SendMessage", before_send)
