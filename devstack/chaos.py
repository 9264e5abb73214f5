"""Fault injection inside an emulated Lambda worker: the agent crashes after its side effect, before its reply.

The local stack calls ``install()`` in each worker before the handler is imported (``DEVSTACK_WORKER_INIT``). It
reads ``DEVSTACK_CHAOS`` (JSON), e.g. ``{"lose_reply_rate": 0.05, "crash_first_reply": true, "seed": 7}``:

* ``lose_reply_rate``: the probability that a send to the response queue crashes;
* ``crash_first_reply``: the worker's first reply always crashes;
* ``lose_first_attempt_replies_of_steps_marked``: a string; every reply of attempt 1 of the forward action of a
  step whose name contains it crashes, whichever worker sends it and whenever. A test scripts the fault per
  workflow by naming steps (``reserve_flight_lose_reply``): the step completes on exactly attempt 2, after one
  supervisor resend, and the steps and workflows without the mark are untouched.

A crash raises ``SimulatedCrash``, which escapes the handler like a crashed invocation: SQS keeps the request, its
reply never arrives, and the supervisor must resend the step after complete-by + grace. The remote effect has
already happened, so the resend must be answered from the agent's idempotency record, not by a second effect. A
crashed batch loses the replies of every record in it, marked or not.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from typing import Any

import boto3

#: The key of ``DEVSTACK_CHAOS`` that scripts lost replies per step (see the module docstring).
MARKED_STEPS_KEY = "lose_first_attempt_replies_of_steps_marked"


class SimulatedCrash(RuntimeError):
    """The worker 'died' between the remote call and the reply (not a botocore error, so nothing catches it)."""


def _bodies(params: dict[str, Any]) -> list[str]:
    """The message bodies of a SendMessage or SendMessageBatch request."""
    if "Entries" in params:
        return [str(entry.get("MessageBody", "")) for entry in params["Entries"]]
    return [str(params.get("MessageBody", ""))]


def is_marked_first_reply(body: str, marker: str) -> bool:
    """Whether ``body`` is a reply of attempt 1 of the forward action of a step whose name contains ``marker``."""
    try:
        reply = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(reply, dict)
        and reply.get("kind") == "step.reply"
        and reply.get("phase") == "action"
        and reply.get("attempt") == 1
        and marker in str(reply.get("step", ""))
    )


def crash_rule(spec: dict[str, Any], function_name: str) -> Callable[[dict[str, Any]], bool] | None:
    """The decision ``params -> crash?`` for sends to the response queue, or None when ``spec`` injects nothing.

    Parameters
    ----------
    spec
        The parsed ``DEVSTACK_CHAOS`` object.
    function_name
        The worker's function name: it seeds the random draws, so each function replays its own faults.
    """
    rate = float(spec.get("lose_reply_rate", 0.0))
    first = bool(spec.get("crash_first_reply", False))
    marker = str(spec.get(MARKED_STEPS_KEY) or "")
    if rate <= 0 and not first and not marker:
        return None
    rng = random.Random(f"{spec.get('seed', 0)}:{function_name}")
    pending_first = [first]

    def crashes(params: dict[str, Any]) -> bool:
        if marker and any(is_marked_first_reply(body, marker) for body in _bodies(params)):
            return True
        if pending_first[0] or (rate > 0 and rng.random() < rate):
            pending_first[0] = False
            return True
        return False

    return crashes


def install() -> None:
    """Register the crash on SendMessage/SendMessageBatch to RESPONSE_QUEUE_URL for agent workers."""
    spec: dict[str, Any] = json.loads(os.environ.get("DEVSTACK_CHAOS") or "{}")
    if not os.environ.get("AGENT_NAME"):
        return
    rule = crash_rule(spec, os.environ.get("AWS_LAMBDA_FUNCTION_NAME", ""))
    if rule is None:
        return
    response_queue = os.environ.get("RESPONSE_QUEUE_URL", "")

    def before_send(params: dict[str, Any], **_: Any) -> None:
        if params.get("QueueUrl") == response_queue and rule(params):
            raise SimulatedCrash("agent crashed after its side effect, before sending its reply")

    boto3.setup_default_session()
    session = boto3.DEFAULT_SESSION
    assert session is not None
    session.events.register("before-parameter-build.sqs.SendMessageBatch", before_send)
    session.events.register("before-parameter-build.sqs.SendMessage", before_send)
