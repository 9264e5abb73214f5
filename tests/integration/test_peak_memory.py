"""The worst requests the API and the queues accept stay within each function's MemorySize.

A function's peak memory is its interpreter with its imports (measured in a fresh process that imports only that
handler, as a cold Lambda does) plus what the invocation allocates at its peak (``tracemalloc``, around the real
handler on moto). The worst cases: a start body at the API's limit whose expressions each name the whole input many
times (the 360 KB request that once built a 120 MB string), 50 parallel first steps whose inputs are just under
the step limit, a scheduler batch of ten replies at the SQS limit, and an agent batch of ten requests at the limit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from typing import Any

import boto3

from devstack.inprocess import function_environment
from sasflow.limits import MAX_EXPRESSION_CHARS, MAX_REQUEST_BYTES, MAX_STEP_INPUT_BYTES
from sasflow.messages import SQS_MAX_MESSAGE_BYTES
from tests.integration.conftest import Deployed
from tests.support.lambdas import ROOT, sqs_event


def baseline_mib(deployed: Deployed, logical_id: str) -> float:
    """Peak RSS (MiB) of a fresh interpreter that imports the function's handler with the layer, as on Lambda."""
    spec = deployed.fn(logical_id).spec
    module = spec.handler.rsplit(".", 1)[0]
    # VmHWM, not ru_maxrss: the latter keeps the high-water mark of the forked copy of this (large) test process.
    code = (
        "import sys; "
        f"sys.path[:0] = [{str(spec.code_dir)!r}, {str(ROOT / 'layers' / 'sasflow')!r}]; "
        f"import {module}; "
        "print(next(line.split()[1] for line in open('/proc/self/status') if line.startswith('VmHWM:')))"
    )
    env = {**function_environment(spec), "PATH": "/usr/bin:/bin"}
    output = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return float(output.stdout.strip()) / 1024  # kB


def peak_mib(call: Callable[[], Any]) -> tuple[float, Any]:
    tracemalloc.start()
    try:
        result = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2**20, result


#: How often one expression of the longest length can name ``input.blob``.
COPIES = (MAX_EXPRESSION_CHARS - 2) // len("input.blob, ")


def multiplying_definition(width: int) -> dict[str, Any]:
    """``width`` parallel steps, each input one expression naming ``input.blob`` as often as fits in one expression."""
    names = ", ".join(["input.blob"] * COPIES)
    steps = [
        {
            "name": f"s{i}",
            "agent": "flights",
            "action": "reserve",
            "input": {"copies.$": f"[{names}]"},
            "depends_on": [],
        }
        for i in range(width)
    ]
    return {"name": "memory", "version": 1, "steps": steps}


def test_the_worst_start_the_api_accepts_or_refuses_stays_within_memory(deployed: Deployed) -> None:
    api = deployed.fn("ApiFunction")
    base = baseline_mib(deployed, "ApiFunction")
    # A body at the limit whose 50 steps each name a 330 KB input 42 times (14 MB once rendered): refused
    blob = "x" * (MAX_REQUEST_BYTES - 60_000)
    refused_body = {"definition": multiplying_definition(50), "input": {"blob": blob}}
    assert len(json.dumps(refused_body)) <= MAX_REQUEST_BYTES
    refused_peak, (status, error) = peak_mib(lambda: deployed.api("POST", "/workflows", refused_body))
    assert (status, error["error"]) == (413, "PAYLOAD_TOO_LARGE")
    # 50 parallel first steps each just under the step limit: accepted, 50 messages of about 248 KB sent
    small = "y" * (MAX_STEP_INPUT_BYTES // COPIES - 200)
    accepted_body = {"definition": multiplying_definition(50), "input": {"blob": small}}
    accepted_peak, (status, view) = peak_mib(lambda: deployed.api("POST", "/workflows", accepted_body))
    assert status == 201 and len(view["steps"]) == 50
    for peak in (refused_peak, accepted_peak):
        assert base + peak < api.spec.memory_mb, (base, refused_peak, accepted_peak)


def test_the_worst_batches_of_the_scheduler_and_an_agent_stay_within_memory(deployed: Deployed) -> None:
    # Given ten started trips, and a batch of ten replies, each with an output at the limit of one SQS message
    trip = json.loads((ROOT / "events" / "trip_booking_request.json").read_text())
    trip["definition"]["steps"][1]["input"] = {"flight.$": "steps.reserve_flight.output"}  # the hotel gets it all
    workflows = [deployed.api("POST", "/workflows", trip)[1]["workflow_id"] for _ in range(10)]
    output = {"confirmation": "FL-1", "padding": "z" * (SQS_MAX_MESSAGE_BYTES - 12_288)}
    replies = [
        {
            "messageId": f"m-{i}",
            "ReceiptHandle": f"r-{i}",
            "Body": json.dumps(
                {
                    "kind": "step.reply",
                    "workflow_id": workflow_id,
                    "step": "reserve_flight",
                    "phase": "action",
                    "attempt": 1,
                    "outcome": "succeeded",
                    "output": output,
                    "calls": 1,
                }
            ),
        }
        for i, workflow_id in enumerate(workflows)
    ]
    scheduler = deployed.fn("SchedulerFunction")
    queue_arn = deployed.stack.get_att("ResponseQueue", "Arn")
    records = [{**r, "MessageId": r["messageId"]} for r in replies]
    scheduler_peak, result = peak_mib(lambda: scheduler.invoke(sqs_event(records, queue_arn)))
    assert result == {"batchItemFailures": []}
    assert scheduler_peak + baseline_mib(deployed, "SchedulerFunction") < scheduler.spec.memory_mb
    # And a batch of ten hotel requests, each with an input at the limit of one SQS message, for the hotels agent
    sqs = boto3.client("sqs")
    hotels_queue = deployed.queue_url("HotelsRequestQueue")
    messages = sqs.receive_message(QueueUrl=hotels_queue, MaxNumberOfMessages=10)["Messages"]
    assert len(messages) == 10
    # the hotel input holds the output: above the claim-check threshold, so each message holds its reference and
    # the agent reads each 250 KB input from the payload bucket before it calls the service
    assert all(len(m["Body"]) < 2_000 and '"$claim_check"' in m["Body"] for m in messages)
    agent = deployed.fn("HotelsAgentFunction")
    agent_arn = deployed.stack.get_att("HotelsRequestQueue", "Arn")
    agent_peak, answer = peak_mib(lambda: agent.invoke(sqs_event(messages, agent_arn)))
    assert answer == {"batchItemFailures": []}
    assert agent_peak + baseline_mib(deployed, "HotelsAgentFunction") < agent.spec.memory_mb
