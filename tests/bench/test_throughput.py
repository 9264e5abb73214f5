"""bench.throughput: a very small throughput run on the local stack, and the call recorder on its own."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from moto import mock_aws

from bench.throughput import CallRecorder, measure_throughput, read_calls, record_calls, uncounted


def test_a_small_run_counts_the_products_calls_and_replays_them_for_the_ceiling(tmp_path: Path) -> None:
    # Given the local stack, warm, and 3 trip bookings of 3 steps each, without faults
    # When the throughput is measured
    began = time.monotonic()
    rows, raw = measure_throughput(3, warmup_workflows=0, log_dir=tmp_path / "logs")
    wall = time.monotonic() - began

    # Then every step completed, and the writes were counted where they are made, as a hand count says for 9 steps:
    # | function   | write                                                          | n        |
    # | each agent | PutItem idempotency claim + UpdateItem result, per step        | 3 + 3    |
    # | scheduler  | PutItem of the workflow item, per reply                        | 9        |
    # | API        | PutItem per start + the definition once per API sandbox that   | 3 + 1..2 |
    # |            | had not seen it stored (2 sandboxes may both look before either writes) |          |
    assert raw["steps"] == 9
    by_function = raw["calls_by_function"]

    def calls_of(function: str) -> int:
        return int(by_function[function]["dynamodb:UpdateItem"])

    for agent in ("FlightsAgentFunction", "HotelsAgentFunction", "PaymentsAgentFunction"):
        assert by_function[agent]["dynamodb:PutItem"] == 3, agent
    assert (by_function["FlightsAgentFunction"]["dynamodb:UpdateItem"], calls_of("PaymentsAgentFunction")) == (3, 3)
    # the hotels agent's call limits: one lease write per instance (worker process) that called, none deferred
    assert 3 + 1 <= by_function["HotelsAgentFunction"]["dynamodb:UpdateItem"] <= 3 + 3
    assert by_function["SchedulerFunction"]["dynamodb:PutItem"] == 9
    api_puts = by_function["ApiFunction"]["dynamodb:PutItem"]
    assert api_puts in (3 + 1, 3 + 2)
    calls = raw["calls"]
    limits = by_function["HotelsAgentFunction"]["dynamodb:UpdateItem"] - 3
    assert (calls["dynamodb:PutItem"], calls["dynamodb:UpdateItem"]) == (api_puts + 9 + 9, 9 + limits)
    assert "dynamodb:TransactWriteItems" not in calls
    # and the reads: one eventually consistent GetItem per reply (a chain has one reply in flight per workflow),
    # plus the definition once per scheduler sandbox; one request message sent per start
    assert by_function["SchedulerFunction"]["dynamodb:GetItem"] in (9 + 1, 9 + 2)
    assert by_function["ApiFunction"]["sqs:SendMessageBatch"] == 3
    total = sum(sum(counts.values()) for counts in by_function.values())
    assert raw["calls_total"] == total
    # and the replay made the same calls without errors and the same messages went through the queues
    replay = raw["replay"]
    assert replay["calls"] + replay["skipped"] == total
    # (a conditional write that lost in the run, such as two API sandboxes storing one new definition, loses again;
    # the hotels agent's lease writes, which two instances may make at the same moment, may replay in the other
    # order, and the later one in the run then loses: a write's cost either way)
    lease = "dynamodb:UpdateItem:ConditionalCheckFailedException"

    def without_leases(errors: dict[str, int]) -> dict[str, int]:
        return {key: n for key, n in errors.items() if key != lease}

    assert replay["errors"].get(lease, 0) <= limits
    assert without_leases(replay["errors"]) == without_leases(raw["product_errors"])
    assert without_leases(replay["errors"]) == (
        {} if api_puts == 4 else {"dynamodb:PutItem:ConditionalCheckFailedException": 1}
    )
    assert replay["received"] == 9 + 9  # 9 step requests, 9 replies
    # and the rows carry the 9 steps over the times measured (both within this test's own wall time), the ratio
    # of the two rates being the replay's time over the run's
    assert 0 < raw["ceiling_seconds"] < wall and 0 < raw["elapsed_seconds"] < wall
    speed, requests, to_next, to_agent = rows
    assert speed.ours == pytest.approx(9 / raw["elapsed_seconds"])
    assert speed.anchor == pytest.approx(9 / raw["ceiling_seconds"])
    assert speed.ratio == pytest.approx(raw["ceiling_seconds"] / raw["elapsed_seconds"])
    assert speed.target == ">= 0.5"  # the verdict on each side of it: tests/bench/test_report.py
    assert requests.ours == pytest.approx(total / 9)
    assert (requests.ratio, requests.met) == (None, None)
    # and the per-step overhead was measured on every hop: 6 replies followed by a next request (the last step's
    # reply of each workflow ends it), 9 requests each started an agent invocation
    latency = raw["latency"]
    assert (latency["reply_to_next_request"]["samples"], latency["request_to_agent_start"]["samples"]) == (6, 9)
    assert 0 < latency["request_to_agent_start"]["p50"] <= latency["request_to_agent_start"]["p95"] < wall
    assert "reply received -> next request sent" in to_next.metric and "agent start" in to_agent.metric
    # the windows are the template's defaults (Profile=latency: 0 s on the scheduler's mapping and every agent's)
    assert raw["batching_windows"]["SchedulerFunction"] == 0
    assert raw["batching_windows"]["FlightsAgentFunction"] == 0


def test_the_recorder_writes_one_line_per_call_and_skips_clients_made_uncounted(tmp_path: Path) -> None:
    import boto3

    # Given a queue in moto, a client that is recorded and one made under uncounted()
    with mock_aws(), record_calls(tmp_path):
        counted = boto3.client("sqs", region_name="us-east-1")
        with uncounted():
            ignored = boto3.client("sqs", region_name="us-east-1")
        url = ignored.create_queue(QueueName="bench-recorder")["QueueUrl"]

        # When each sends a batch and the recorded one receives twice (the second time the queue is empty)
        counted.send_message_batch(
            QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "a"}, {"Id": "2", "MessageBody": "b"}]
        )
        ignored.send_message_batch(QueueUrl=url, Entries=[{"Id": "1", "MessageBody": "c"}])
        counted.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
        counted.receive_message(QueueUrl=url, MaxNumberOfMessages=10)

    # Then only the recorded client's calls are in the file, with their parameters, in the order they ended
    calls = read_calls(tmp_path)
    assert [call.key for call in calls] == ["sqs:SendMessageBatch", "sqs:ReceiveMessage", "sqs:ReceiveMessage"]
    assert calls[0].params["Entries"][1]["MessageBody"] == "b"
    assert [call.received for call in calls[1:]] == [3, 0]
    assert [call.idle for call in calls] == [False, False, True]
    assert all(call.error is None and call.seconds >= 0 for call in calls)


def test_a_line_cut_short_by_a_killed_worker_is_skipped(tmp_path: Path) -> None:
    # Given a call file whose last line was cut short
    recorder = CallRecorder(tmp_path)
    recorder.close()
    line = {
        "started": 1.0,
        "seconds": 0.5,
        "service": "dynamodb",
        "operation": "GetItem",
        "error": None,
        "received": None,
        "retries": 0,
        "cpu": 0.1,
        "params": {"TableName": "t", "Data": {"__bytes__": "AAE="}},
    }
    recorder.path.write_text(json.dumps(line) + "\n" + json.dumps(line)[:40])

    # When it is read
    calls = read_calls(tmp_path)

    # Then the whole line is read (bytes restored) and the cut one skipped
    assert len(calls) == 1
    assert calls[0].params["Data"] == b"\x00\x01"
    assert calls[0].ended == 1.5
